#include "kiln/optim/adamw.h"

namespace kiln::optim {

// AdamW's step on the CPU: the generic multi-tensor launcher run with AdamWRule.
KILN_REGISTER_KERNEL(kernels::step_kernel<AdamWRule>, CPU, &kernels::cpu::multi_tensor_step<AdamWRule>);

}  // namespace kiln::optim
