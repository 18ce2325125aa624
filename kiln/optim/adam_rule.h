#pragma once
// Adam's update rule (internal header: kiln/optim/adam.cpp runs it on the CPU, adam.cu on a GPU).
// torch.optim.Adam, weight decay as L2 added to the gradient, per element in the opmath type T:
//   g = grad / grad_scale (negated when maximizing) + weight_decay * p
// then the moment step of adam_moments_rule.h.
#include "kiln/optim/adam_moments_rule.h"

namespace kiln::optim {

struct AdamRule : AdamMomentsRule {
  static constexpr const char* kStepName = "adam_step";

  template <class T>
  struct Update : Moments<T> {
    T weight_decay;
    KILN_INLINE void operator()(T& p, T g, T& exp_avg, T& exp_avg_sq) const {
      g = g * this->grad_mul;
      g = g + weight_decay * p;
      this->step(p, g, exp_avg, exp_avg_sq);
    }
  };

  template <class T>
  KILN_INLINE Update<T> update(const kernels::UpdateScalars& s) const {
    Update<T> f;
    set_moments<T>(f, s);
    f.weight_decay = T(weight_decay);
    return f;
  }
};

inline kernels::MultiTensorStep<AdamRule> adam_step{AdamRule::kStepName};

}  // namespace kiln::optim
