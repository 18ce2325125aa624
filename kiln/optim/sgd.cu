// SGD on a GPU: the generic CUDA multi-tensor launcher (kernels/cuda/multi_tensor.cuh) run with
// SGD's update rule (sgd_rule.h), registered as sgd_step's CUDA implementation.
#include "kiln/kernels/cuda/multi_tensor.cuh"
#include "kiln/optim/sgd_rule.h"

namespace kiln::optim {

KILN_REGISTER_KERNEL(sgd_step, CUDA, &kernels::cuda::multi_tensor_step<SGDRule>);

}  // namespace kiln::optim
