#include "kiln/optim/adamw.h"

#include "kiln/optim/fused_optimizer_impl.h"

namespace kiln::optim {

// AdamW's step: FusedOptimizer's step members for it, and on the CPU the generic multi-tensor launcher
// run with AdamWRule.
template class FusedOptimizer<AdamWOptions, AdamParamState, AdamWRule>;
KILN_REGISTER_KERNEL(kernels::step_kernel<AdamWRule>, CPU, &kernels::cpu::multi_tensor_step<AdamWRule>);

}  // namespace kiln::optim
