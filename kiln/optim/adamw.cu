// AdamW's step on a GPU: the generic CUDA multi-tensor launcher run with AdamWRule (kiln/optim/adamw.h).
#include "kiln/kernels/cuda/multi_tensor.cuh"
#include "kiln/optim/adamw.h"

namespace kiln::optim {

KILN_REGISTER_KERNEL(kernels::step_kernel<AdamWRule>, CUDA, &kernels::cuda::multi_tensor_step<AdamWRule>);

}  // namespace kiln::optim
