// Adam on a GPU: the generic CUDA multi-tensor launcher (kernels/cuda/multi_tensor.cuh) run with
// Adam's update rule (adam_rule.h), registered as adam_step's CUDA implementation.
#include "kiln/kernels/cuda/multi_tensor.cuh"
#include "kiln/optim/adam_rule.h"

namespace kiln::optim {

KILN_REGISTER_KERNEL(adam_step, CUDA, &kernels::cuda::multi_tensor_step<AdamRule>);

}  // namespace kiln::optim
