#include "kiln/optim/lamb.h"

#include "kiln/optim/lamb_rule.h"

namespace kiln::optim {

namespace {
LAMBRule rule_of(const LAMBOptions& o) {
  return LAMBRule{std::get<0>(o.betas()), std::get<1>(o.betas()), o.eps(), o.weight_decay(),
                  o.bias_correction(), o.maximize()};
}
}  // namespace

void LAMBOptions::validate() const {
  detail::validate_adam_like("LAMB", lr_, betas_, eps_, weight_decay_);
}

std::map<std::string, double> LAMBOptions::to_map() const {
  auto m = detail::adam_like_map(lr_, betas_, eps_, weight_decay_, maximize_);
  m["bias_correction"] = bias_correction_ ? 1.0 : 0.0;
  return m;
}
void LAMBOptions::from_map(const std::map<std::string, double>& m) {
  detail::adam_like_from_map("LAMB", m, lr_, betas_, eps_, weight_decay_, maximize_);
  bias_correction_ = detail::map_get("LAMB", m, "bias_correction") != 0.0;
}

LAMB::LAMB(std::vector<Tensor> params, const LAMBOptions& options)
    : Optimizer({ParamGroup(std::move(params))}, options.clone()) {}
LAMB::LAMB(std::vector<ParamGroup> groups, const LAMBOptions& options)
    : Optimizer(std::move(groups), options.clone()) {}

std::unique_ptr<OptimizerParamState> LAMB::make_param_state() const {
  return std::make_unique<AdamParamState>();
}

int LAMB::buffers_needed(const OptimizerOptions& options) const {
  return rule_of(static_cast<const LAMBOptions&>(options)).num_buffers();
}

void LAMB::run_step_kernel(const OptimizerOptions& options, const kernels::MultiTensorLists& lists,
                           const kernels::StepScalars& scalars) const {
  kernels::run_multi_tensor_step(lamb_step, rule_of(static_cast<const LAMBOptions&>(options)), lists, scalars);
}

KILN_REGISTER_KERNEL(lamb_step, CPU, &kernels::cpu::multi_tensor_step<LAMBRule>);

}  // namespace kiln::optim
