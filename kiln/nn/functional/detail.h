#pragma once
// Pieces shared between the files of kiln/nn/functional/ that are not part of the public API.
#include <functional>

#include "kiln/core/tensor.h"
#include "kiln/kernels/conv.h"
#include "kiln/kernels/memory_format.h"
#include "kiln/kernels/pool.h"
#include "kiln/nn/functional.h"

namespace kiln::nn::functional::detail {

// A forward kernel for conv2d_with_forward: computes `out` from the operands in the kernel's
// layout and geometry and returns true, or returns false and conv2d's own kernel runs.
using ConvForward = std::function<bool(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias,
                                       const kernels::ConvGeometry& g)>;
// conv2d (same arguments, checks and autograd: its backward is conv2d's) with `forward` tried in
// place of its forward kernel: the hook of fused ops that take more from the conv's forward (the
// conv-block ops of kiln/nn/fused/ take a BatchNorm's statistics in its epilogue).
Tensor conv2d_with_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& params,
                           const ConvForward& forward);

// batch_norm's argument checks for an input of `sizes` ([N, C, *]) on like's device with like's
// dtype (like: the input itself, or the input of the conv that produces it).
void check_batch_norm_args(const char* op, const Tensor& like, const IntList& sizes, const Tensor& running_mean,
                           const Tensor& running_var, const Tensor& weight, const Tensor& bias, bool training,
                           double eps);
// running = (1 - momentum) * running + momentum * batch, with the unbiased batch variance of M
// values per channel.
void update_running_stats(const Tensor& running_mean, const Tensor& running_var, const Tensor& mean, const Tensor& var,
                          int64_t M, double momentum);
// The options of batch statistics for input x: kernels::norm_stat_dtype on x's device.
TensorOptions batch_norm_stat_options(const Tensor& x);

}  // namespace kiln::nn::functional::detail
