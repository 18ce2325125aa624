#pragma once
// LARS's update rule (internal header: kiln/optim/lars.cpp runs it on the CPU, lars.cu on a GPU).
// You et al. 2017, "Large Batch Training of Convolutional Networks", with momentum as in
// torchlars / NVIDIA's LARS. Two passes over each tensor, in the opmath type T:
//   norm pass:   sums of p^2 and of the raw (still scaled) grad^2
//   trust ratio: trust_coefficient * ||p|| / (||g|| + weight_decay * ||p|| + eps), with ||g|| the
//                unscaled gradient's norm; 1 when either norm is 0
//   update pass: g = grad / grad_scale (negated when maximizing);  d = trust * (g + weight_decay * p)
//                buf = d on the buffer's first step, else momentum * buf + (1 - dampening) * d
//                d = nesterov ? d + momentum * buf : buf;  p -= lr * d
// Without momentum there is no buffer and d is applied directly.
#include "kiln/core/macros.h"
#include "kiln/kernels/multi_tensor.h"

namespace kiln::optim {

struct LARSRule {
  static constexpr const char* kStepName = "lars_step";
  static constexpr int kMaxBuffers = 1;  // momentum_buffer
  static constexpr bool kPerTensorNorms = true;
  static constexpr int kNormPassBuffers = 0;
  static constexpr bool kUpdateReadsGrad = true;

  double momentum, dampening, weight_decay, trust_coefficient, eps;
  bool nesterov, maximize;

  KILN_INLINE int num_buffers() const { return momentum != 0.0 ? 1 : 0; }

  template <class T>
  struct SquaredNorms {
    KILN_INLINE kernels::NormTerms operator()(T p, T g, T& /*unused*/, T& /*unused*/) const {
      return {static_cast<double>(p) * static_cast<double>(p), static_cast<double>(g) * static_cast<double>(g)};
    }
  };

  template <class T>
  struct Update {
    T lr, weight_decay, momentum, one_minus_dampening, grad_mul, trust;
    bool use_momentum, first, nesterov;
    KILN_INLINE void operator()(T& p, T g, T& momentum_buffer, T& /*unused*/) const {
      g = g * grad_mul;
      T d = trust * (g + weight_decay * p);
      if (use_momentum) {
        momentum_buffer = first ? d : momentum * momentum_buffer + one_minus_dampening * d;
        d = nesterov ? d + momentum * momentum_buffer : momentum_buffer;
      }
      p = p - lr * d;
    }
  };

  template <class T>
  KILN_INLINE SquaredNorms<T> norm_terms(const kernels::UpdateScalars& /*s*/) const {
    return {};
  }

  // sums: (sum p^2, sum grad^2) over the tensor, the gradient still scaled.
  KILN_INLINE double trust_ratio(kernels::NormTerms sums, double inv_grad_scale) const {
    const double param_norm = math::sqrt(sums.a);
    const double grad_norm = math::sqrt(sums.b) * math::fabs(inv_grad_scale);
    return (param_norm > 0.0 && grad_norm > 0.0)
               ? trust_coefficient * param_norm / (grad_norm + weight_decay * param_norm + eps)
               : 1.0;
  }

  template <class T>
  KILN_INLINE Update<T> update(const kernels::UpdateScalars& s) const {
    Update<T> f;
    f.lr = T(s.lr);
    f.weight_decay = T(weight_decay);
    f.momentum = T(momentum);
    f.one_minus_dampening = T(1.0 - dampening);
    f.grad_mul = T(maximize ? -s.inv_grad_scale : s.inv_grad_scale);
    f.trust = T(s.trust);
    f.use_momentum = momentum != 0.0;
    f.first = s.fresh_buffers;
    f.nesterov = nesterov;
    return f;
  }
};

inline kernels::MultiTensorStep<LARSRule> lars_step{LARSRule::kStepName};

}  // namespace kiln::optim
