#pragma once
// CUDA multi-tensor launchers (kernels/cuda/multi_tensor.cu): the same contracts as
// kiln/kernels/optim_kernels.h, for CUDA tensors. Only declared when kiln is built with CUDA;
// kernels/optim_dispatch.cpp routes to them.
#include "kiln/kernels/optim_kernels.h"

namespace kiln::kernels::cuda {

void fused_optimizer_step(const math::OptimHyper& hyper, const MultiTensorLists& lists,
                          const StepScalars& scalars);
Tensor multi_tensor_norm(const std::vector<Tensor>& tensors, double norm_type);
void multi_tensor_scale_(const std::vector<Tensor>& tensors, const Tensor& scale);
void multi_tensor_lerp_(const std::vector<Tensor>& dst, const std::vector<Tensor>& src, double weight);

}  // namespace kiln::kernels::cuda
