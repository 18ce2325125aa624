// AdamW on a GPU: the generic CUDA multi-tensor launcher (kernels/cuda/multi_tensor.cuh) run with
// AdamW's update rule (adamw_rule.h), registered as adamw_step's CUDA implementation.
#include "kiln/kernels/cuda/multi_tensor.cuh"
#include "kiln/optim/adamw_rule.h"

namespace kiln::optim {

KILN_REGISTER_KERNEL(adamw_step, CUDA, &kernels::cuda::multi_tensor_step<AdamWRule>);

}  // namespace kiln::optim
