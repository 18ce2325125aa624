// LARS on a GPU: the generic CUDA multi-tensor launcher (kernels/cuda/multi_tensor.cuh) run with
// LARS's update rule (lars_rule.h), registered as lars_step's CUDA implementation.
#include "kiln/kernels/cuda/multi_tensor.cuh"
#include "kiln/optim/lars_rule.h"

namespace kiln::optim {

KILN_REGISTER_KERNEL(lars_step, CUDA, &kernels::cuda::multi_tensor_step<LARSRule>);

}  // namespace kiln::optim
