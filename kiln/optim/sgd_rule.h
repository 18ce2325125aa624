#pragma once
// SGD's update rule (internal header: kiln/optim/sgd.cpp runs it on the CPU, sgd.cu on a GPU).
// PyTorch's SGD, per element, in the opmath type T:
//   g = grad / grad_scale (negated when maximizing) + weight_decay * p
// then the momentum step of momentum_rule.h with d = g.
#include "kiln/optim/momentum_rule.h"

namespace kiln::optim {

struct SGDRule : MomentumRule {
  static constexpr const char* kStepName = "sgd_step";
  static constexpr bool kPerTensorNorms = false;

  template <class T>
  struct Update : MomentumStep<T> {
    KILN_INLINE void operator()(T& p, T g, T& momentum_buffer, T& /*unused*/) const {
      g = g * this->grad_mul;
      g = g + this->weight_decay * p;
      this->apply(p, g, momentum_buffer);
    }
  };

  template <class T>
  KILN_INLINE Update<T> update(const kernels::UpdateScalars& s) const {
    Update<T> f;
    set_momentum_step<T>(f, *this, s);
    return f;
  }
};

inline kernels::MultiTensorStep<SGDRule> sgd_step{SGDRule::kStepName};

}  // namespace kiln::optim
