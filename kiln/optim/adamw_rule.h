#pragma once
// AdamW's update rule (internal header: kiln/optim/adamw.cpp runs it on the CPU, adamw.cu on a
// GPU). torch.optim.AdamW, decoupled weight decay (Loshchilov & Hutter), per element in the
// opmath type T:
//   g = grad / grad_scale (negated when maximizing)
//   p *= 1 - lr * weight_decay
// then the moment step of adam_moments_rule.h.
#include "kiln/optim/adam_moments_rule.h"

namespace kiln::optim {

struct AdamWRule : AdamMomentsRule {
  static constexpr const char* kStepName = "adamw_step";

  template <class T>
  struct Update : Moments<T> {
    T decay;  // 1 - lr * weight_decay
    KILN_INLINE void operator()(T& p, T g, T& exp_avg, T& exp_avg_sq) const {
      g = g * this->grad_mul;
      p = p * decay;
      this->step(p, g, exp_avg, exp_avg_sq);
    }
  };

  template <class T>
  KILN_INLINE Update<T> update(const kernels::UpdateScalars& s) const {
    Update<T> f;
    set_moments<T>(f, s);
    f.decay = T(1.0 - s.lr * weight_decay);
    return f;
  }
};

inline kernels::MultiTensorStep<AdamWRule> adamw_step{AdamWRule::kStepName};

}  // namespace kiln::optim
