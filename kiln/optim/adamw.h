#pragma once
// AdamW (decoupled weight decay, Loshchilov & Hutter), as torch.optim.AdamW:
//   p *= 1 - lr * weight_decay;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
//
//   kiln::optim::AdamW opt(params, kiln::optim::AdamWOptions(3e-4).betas({0.9, 0.95}).weight_decay(0.1));
#include "kiln/optim/adam.h"

namespace kiln::optim {

class AdamWOptions : public OptimizerOptionsBase<AdamWOptions> {
 public:
  static constexpr const char* kName = "AdamW";
  AdamWOptions() = default;
  AdamWOptions(double lr) : lr_(lr) {}  // NOLINT: implicit, like libtorch
  KILN_ARG(double, lr) = 1e-3;
  KILN_ARG(Betas, betas) = std::make_tuple(0.9, 0.999);
  KILN_ARG(double, eps) = 1e-8;
  KILN_ARG(double, weight_decay) = 1e-2;
  KILN_ARG(bool, maximize) = false;

 public:
  static constexpr auto kMomentumOption = &AdamWOptions::betas_;
  template <class Visit>
  static void for_each_option(AdamWOptions& self, Visit&& visit) {
    detail::visit_adam_like(visit, self.lr_, self.betas_, self.eps_, self.weight_decay_, self.maximize_);
  }
  void validate() const override;
};

struct AdamWRule;
class AdamW : public FusedOptimizer<AdamWOptions, AdamParamState, AdamWRule> {
 public:
  using FusedOptimizer::FusedOptimizer;
};

}  // namespace kiln::optim
