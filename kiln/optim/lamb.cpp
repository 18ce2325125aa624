#include "kiln/optim/lamb.h"

#include "kiln/optim/fused_optimizer_impl.h"
#include "kiln/optim/lamb_rule.h"

namespace kiln::optim {

void LAMBOptions::validate() const { detail::validate_adam_like(kName, lr_, betas_, eps_, weight_decay_); }

LAMBRule rule_of(const LAMBOptions& o) {
  return LAMBRule{std::get<0>(o.betas()), std::get<1>(o.betas()), o.eps(), o.weight_decay(),
                  o.bias_correction(), o.maximize()};
}
const kernels::MultiTensorStep<LAMBRule>& step_kernel_of(const LAMBRule&) { return lamb_step; }
template class FusedOptimizer<LAMBOptions, AdamParamState, LAMBRule>;

KILN_REGISTER_KERNEL(lamb_step, CPU, &kernels::cpu::multi_tensor_step<LAMBRule>);

}  // namespace kiln::optim
