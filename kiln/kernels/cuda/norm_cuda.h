#pragma once
// The CUDA backend's normalisation, dropout and leaky-ReLU kernels: the contracts of
// kiln/kernels/norm_kernels.h (same statistics dtypes, same handling of undefined weight, bias and
// gradients), CUDA tensors only. Declared only when kiln is built with CUDA; norm_dispatch.cpp
// routes CUDA operands here. Implemented in norm.cu (batch norm, row norms) and dropout.cu
// (dropout, leaky ReLU).
#include <cstdint>

#include "kiln/core/tensor.h"

namespace kiln::kernels::cuda {

void batch_norm_forward(const Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias,
                        const Tensor& mean, const Tensor& invstd, const Tensor& var, bool training,
                        double eps, bool relu);
void batch_norm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                         const Tensor& g, const Tensor& x, const Tensor& weight,
                         const Tensor& mean, const Tensor& invstd, bool training, bool relu,
                         const Tensor& bias);
void row_norm_forward(const Tensor& y, const Tensor& mean, const Tensor& invstd, const Tensor& x,
                      const Tensor& weight, const Tensor& bias, bool rms, double eps);
void row_norm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                       const Tensor& g, const Tensor& x, const Tensor& weight, const Tensor& mean,
                       const Tensor& invstd, bool rms);
void dropout(const Tensor& out, const Tensor& in, double p, uint64_t seed, uint64_t offset);
void leaky_relu(const Tensor& y, const Tensor& x, double slope);
void leaky_relu_backward(const Tensor& dx, const Tensor& g, const Tensor& x, double slope);

}  // namespace kiln::kernels::cuda
