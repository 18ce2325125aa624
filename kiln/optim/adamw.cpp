#include "kiln/optim/adamw.h"

#include "kiln/optim/adamw_rule.h"
#include "kiln/optim/fused_optimizer_impl.h"

namespace kiln::optim {

void AdamWOptions::validate() const { detail::validate_adam_like(kName, lr_, betas_, eps_, weight_decay_); }

AdamWRule rule_of(const AdamWOptions& o) {
  return AdamWRule{std::get<0>(o.betas()), std::get<1>(o.betas()), o.eps(), o.weight_decay(), o.maximize()};
}
const kernels::MultiTensorStep<AdamWRule>& step_kernel_of(const AdamWRule&) { return adamw_step; }
template class FusedOptimizer<AdamWOptions, AdamParamState, AdamWRule>;

KILN_REGISTER_KERNEL(adamw_step, CPU, &kernels::cpu::multi_tensor_step<AdamWRule>);

}  // namespace kiln::optim
