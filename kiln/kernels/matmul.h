#pragma once
// Matrix products. CPU: kernels/cpu/matmul.cpp (Eigen); CUDA: kernels/cuda/matmul_cublaslt.cpp
// (cuBLASLt). No autograd.
#include "kiln/core/tensor.h"
#include "kiln/kernels/dispatch.h"

namespace kiln::kernels {

// C = A @ B for 2-D (or batched 3-D) operands; any strides; dtype shared.
inline Kernel<void(const Tensor& c, const Tensor& a, const Tensor& b)> matmul{"matmul"};

}  // namespace kiln::kernels
