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
}  // namespace detail

// The state of one parameter of Adam, AdamW and LAMB: the first and second moments.
class AdamParamState : public OptimizerParamState {
 public:
  Tensor exp_avg;     // first moment
  Tensor exp_avg_sq;  // second moment
  BufferSlots buffer_slots() override { return {{"exp_avg", &exp_avg}, {"exp_avg_sq", &exp_avg_sq}}; }
};

class AdamOptions : public OptimizerOptionsBase<AdamOptions> {
 public:
  static constexpr const char* kName = "Adam";
  AdamOptions() = default;
  AdamOptions(double lr) : lr_(lr) {}  // NOLINT: implicit, like libtorch
  KILN_ARG(double, lr) = 1e-3;
  KILN_ARG(Betas, betas) = std::make_tuple(0.9, 0.999);
  KILN_ARG(double, eps) = 1e-8;
  KILN_ARG(double, weight_decay) = 0.0;
  KILN_ARG(bool, maximize) = false;

 public:
  static constexpr auto kMomentumOption = &AdamOptions::betas_;
  template <class Visit>
  static void for_each_option(AdamOptions& self, Visit&& visit) {
    detail::visit_adam_like(visit, self.lr_, self.betas_, self.eps_, self.weight_decay_, self.maximize_);
  }
  void validate() const override;
};

struct AdamRule;
class Adam : public FusedOptimizer<AdamOptions, AdamParamState, AdamRule> {
 public:
  using FusedOptimizer::FusedOptimizer;
};

}  // namespace kiln::optim
