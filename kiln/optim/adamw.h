#pragma once
// AdamW (decoupled weight decay, Loshchilov & Hutter), as torch.optim.AdamW:
//   p *= 1 - lr * weight_decay;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
//
//   kiln::optim::AdamW opt(params, kiln::optim::AdamWOptions(3e-4).betas({0.9, 0.95}).weight_decay(0.1));
#include "kiln/optim/adam.h"

namespace kiln::optim {

// lr, betas (0.9, 0.999), eps, weight_decay and maximize (false): see detail::AdamLikeOptions.
class AdamWOptions : public detail::AdamLikeOptions<AdamWOptions> {
 public:
  static constexpr const char* kName = "AdamW";
  AdamWOptions(double lr = 1e-3)  // NOLINT: implicit, like libtorch
      : AdamLikeOptions(lr, /*eps=*/1e-8, /*weight_decay=*/1e-2) {}
};

// AdamW's update rule, per element in the opmath type T:
//   g = grad / grad_scale (negated when maximizing);  p *= 1 - lr * weight_decay
// then the moment step of Adam (AdamMomentsRule, kiln/optim/adam.h).
struct AdamWRule : AdamMomentsRule {
  static constexpr const char* kStepName = "adamw_step";
  explicit AdamWRule(const AdamWOptions& o) : AdamMomentsRule(o) {}

  template <class T> struct Update : Moments<T> {
    T decay;  // 1 - lr * weight_decay
    KILN_INLINE void operator()(T& p, T g, T& exp_avg, T& exp_avg_sq) const {
      g = g * this->grad_mul;
      p = p * decay;
      this->step(p, g, exp_avg, exp_avg_sq);
    }
  };

  template <class T> KILN_INLINE Update<T> update(const kernels::UpdateScalars& s) const {
    Update<T> f;
    set_moments<T>(f, s);
    f.decay = T(1.0 - s.lr * weight_decay);
    return f;
  }
};

class AdamW : public FusedOptimizer<AdamWOptions, AdamParamState, AdamWRule> {
 public:
  using FusedOptimizer::FusedOptimizer;
};

}  // namespace kiln::optim
