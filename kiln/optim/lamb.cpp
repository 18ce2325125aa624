#include "kiln/optim/lamb.h"

#include "kiln/optim/fused_optimizer_impl.h"

namespace kiln::optim {

// LAMB's step: FusedOptimizer's step members for it, and on the CPU the generic multi-tensor launcher
// run with LAMBRule.
template class FusedOptimizer<LAMBOptions, AdamParamState, LAMBRule>;
KILN_REGISTER_KERNEL(kernels::step_kernel<LAMBRule>, CPU, &kernels::cpu::multi_tensor_step<LAMBRule>);

}  // namespace kiln::optim
