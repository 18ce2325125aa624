#include "kiln/optim/sgd.h"

#include "kiln/core/error.h"
#include "kiln/optim/adam.h"  // detail::map_get
#include "kiln/optim/sgd_rule.h"

namespace kiln::optim {

namespace {
SGDRule rule_of(const SGDOptions& o) {
  return SGDRule{o.momentum(), o.dampening(), o.weight_decay(), o.nesterov(), o.maximize()};
}
}  // namespace

void SGDOptions::validate() const {
  KILN_CHECK(lr_ >= 0.0, "SGD: invalid learning rate ", lr_, " (must be >= 0)");
  KILN_CHECK(momentum_ >= 0.0, "SGD: invalid momentum ", momentum_, " (must be >= 0)");
  KILN_CHECK(weight_decay_ >= 0.0, "SGD: invalid weight_decay ", weight_decay_, " (must be >= 0)");
  KILN_CHECK(!nesterov_ || (momentum_ > 0.0 && dampening_ == 0.0),
             "SGD: nesterov momentum requires a momentum > 0 and zero dampening (got momentum ",
             momentum_, ", dampening ", dampening_, ")");
}

std::map<std::string, double> SGDOptions::to_map() const {
  return {{"lr", lr_}, {"momentum", momentum_}, {"dampening", dampening_},
          {"weight_decay", weight_decay_}, {"nesterov", nesterov_ ? 1.0 : 0.0},
          {"maximize", maximize_ ? 1.0 : 0.0}};
}

void SGDOptions::from_map(const std::map<std::string, double>& m) {
  lr_ = detail::map_get("SGD", m, "lr");
  momentum_ = detail::map_get("SGD", m, "momentum");
  dampening_ = detail::map_get("SGD", m, "dampening");
  weight_decay_ = detail::map_get("SGD", m, "weight_decay");
  nesterov_ = detail::map_get("SGD", m, "nesterov") != 0.0;
  maximize_ = detail::map_get("SGD", m, "maximize") != 0.0;
}

SGD::SGD(std::vector<Tensor> params, const SGDOptions& options)
    : Optimizer({ParamGroup(std::move(params))}, options.clone()) {}
SGD::SGD(std::vector<ParamGroup> groups, const SGDOptions& options)
    : Optimizer(std::move(groups), options.clone()) {}

std::unique_ptr<OptimizerParamState> SGD::make_param_state() const {
  return std::make_unique<SGDParamState>();
}

int SGD::buffers_needed(const OptimizerOptions& options) const {
  return rule_of(static_cast<const SGDOptions&>(options)).num_buffers();
}

void SGD::run_step_kernel(const OptimizerOptions& options, const kernels::MultiTensorLists& lists,
                          const kernels::StepScalars& scalars) const {
  kernels::run_multi_tensor_step(sgd_step, rule_of(static_cast<const SGDOptions&>(options)), lists, scalars);
}

KILN_REGISTER_KERNEL(sgd_step, CPU, &kernels::cpu::multi_tensor_step<SGDRule>);

}  // namespace kiln::optim
