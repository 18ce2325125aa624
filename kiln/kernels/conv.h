#pragma once
// Convolution kernels: no autograd, no shape inference beyond what the geometry says. The
// differentiable op (kiln/nn/functional/conv.cpp) checks the user's arguments, fills a geometry
// and calls these. CPU: kernels/cpu/conv.cpp (im2col + GEMM per sample for NCHW; patch rows
// straight from NHWC rows for channels-last); CUDA: kernels/cuda/conv_cudnn.cpp (cuDNN, heuristic
// or autotuned algorithms, see kiln/cuda/cudnn.h).
//
// Image tensors are always *logically* [N, C, H, W]; x, out and the gradients of one call share
// one physical layout (kernels/memory_format.h). Dtypes: the CPU kernels take f32 and f64 (the
// ops widen f16/bf16 to f32 for CPU tensors); the CUDA kernels also take f16 and bf16.
#include <cstdint>
#include <vector>

#include "kiln/core/tensor.h"
#include "kiln/kernels/dispatch.h"
#include "kiln/kernels/window.h"

namespace kiln::kernels {

// x [N, C, H, W] * weight [K, C / groups, kh, kw] -> out [N, K, OH, OW]
struct ConvGeometry {
  int64_t N = 0, C = 0, H = 0, W = 0;
  int64_t K = 0, kh = 1, kw = 1;
  int64_t OH = 0, OW = 0;
  int64_t sh = 1, sw = 1;  // stride
  int64_t ph = 0, pw = 0;  // zero padding
  int64_t dh = 1, dw = 1;  // dilation
  int64_t groups = 1;
  // false: x, out and their gradients are NCHW-contiguous; true: they are channels-last (NHWC
  // memory). The weight is always a contiguous [K, C / groups, kh, kw].
  bool channels_last = false;

  // OH and OW from the input size, the kernel, stride, padding and dilation.
  void set_output_size() {
    OH = window_out_size(H, kh, sh, ph, dh);
    OW = window_out_size(W, kw, sw, pw, dw);
  }
  // Every field as a number, in declaration order: the start of the autotuners' cache keys.
  std::vector<int64_t> fields() const {
    return {N, C, H, W, K, kh, kw, OH, OW, sh, sw, ph, pw, dh, dw, groups, channels_last ? 1 : 0};
  }
};

// out = conv(x, weight) + bias (bias [K] or undefined). out is overwritten.
inline Kernel<void(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvGeometry& g)>
    conv2d_forward{"conv2d"};
// grad_x = d(out)/d(x)^T grad_out (the transposed convolution). grad_x is overwritten.
inline Kernel<void(const Tensor& grad_x, const Tensor& grad_out, const Tensor& weight, const ConvGeometry& g)>
    conv2d_backward_input{"conv2d_backward_input"};
// grad_weight = sum over the batch of grad_out (x) patches; grad_bias (may be undefined) = sum of
// grad_out over N, OH, OW. Both overwritten. Per-thread partial sums, never per-sample grads.
inline Kernel<void(const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_out, const Tensor& x,
                   const ConvGeometry& g)>
    conv2d_backward_weight{"conv2d_backward_weight"};
// Both: grad_x, grad_weight and grad_bias (may be undefined) as the two kernels above would
// write them, for a backend that gains from computing them together (the CPU's Winograd
// convolutions transform grad_out once for both). Only where registered (has(backend)).
inline Kernel<void(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_out,
                   const Tensor& x, const Tensor& weight, const ConvGeometry& g)>
    conv2d_backward{"conv2d_backward"};

}  // namespace kiln::kernels
