#pragma once
// SGD with momentum, dampening, Nesterov momentum and (coupled) weight decay, as torch.optim.SGD:
//   g = grad + weight_decay * p
//   buf = g (first step) | momentum * buf + (1 - dampening) * g
//   g = nesterov ? g + momentum * buf : buf;  p -= lr * g
//
//   kiln::optim::SGD opt(net.parameters(), kiln::optim::SGDOptions(0.1).momentum(0.9).nesterov(true));
#include "kiln/optim/optimizer.h"

namespace kiln::optim {

// The state of one parameter of SGD and LARS: the momentum buffer (undefined without momentum).
namespace detail {
// SGD and LARS save their shared options under the same names.
template <class Visit>
void visit_sgd_like(Visit& visit, double& lr, double& momentum, double& dampening, double& weight_decay) {
  visit("lr", lr);
  visit("momentum", momentum);
  visit("dampening", dampening);
  visit("weight_decay", weight_decay);
}

// The options SGD and LARS share; each derived class gives its name (kName), its default
// momentum and validate. for_each_option saves SGD's options (LARS, with more, has its own).
template <class Derived>
class SGDLikeOptions : public OptimizerOptionsBase<Derived> {
  KILN_BASE_ARG(Derived, double, lr);
  KILN_BASE_ARG(Derived, double, momentum);
  KILN_BASE_ARG(Derived, double, dampening) = 0.0;
  KILN_BASE_ARG(Derived, double, weight_decay) = 0.0;
  KILN_BASE_ARG(Derived, bool, nesterov) = false;
  KILN_BASE_ARG(Derived, bool, maximize) = false;

 public:
  static constexpr auto kMomentumOption = &SGDLikeOptions::momentum_;
  template <class Visit>
  static void for_each_option(Derived& self, Visit&& visit) {
    visit_sgd_like(visit, self.lr_, self.momentum_, self.dampening_, self.weight_decay_);
    visit("nesterov", self.nesterov_);
    visit("maximize", self.maximize_);
  }

 protected:
  SGDLikeOptions(double lr, double momentum) : lr_(lr), momentum_(momentum) {}
};
}  // namespace detail

class SGDParamState : public OptimizerParamState {
 public:
  Tensor momentum_buffer;
  BufferSlots buffer_slots() override { return {{"momentum_buffer", &momentum_buffer}}; }
};

// lr, momentum (0), dampening (0), weight_decay (0), nesterov and maximize (false): see
// detail::SGDLikeOptions.
class SGDOptions : public detail::SGDLikeOptions<SGDOptions> {
 public:
  static constexpr const char* kName = "SGD";
  SGDOptions(double lr = 1e-3) : SGDLikeOptions(lr, /*momentum=*/0.0) {}  // NOLINT: implicit, like libtorch
  void validate() const override;
};

struct SGDRule;
class SGD : public FusedOptimizer<SGDOptions, SGDParamState, SGDRule> {
 public:
  using FusedOptimizer::FusedOptimizer;
};

}  // namespace kiln::optim
