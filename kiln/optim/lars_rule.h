#pragma once
// LARS's update rule (internal header: kiln/optim/lars.cpp runs it on the CPU, lars.cu on a GPU).
// You et al. 2017, "Large Batch Training of Convolutional Networks", with momentum as in
// torchlars / NVIDIA's LARS. Two passes over each tensor, in the opmath type T:
//   norm pass:   sums of p^2 and of the raw (still scaled) grad^2
//   trust ratio: trust_coefficient * ||p|| / (||g|| + weight_decay * ||p|| + eps), with ||g|| the
//                unscaled gradient's norm; 1 when either norm is 0
//   update pass: g = grad / grad_scale (negated when maximizing);  d = trust * (g + weight_decay * p),
//                then the momentum step of momentum_rule.h
#include "kiln/optim/momentum_rule.h"

namespace kiln::optim {

struct LARSRule : MomentumRule {
  static constexpr const char* kStepName = "lars_step";
  static constexpr bool kPerTensorNorms = true;
  static constexpr int kNormPassBuffers = 0;

  double trust_coefficient, eps;

  template <class T>
  struct SquaredNorms {
    KILN_INLINE kernels::NormTerms operator()(T p, T g, T& /*unused*/, T& /*unused*/) const {
      return {static_cast<double>(p) * static_cast<double>(p), static_cast<double>(g) * static_cast<double>(g)};
    }
  };

  template <class T>
  struct Update : MomentumStep<T> {
    T trust;
    KILN_INLINE void operator()(T& p, T g, T& momentum_buffer, T& /*unused*/) const {
      g = g * this->grad_mul;
      this->apply(p, trust * (g + this->weight_decay * p), momentum_buffer);
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
    set_momentum_step<T>(f, *this, s);
    f.trust = T(s.trust);
    return f;
  }
};

inline kernels::MultiTensorStep<LARSRule> lars_step{LARSRule::kStepName};

}  // namespace kiln::optim
