#pragma once
// AdamW's update rule (internal header: kiln/optim/adamw.cpp runs it on the CPU, adamw.cu on a
// GPU). torch.optim.AdamW, decoupled weight decay (Loshchilov & Hutter), step t counted from 1,
// per element in the opmath type T:
//   g = grad / grad_scale (negated when maximizing)
//   p *= 1 - lr * weight_decay
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
#include "kiln/core/macros.h"
#include "kiln/kernels/multi_tensor.h"

namespace kiln::optim {

struct AdamWRule {
  static constexpr const char* kStepName = "adamw_step";
  static constexpr int kMaxBuffers = 2;  // exp_avg, exp_avg_sq
  static constexpr bool kPerTensorNorms = false;
  static constexpr bool kUpdateReadsGrad = true;

  double beta1, beta2, eps, weight_decay;
  bool maximize;

  KILN_INLINE int num_buffers() const { return 2; }

  template <class T>
  struct Update {
    T beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
    T decay;         // 1 - lr * weight_decay
    T step_size;     // lr / (1 - b1^t)
    T inv_bc2_sqrt;  // 1 / sqrt(1 - b2^t)
    T grad_mul;      // ±1/grad_scale
    KILN_INLINE void operator()(T& p, T g, T& exp_avg, T& exp_avg_sq) const {
      g = g * grad_mul;
      p = p * decay;
      exp_avg = beta1 * exp_avg + one_minus_beta1 * g;
      exp_avg_sq = beta2 * exp_avg_sq + one_minus_beta2 * g * g;
      const T denom = math::sqrt(exp_avg_sq) * inv_bc2_sqrt + eps;
      p = p - step_size * (exp_avg / denom);
    }
  };

  template <class T>
  KILN_INLINE Update<T> update(const kernels::UpdateScalars& s) const {
    Update<T> f;
    f.beta1 = T(beta1);
    f.one_minus_beta1 = T(1.0 - beta1);
    f.beta2 = T(beta2);
    f.one_minus_beta2 = T(1.0 - beta2);
    f.eps = T(eps);
    f.decay = T(1.0 - s.lr * weight_decay);
    f.step_size = T(s.lr / (1.0 - math::pow(beta1, s.step)));
    f.inv_bc2_sqrt = T(1.0 / math::sqrt(1.0 - math::pow(beta2, s.step)));
    f.grad_mul = T(maximize ? -s.inv_grad_scale : s.inv_grad_scale);
    return f;
  }
};

inline kernels::MultiTensorStep<AdamWRule> adamw_step{AdamWRule::kStepName};

}  // namespace kiln::optim
