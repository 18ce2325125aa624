#include "kiln/optim/adamw.h"

#include "kiln/optim/adamw_rule.h"

namespace kiln::optim {

namespace {
AdamWRule rule_of(const AdamWOptions& o) {
  return AdamWRule{std::get<0>(o.betas()), std::get<1>(o.betas()), o.eps(), o.weight_decay(), o.maximize()};
}
}  // namespace

void AdamWOptions::validate() const {
  detail::validate_adam_like("AdamW", lr_, betas_, eps_, weight_decay_);
}

std::map<std::string, double> AdamWOptions::to_map() const {
  return detail::adam_like_map(lr_, betas_, eps_, weight_decay_, maximize_);
}
void AdamWOptions::from_map(const std::map<std::string, double>& m) {
  detail::adam_like_from_map("AdamW", m, lr_, betas_, eps_, weight_decay_, maximize_);
}

AdamW::AdamW(std::vector<Tensor> params, const AdamWOptions& options)
    : Optimizer({ParamGroup(std::move(params))}, options.clone()) {}
AdamW::AdamW(std::vector<ParamGroup> groups, const AdamWOptions& options)
    : Optimizer(std::move(groups), options.clone()) {}

std::unique_ptr<OptimizerParamState> AdamW::make_param_state() const {
  return std::make_unique<AdamParamState>();
}

int AdamW::buffers_needed(const OptimizerOptions& options) const {
  return rule_of(static_cast<const AdamWOptions&>(options)).num_buffers();
}

void AdamW::run_step_kernel(const OptimizerOptions& options, const kernels::MultiTensorLists& lists,
                            const kernels::StepScalars& scalars) const {
  kernels::run_multi_tensor_step(adamw_step, rule_of(static_cast<const AdamWOptions&>(options)), lists, scalars);
}

KILN_REGISTER_KERNEL(adamw_step, CPU, &kernels::cpu::multi_tensor_step<AdamWRule>);

}  // namespace kiln::optim
