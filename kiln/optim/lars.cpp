#include "kiln/optim/lars.h"

#include "kiln/core/error.h"
#include "kiln/optim/adam.h"  // detail::map_get
#include "kiln/optim/lars_rule.h"

namespace kiln::optim {

namespace {
LARSRule rule_of(const LARSOptions& o) {
  return LARSRule{o.momentum(), o.dampening(), o.weight_decay(), o.trust_coefficient(), o.eps(),
                  o.nesterov(), o.maximize()};
}
}  // namespace

void LARSOptions::validate() const {
  KILN_CHECK(lr_ >= 0.0, "LARS: invalid learning rate ", lr_, " (must be >= 0)");
  KILN_CHECK(momentum_ >= 0.0, "LARS: invalid momentum ", momentum_, " (must be >= 0)");
  KILN_CHECK(weight_decay_ >= 0.0, "LARS: invalid weight_decay ", weight_decay_, " (must be >= 0)");
  KILN_CHECK(trust_coefficient_ > 0.0, "LARS: invalid trust_coefficient ", trust_coefficient_,
             " (must be > 0)");
  KILN_CHECK(eps_ >= 0.0, "LARS: invalid eps ", eps_, " (must be >= 0)");
  KILN_CHECK(!nesterov_ || (momentum_ > 0.0 && dampening_ == 0.0),
             "LARS: nesterov momentum requires a momentum > 0 and zero dampening");
}

std::map<std::string, double> LARSOptions::to_map() const {
  return {{"lr", lr_}, {"momentum", momentum_}, {"dampening", dampening_},
          {"weight_decay", weight_decay_}, {"trust_coefficient", trust_coefficient_},
          {"eps", eps_}, {"nesterov", nesterov_ ? 1.0 : 0.0}, {"maximize", maximize_ ? 1.0 : 0.0}};
}

void LARSOptions::from_map(const std::map<std::string, double>& m) {
  lr_ = detail::map_get("LARS", m, "lr");
  momentum_ = detail::map_get("LARS", m, "momentum");
  dampening_ = detail::map_get("LARS", m, "dampening");
  weight_decay_ = detail::map_get("LARS", m, "weight_decay");
  trust_coefficient_ = detail::map_get("LARS", m, "trust_coefficient");
  eps_ = detail::map_get("LARS", m, "eps");
  nesterov_ = detail::map_get("LARS", m, "nesterov") != 0.0;
  maximize_ = detail::map_get("LARS", m, "maximize") != 0.0;
}

LARS::LARS(std::vector<Tensor> params, const LARSOptions& options)
    : Optimizer({ParamGroup(std::move(params))}, options.clone()) {}
LARS::LARS(std::vector<ParamGroup> groups, const LARSOptions& options)
    : Optimizer(std::move(groups), options.clone()) {}

std::unique_ptr<OptimizerParamState> LARS::make_param_state() const {
  return std::make_unique<SGDParamState>();
}

int LARS::buffers_needed(const OptimizerOptions& options) const {
  return rule_of(static_cast<const LARSOptions&>(options)).num_buffers();
}

void LARS::run_step_kernel(const OptimizerOptions& options, const kernels::MultiTensorLists& lists,
                           const kernels::StepScalars& scalars) const {
  kernels::run_multi_tensor_step(lars_step, rule_of(static_cast<const LARSOptions&>(options)), lists, scalars);
}

KILN_REGISTER_KERNEL(lars_step, CPU, &kernels::cpu::multi_tensor_step<LARSRule>);

}  // namespace kiln::optim
