// LAMB's step on a GPU: the generic CUDA multi-tensor launcher run with LAMBRule (kiln/optim/lamb.h).
#include "kiln/kernels/cuda/multi_tensor.cuh"
#include "kiln/optim/lamb.h"

namespace kiln::optim {

KILN_REGISTER_KERNEL(kernels::step_kernel<LAMBRule>, CUDA, &kernels::cuda::multi_tensor_step<LAMBRule>);

}  // namespace kiln::optim
