// LARS's step on a GPU: the generic CUDA multi-tensor launcher run with LARSRule (kiln/optim/lars.h).
#include "kiln/kernels/cuda/multi_tensor.cuh"
#include "kiln/optim/lars.h"

namespace kiln::optim {

KILN_REGISTER_KERNEL(kernels::step_kernel<LARSRule>, CUDA, &kernels::cuda::multi_tensor_step<LARSRule>);

}  // namespace kiln::optim
