#pragma once
// Pieces shared between the files of kiln/nn/functional/ that are not part of the public API.
#include "kiln/core/tensor.h"
#include "kiln/kernels/conv.h"
#include "kiln/kernels/memory_format.h"
#include "kiln/kernels/pool.h"
#include "kiln/nn/functional.h"

namespace kiln::nn::functional::detail {

// conv2d (same arguments, checks, autograd) that also sets batch_mean / batch_var to the batch
// mean and biased variance of its output per channel ([K], f64 for f64 data, f32 otherwise) when
// the CPU NCHW kernel takes them in its epilogue (kernels::conv2d_forward_batch_stats); both are
// left undefined otherwise (other devices, channels-last, autotuning, f16/bf16, autocast). They
// carry no gradient: a BatchNorm that uses them differentiates through its statistics itself.
// geometry, when not null, receives the kernel's geometry whenever the statistics were taken.
Tensor conv2d_with_batch_stats(const Tensor& x, const Tensor& weight, const Tensor& bias,
                               const Conv2dParams& params, Tensor& batch_mean, Tensor& batch_var,
                               kernels::ConvGeometry* geometry = nullptr);

}  // namespace kiln::nn::functional::detail
