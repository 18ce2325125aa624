#include "kiln/optim/adam.h"

#include "kiln/core/error.h"
#include "kiln/optim/adam_rule.h"

namespace kiln::optim {

namespace {
AdamRule rule_of(const AdamOptions& o) {
  return AdamRule{std::get<0>(o.betas()), std::get<1>(o.betas()), o.eps(), o.weight_decay(), o.maximize()};
}
}  // namespace

namespace detail {

void validate_adam_like(const char* name, double lr, const std::tuple<double, double>& betas,
                        double eps, double weight_decay) {
  KILN_CHECK(lr >= 0.0, name, ": invalid learning rate ", lr, " (must be >= 0)");
  KILN_CHECK(eps >= 0.0, name, ": invalid eps ", eps, " (must be >= 0)");
  const double b1 = std::get<0>(betas), b2 = std::get<1>(betas);
  KILN_CHECK(b1 >= 0.0 && b1 < 1.0, name, ": invalid beta1 ", b1, " (must be in [0, 1))");
  KILN_CHECK(b2 >= 0.0 && b2 < 1.0, name, ": invalid beta2 ", b2, " (must be in [0, 1))");
  KILN_CHECK(weight_decay >= 0.0, name, ": invalid weight_decay ", weight_decay, " (must be >= 0)");
}

std::map<std::string, double> adam_like_map(double lr, const std::tuple<double, double>& betas,
                                            double eps, double weight_decay, bool maximize) {
  return {{"lr", lr}, {"beta1", std::get<0>(betas)}, {"beta2", std::get<1>(betas)},
          {"eps", eps}, {"weight_decay", weight_decay}, {"maximize", maximize ? 1.0 : 0.0}};
}

double map_get(const char* name, const std::map<std::string, double>& m, const char* key) {
  auto it = m.find(key);
  KILN_CHECK(it != m.end(), name, "::load_state_dict: parameter group option '", key, "' is missing");
  return it->second;
}

void adam_like_from_map(const char* name, const std::map<std::string, double>& m, double& lr,
                        std::tuple<double, double>& betas, double& eps, double& weight_decay,
                        bool& maximize) {
  lr = map_get(name, m, "lr");
  betas = {map_get(name, m, "beta1"), map_get(name, m, "beta2")};
  eps = map_get(name, m, "eps");
  weight_decay = map_get(name, m, "weight_decay");
  maximize = map_get(name, m, "maximize") != 0.0;
}

}  // namespace detail

void AdamOptions::validate() const {
  detail::validate_adam_like("Adam", lr_, betas_, eps_, weight_decay_);
}

std::map<std::string, double> AdamOptions::to_map() const {
  return detail::adam_like_map(lr_, betas_, eps_, weight_decay_, maximize_);
}
void AdamOptions::from_map(const std::map<std::string, double>& m) {
  detail::adam_like_from_map("Adam", m, lr_, betas_, eps_, weight_decay_, maximize_);
}

Adam::Adam(std::vector<Tensor> params, const AdamOptions& options)
    : Optimizer({ParamGroup(std::move(params))}, options.clone()) {}
Adam::Adam(std::vector<ParamGroup> groups, const AdamOptions& options)
    : Optimizer(std::move(groups), options.clone()) {}

std::unique_ptr<OptimizerParamState> Adam::make_param_state() const {
  return std::make_unique<AdamParamState>();
}

int Adam::buffers_needed(const OptimizerOptions& options) const {
  return rule_of(static_cast<const AdamOptions&>(options)).num_buffers();
}

void Adam::run_step_kernel(const OptimizerOptions& options, const kernels::MultiTensorLists& lists,
                           const kernels::StepScalars& scalars) const {
  kernels::run_multi_tensor_step(adam_step, rule_of(static_cast<const AdamOptions&>(options)), lists, scalars);
}

KILN_REGISTER_KERNEL(adam_step, CPU, &kernels::cpu::multi_tensor_step<AdamRule>);

}  // namespace kiln::optim
