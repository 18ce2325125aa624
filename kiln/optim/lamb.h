#pragma once
// LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning"; defaults as NVIDIA apex
// FusedLAMB). Per parameter tensor:
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   r = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + weight_decay * p   (no bias correction
//       when bias_correction(false))
//   p -= lr * trust * r,  trust = ||p|| / ||r|| when both are non-zero, else 1
// Global gradient-norm clipping (apex's max_grad_norm) is left to kiln::optim::clip_grad_norm.
#include "kiln/optim/adam.h"

namespace kiln::optim {

// lr, betas (0.9, 0.999), eps, weight_decay and maximize (false) as detail::AdamLikeOptions, and:
class LAMBOptions : public detail::AdamLikeOptions<LAMBOptions> {
 public:
  static constexpr const char* kName = "LAMB";
  LAMBOptions(double lr = 1e-3)  // NOLINT: implicit, like libtorch
      : AdamLikeOptions(lr, /*eps=*/1e-6, /*weight_decay=*/1e-2) {}
  KILN_ARG(bool, bias_correction) = true;

 public:
  template <class Visit> static void for_each_option(LAMBOptions& self, Visit&& visit) {
    AdamLikeOptions::for_each_option(self, visit);
    visit("bias_correction", self.bias_correction_);
  }
};

// LAMB's update rule (Alg. 2, with Adam-style bias correction as apex's FusedLAMB). Two passes
// over each tensor, in the opmath type T:
//   norm pass:   g = grad / grad_scale (negated when maximizing)
//                m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//                r = (m / bc1) / (sqrt(v) / sqrt(bc2) + eps) + weight_decay * p
//                (bc = 1 - beta^t, or 1 without bias correction), summing r^2 and p^2
//   trust ratio: ||p|| / ||r|| when both are non-zero, else 1
//   update pass: p -= lr * trust * r, recomputing r from the stored m, v and the unchanged p (no
//                temporary buffer, and the gradient is not read again)
struct LAMBRule {
  static constexpr const char* kStepName = "lamb_step";
  static constexpr int kMaxBuffers = 2;  // exp_avg, exp_avg_sq
  static constexpr bool kPerTensorNorms = true;
  static constexpr int kNormPassBuffers = 2;  // the norm pass updates the moments
  static constexpr bool kUpdateReadsGrad = false;

  double beta1, beta2, eps, weight_decay;
  bool bias_correction, maximize;

  explicit LAMBRule(const LAMBOptions& o)
      : beta1(std::get<0>(o.betas())),
        beta2(std::get<1>(o.betas())),
        eps(o.eps()),
        weight_decay(o.weight_decay()),
        bias_correction(o.bias_correction()),
        maximize(o.maximize()) {}

  KILN_INLINE int num_buffers() const { return 2; }

  // The per-tensor constants of both passes.
  template <class T> struct Direction {
    T beta1, one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay;
    T inv_bc1, inv_bc2_sqrt, grad_mul;
    KILN_INLINE T operator()(T p, T exp_avg, T exp_avg_sq) const {
      return (exp_avg * inv_bc1) / (math::sqrt(exp_avg_sq) * inv_bc2_sqrt + eps) + weight_decay * p;
    }
  };

  template <class T> struct Moments {
    Direction<T> r;
    KILN_INLINE kernels::NormTerms operator()(T p, T g, T& exp_avg, T& exp_avg_sq) const {
      g = g * r.grad_mul;
      exp_avg = r.beta1 * exp_avg + r.one_minus_beta1 * g;
      exp_avg_sq = r.beta2 * exp_avg_sq + r.one_minus_beta2 * g * g;
      const T d = r(p, exp_avg, exp_avg_sq);
      return {static_cast<double>(d) * static_cast<double>(d), static_cast<double>(p) * static_cast<double>(p)};
    }
  };

  template <class T> struct Update {
    Direction<T> r;
    T lr_trust;  // lr * trust ratio
    KILN_INLINE void operator()(T& p, T /*grad*/, T& exp_avg, T& exp_avg_sq) const {
      p = p - lr_trust * r(p, exp_avg, exp_avg_sq);
    }
  };

  template <class T> KILN_INLINE Direction<T> direction(const kernels::UpdateScalars& s) const {
    const double bc1 = bias_correction ? 1.0 - math::pow(beta1, s.step) : 1.0;
    const double bc2 = bias_correction ? 1.0 - math::pow(beta2, s.step) : 1.0;
    Direction<T> d;
    d.beta1 = T(beta1);
    d.one_minus_beta1 = T(1.0 - beta1);
    d.beta2 = T(beta2);
    d.one_minus_beta2 = T(1.0 - beta2);
    d.eps = T(eps);
    d.weight_decay = T(weight_decay);
    d.inv_bc1 = T(1.0 / bc1);
    d.inv_bc2_sqrt = T(1.0 / math::sqrt(bc2));
    d.grad_mul = T(maximize ? -s.inv_grad_scale : s.inv_grad_scale);
    return d;
  }

  template <class T> KILN_INLINE Moments<T> norm_terms(const kernels::UpdateScalars& s) const {
    return Moments<T>{direction<T>(s)};
  }

  // sums: (sum r^2, sum p^2) over the tensor.
  KILN_INLINE double trust_ratio(kernels::NormTerms sums, double /*inv_grad_scale*/) const {
    const double param_norm = math::sqrt(sums.b), update_norm = math::sqrt(sums.a);
    return (param_norm > 0.0 && update_norm > 0.0) ? param_norm / update_norm : 1.0;
  }

  template <class T> KILN_INLINE Update<T> update(const kernels::UpdateScalars& s) const {
    return Update<T>{direction<T>(s), T(s.lr * s.trust)};
  }
};

class LAMB : public FusedOptimizer<LAMBOptions, AdamParamState, LAMBRule> {
 public:
  using FusedOptimizer::FusedOptimizer;
};

}  // namespace kiln::optim
