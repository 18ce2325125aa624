#pragma once
// LARS (You et al. 2017, "Large Batch Training of Convolutional Networks"; momentum as in
// torchlars / NVIDIA's LARS). Per parameter tensor:
//   trust = trust_coefficient * ||p|| / (||g|| + weight_decay * ||p|| + eps)  (1 if a norm is 0)
//   d = trust * (g + weight_decay * p)
//   buf = d (first step) | momentum * buf + (1 - dampening) * d;  d = nesterov ? d + momentum * buf : buf
//   p -= lr * d
// Every tensor of a LARS optimizer is adapted (excluding biases / norm weights is not supported yet).
#include "kiln/optim/sgd.h"  // SGDLikeOptions, SGDParamState, MomentumRule

namespace kiln::optim {

// lr, momentum (0.9), dampening (0), weight_decay (0), nesterov and maximize (false) as
// detail::SGDLikeOptions, and:
class LARSOptions : public detail::SGDLikeOptions<LARSOptions> {
 public:
  static constexpr const char* kName = "LARS";
  LARSOptions(double lr = 1e-3) : SGDLikeOptions(lr, /*momentum=*/0.9) {}  // NOLINT: implicit, like libtorch
  KILN_ARG(double, trust_coefficient) = 1e-3;
  KILN_ARG(double, eps) = 1e-8;

 public:
  template <class Visit> static void for_each_option(LARSOptions& self, Visit&& visit) {
    detail::visit_sgd_like(visit, self.lr_, self.momentum_, self.dampening_, self.weight_decay_);
    visit("trust_coefficient", self.trust_coefficient_);
    visit("eps", self.eps_);
    visit("nesterov", self.nesterov_);
    visit("maximize", self.maximize_);
  }
  void validate() const override;
};

// LARS's update rule: two passes over each tensor, in the opmath type T:
//   norm pass:   sums of p^2 and of the raw (still scaled) grad^2
//   trust ratio: trust_coefficient * ||p|| / (||g|| + weight_decay * ||p|| + eps), with ||g|| the
//                unscaled gradient's norm; 1 when either norm is 0
//   update pass: g = grad / grad_scale (negated when maximizing);  d = trust * (g + weight_decay * p),
//                then the momentum step (MomentumRule, kiln/optim/sgd.h)
struct LARSRule : MomentumRule {
  static constexpr const char* kStepName = "lars_step";
  static constexpr bool kPerTensorNorms = true;
  static constexpr int kNormPassBuffers = 0;

  double trust_coefficient, eps;

  explicit LARSRule(const LARSOptions& o) : MomentumRule(o), trust_coefficient(o.trust_coefficient()), eps(o.eps()) {}

  template <class T> struct SquaredNorms {
    KILN_INLINE kernels::NormTerms operator()(T p, T g, T& /*unused*/, T& /*unused*/) const {
      return {static_cast<double>(p) * static_cast<double>(p), static_cast<double>(g) * static_cast<double>(g)};
    }
  };

  template <class T> struct Update : Step<T> {
    T trust;
    KILN_INLINE void operator()(T& p, T g, T& momentum_buffer, T& /*unused*/) const {
      g = g * this->grad_mul;
      this->apply(p, trust * (g + this->weight_decay * p), momentum_buffer);
    }
  };

  template <class T> KILN_INLINE SquaredNorms<T> norm_terms(const kernels::UpdateScalars& /*s*/) const { return {}; }

  // sums: (sum p^2, sum grad^2) over the tensor, the gradient still scaled.
  KILN_INLINE double trust_ratio(kernels::NormTerms sums, double inv_grad_scale) const {
    const double param_norm = math::sqrt(sums.a);
    const double grad_norm = math::sqrt(sums.b) * math::fabs(inv_grad_scale);
    return (param_norm > 0.0 && grad_norm > 0.0)
               ? trust_coefficient * param_norm / (grad_norm + weight_decay * param_norm + eps)
               : 1.0;
  }

  template <class T> KILN_INLINE Update<T> update(const kernels::UpdateScalars& s) const {
    Update<T> f;
    set_step<T>(f, s);
    f.trust = T(s.trust);
    return f;
  }
};

class LARS : public FusedOptimizer<LARSOptions, SGDParamState, LARSRule> {
 public:
  using FusedOptimizer::FusedOptimizer;
};

}  // namespace kiln::optim
