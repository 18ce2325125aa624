#pragma once
// Adam, as torch.optim.Adam (weight decay is L2, added to the gradient):
//   g = grad + weight_decay * p;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// amsgrad is not implemented.
#include <tuple>

#include "kiln/optim/optimizer.h"

namespace kiln::optim {

namespace detail {
// Adam, AdamW and LAMB check their shared options the same way.
void validate_adam_like(const char* name, double lr, const Betas& betas, double eps, double weight_decay);
// ... and save the same options under the same names.
template <class Visit>
void visit_adam_like(Visit& visit, double& lr, Betas& betas, double& eps, double& weight_decay, bool& maximize) {
  visit("lr", lr);
  visit("betas", betas);
  visit("eps", eps);
  visit("weight_decay", weight_decay);
  visit("maximize", maximize);
}

// The options Adam, AdamW and LAMB share, checked and saved the same way; each derived class
// gives its name (kName) and its defaults of eps and weight_decay.
template <class Derived>
class AdamLikeOptions : public OptimizerOptionsBase<Derived> {
  KILN_BASE_ARG(Derived, double, lr);
  KILN_BASE_ARG(Derived, Betas, betas) = std::make_tuple(0.9, 0.999);
  KILN_BASE_ARG(Derived, double, eps);
  KILN_BASE_ARG(Derived, double, weight_decay);
  KILN_BASE_ARG(Derived, bool, maximize) = false;

 public:
  static constexpr auto kMomentumOption = &AdamLikeOptions::betas_;
  template <class Visit>
  static void for_each_option(Derived& self, Visit&& visit) {
    visit_adam_like(visit, self.lr_, self.betas_, self.eps_, self.weight_decay_, self.maximize_);
  }
  void validate() const override { validate_adam_like(Derived::kName, lr_, betas_, eps_, weight_decay_); }

 protected:
  AdamLikeOptions(double lr, double eps, double weight_decay) : lr_(lr), eps_(eps), weight_decay_(weight_decay) {}
};
}  // namespace detail

// The state of one parameter of Adam, AdamW and LAMB: the first and second moments.
class AdamParamState : public OptimizerParamState {
 public:
  Tensor exp_avg;     // first moment
  Tensor exp_avg_sq;  // second moment
  BufferSlots buffer_slots() override { return {{"exp_avg", &exp_avg}, {"exp_avg_sq", &exp_avg_sq}}; }
};

// lr, betas (0.9, 0.999), eps, weight_decay and maximize (false): see detail::AdamLikeOptions.
class AdamOptions : public detail::AdamLikeOptions<AdamOptions> {
 public:
  static constexpr const char* kName = "Adam";
  AdamOptions(double lr = 1e-3)  // NOLINT: implicit, like libtorch
      : AdamLikeOptions(lr, /*eps=*/1e-8, /*weight_decay=*/0.0) {}
};

struct AdamRule;
class Adam : public FusedOptimizer<AdamOptions, AdamParamState, AdamRule> {
 public:
  using FusedOptimizer::FusedOptimizer;
};

}  // namespace kiln::optim
