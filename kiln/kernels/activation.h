#pragma once
// Leaky ReLU (the other activations are pointwise ops, kernels/pointwise.h). CPU:
// kernels/cpu/activation.cpp; CUDA: kernels/cuda/dropout.cu.
#include <cstdint>

#include "kiln/core/tensor.h"
#include "kiln/kernels/dispatch.h"

namespace kiln::kernels {

// y = x > 0 ? x : slope * x; dx = g * (x > 0 ? 1 : slope). Contiguous operands.
inline Kernel<void(const Tensor& y, const Tensor& x, double slope)> leaky_relu{"leaky_relu"};
inline Kernel<void(const Tensor& dx, const Tensor& g, const Tensor& x, double slope)> leaky_relu_backward{
    "leaky_relu_backward"};

}  // namespace kiln::kernels
