#pragma once
// Raw kernels of the nn layers (convolution, pooling): no autograd, no shape inference beyond
// what the geometry structs say. The differentiable ops in kiln/nn/functional/{conv,pool}.cpp
// check the user's arguments, fill a geometry and call these. nn_dispatch.cpp routes each call to
// the CPU backend (kiln/kernels/cpu/{conv,pool}.cpp) or, for CUDA tensors, to cuDNN
// (kernels/cuda/conv_cudnn.cpp: heuristic or autotuned algorithms, see kiln/core/cudnn.h) and the
// pooling kernels of kernels/cuda/pool.cu.
//
// Memory formats. Image tensors are always *logically* [N, C, H, W]. The convolution kernels
// accept two physical layouts: NCHW-contiguous, and channels-last (NHWC memory, i.e. strides
// [H*W*C, 1, W*C, C]); x, out and the gradients of one call must all share the layout. On the
// CPU, NCHW runs im2col + GEMM per sample; channels-last forms the patch matrix directly from
// NHWC rows (one row per output pixel) and runs GEMMs with the output pixels as rows. The pooling
// kernels take any strides for every operand. Dtypes: the CPU kernels take f32 and f64 (the ops
// widen f16/bf16 to f32 for CPU tensors); the CUDA kernels also take f16 and bf16 natively.
#include <cstdint>
#include <functional>

#include "kiln/core/tensor.h"

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
};

// The physical layout of a 4-D tensor as the conv kernels see it.
enum class MemoryFormat : uint8_t { Contiguous, ChannelsLast, Other };
// Exact NCHW strides win, then exact NHWC strides (so a [N, 1, H, W] channels-last tensor stays
// channels-last), then the same checks ignoring the strides of size-1 dimensions.
MemoryFormat memory_format(const Tensor& t);
// True when t's memory can be read as `fmt` (strides of size-1 dimensions ignored).
bool has_layout(const Tensor& t, MemoryFormat fmt);
// An uninitialised [N, C, H, W] tensor laid out in `fmt` (Other means Contiguous).
Tensor empty_4d(const IntList& sizes, const TensorOptions& opts, MemoryFormat fmt);

// out = conv(x, weight) + bias (bias [K] or undefined). out is overwritten.
void conv2d_forward(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias,
                    const ConvGeometry& g);
// grad_x = d(out)/d(x)^T grad_out (the transposed convolution). grad_x is overwritten.
void conv2d_backward_input(const Tensor& grad_x, const Tensor& grad_out, const Tensor& weight,
                           const ConvGeometry& g);
// grad_weight = sum over the batch of grad_out (x) patches; grad_bias (may be undefined) = sum of
// grad_out over N, OH, OW. Both overwritten. Per-thread partial sums, never per-sample grads.
void conv2d_backward_weight(const Tensor& grad_weight, const Tensor& grad_bias,
                            const Tensor& grad_out, const Tensor& x, const ConvGeometry& g);

// x [N, C, H, W] -> out [N, C, OH, OW]; window kh x kw, stride, zero/-inf padding.
struct PoolGeometry {
  int64_t N = 0, C = 0, H = 0, W = 0;
  int64_t OH = 0, OW = 0;
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0;
};

// indices: int32, same sizes as out, the flat offset h * W + w of the (first) max in its plane.
void max_pool2d_forward(const Tensor& out, const Tensor& indices, const Tensor& x,
                        const PoolGeometry& g);
// grad_x is overwritten: zero, then grad_out scattered to the recorded argmax positions.
void max_pool2d_backward(const Tensor& grad_x, const Tensor& grad_out, const Tensor& indices,
                         const PoolGeometry& g);
void avg_pool2d_forward(const Tensor& out, const Tensor& x, const PoolGeometry& g,
                        bool count_include_pad);
void avg_pool2d_backward(const Tensor& grad_x, const Tensor& grad_out, const PoolGeometry& g,
                         bool count_include_pad);
// Window i covers [floor(i * H / OH), ceil((i + 1) * H / OH)) (PyTorch's rule); kh.. unused.
void adaptive_avg_pool2d_forward(const Tensor& out, const Tensor& x, const PoolGeometry& g);
void adaptive_avg_pool2d_backward(const Tensor& grad_x, const Tensor& grad_out,
                                  const PoolGeometry& g);

namespace cpu {
void conv2d_forward(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias,
                    const ConvGeometry& g);
void conv2d_backward_input(const Tensor& grad_x, const Tensor& grad_out, const Tensor& weight,
                           const ConvGeometry& g);
void conv2d_backward_weight(const Tensor& grad_weight, const Tensor& grad_bias,
                            const Tensor& grad_out, const Tensor& x, const ConvGeometry& g);
void max_pool2d_forward(const Tensor& out, const Tensor& indices, const Tensor& x,
                        const PoolGeometry& g);
void max_pool2d_backward(const Tensor& grad_x, const Tensor& grad_out, const Tensor& indices,
                         const PoolGeometry& g);
void avg_pool2d_forward(const Tensor& out, const Tensor& x, const PoolGeometry& g,
                        bool count_include_pad);
void avg_pool2d_backward(const Tensor& grad_x, const Tensor& grad_out, const PoolGeometry& g,
                         bool count_include_pad);
void adaptive_avg_pool2d_forward(const Tensor& out, const Tensor& x, const PoolGeometry& g);
void adaptive_avg_pool2d_backward(const Tensor& grad_x, const Tensor& grad_out,
                                  const PoolGeometry& g);
}  // namespace cpu

}  // namespace kiln::kernels
