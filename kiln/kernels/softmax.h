#pragma once
// Softmax and log-softmax along the last dimension. CPU: kernels/cpu/softmax.cpp; CUDA:
// kernels/cuda/softmax.cu. No autograd.
#include "kiln/core/tensor.h"
#include "kiln/kernels/dispatch.h"

namespace kiln::kernels {

// out = softmax(in) or log_softmax(in) (log) along the last dimension of a contiguous tensor.
inline Kernel<void(const Tensor& out, const Tensor& in, bool log)> softmax{"softmax"};
// grad_in = y * (g - sum(g*y))  or  g - exp(y) * sum(g)  (log)
inline Kernel<void(const Tensor& grad_in, const Tensor& grad_out, const Tensor& out, bool log)> softmax_backward{
    "softmax_backward"};

}  // namespace kiln::kernels
