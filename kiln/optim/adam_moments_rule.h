#pragma once
// What the update rules of Adam and AdamW share (internal header, included by adam_rule.h and
// adamw_rule.h): their options and buffers, and the bias-corrected moment step, per element in
// the opmath type T, on the gradient g after scaling and any L2 term, step t counted from 1:
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// The two rules differ only in where weight decay enters.
#include "kiln/core/macros.h"
#include "kiln/kernels/multi_tensor.h"

namespace kiln::optim {

struct AdamMomentsRule {
  static constexpr int kMaxBuffers = 2;  // exp_avg, exp_avg_sq
  static constexpr bool kPerTensorNorms = false;
  static constexpr bool kUpdateReadsGrad = true;

  double beta1, beta2, eps, weight_decay;
  bool maximize;

  KILN_INLINE int num_buffers() const { return 2; }

  template <class T>
  struct Moments {
    T beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
    T step_size;     // lr / (1 - b1^t)
    T inv_bc2_sqrt;  // 1 / sqrt(1 - b2^t)
    T grad_mul;      // ±1/grad_scale
    KILN_INLINE void step(T& p, T g, T& exp_avg, T& exp_avg_sq) const {
      exp_avg = beta1 * exp_avg + one_minus_beta1 * g;
      exp_avg_sq = beta2 * exp_avg_sq + one_minus_beta2 * g * g;
      const T denom = math::sqrt(exp_avg_sq) * inv_bc2_sqrt + eps;
      p = p - step_size * (exp_avg / denom);
    }
  };

  template <class T>
  KILN_INLINE void set_moments(Moments<T>& f, const kernels::UpdateScalars& s) const {
    f.beta1 = T(beta1);
    f.one_minus_beta1 = T(1.0 - beta1);
    f.beta2 = T(beta2);
    f.one_minus_beta2 = T(1.0 - beta2);
    f.eps = T(eps);
    f.step_size = T(s.lr / (1.0 - math::pow(beta1, s.step)));
    f.inv_bc2_sqrt = T(1.0 / math::sqrt(1.0 - math::pow(beta2, s.step)));
    f.grad_mul = T(maximize ? -s.inv_grad_scale : s.inv_grad_scale);
  }
};

}  // namespace kiln::optim
