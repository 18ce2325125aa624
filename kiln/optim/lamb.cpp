#include "kiln/optim/lamb.h"

namespace kiln::optim {

// LAMB's step on the CPU: the generic multi-tensor launcher run with LAMBRule.
KILN_REGISTER_KERNEL(kernels::step_kernel<LAMBRule>, CPU, &kernels::cpu::multi_tensor_step<LAMBRule>);

}  // namespace kiln::optim
