// SGD's step on a GPU: the generic CUDA multi-tensor launcher run with SGDRule (kiln/optim/sgd.h).
#include "kiln/kernels/cuda/multi_tensor.cuh"
#include "kiln/optim/sgd.h"

namespace kiln::optim {

KILN_REGISTER_KERNEL(kernels::step_kernel<SGDRule>, CUDA, &kernels::cuda::multi_tensor_step<SGDRule>);

}  // namespace kiln::optim
