// Adam's step on a GPU: the generic CUDA multi-tensor launcher run with AdamRule (kiln/optim/adam.h).
#include "kiln/kernels/cuda/multi_tensor.cuh"
#include "kiln/optim/adam.h"

namespace kiln::optim {

KILN_REGISTER_KERNEL(kernels::step_kernel<AdamRule>, CUDA, &kernels::cuda::multi_tensor_step<AdamRule>);

}  // namespace kiln::optim
