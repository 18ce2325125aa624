// LAMB on a GPU: the generic CUDA multi-tensor launcher (kernels/cuda/multi_tensor.cuh) run with
// LAMB's update rule (lamb_rule.h), registered as lamb_step's CUDA implementation.
#include "kiln/kernels/cuda/multi_tensor.cuh"
#include "kiln/optim/lamb_rule.h"

namespace kiln::optim {

KILN_REGISTER_KERNEL(lamb_step, CUDA, &kernels::cuda::multi_tensor_step<LAMBRule>);

}  // namespace kiln::optim
