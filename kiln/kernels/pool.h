#pragma once
// Pooling kernels: no autograd. Every operand may have any strides. CPU: kernels/cpu/pool.cpp;
// CUDA: kernels/cuda/pool.cu.
#include <cstdint>

#include "kiln/core/tensor.h"
#include "kiln/kernels/dispatch.h"
#include "kiln/kernels/window.h"

namespace kiln::kernels {

// x [N, C, H, W] -> out [N, C, OH, OW]; window kh x kw, stride, zero/-inf padding.
struct PoolGeometry {
  int64_t N = 0, C = 0, H = 0, W = 0;
  int64_t OH = 0, OW = 0;
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0;
  // OH and OW from the input size, the window, stride and padding.
  void set_output_size() {
    OH = window_out_size(H, kh, sh, ph);
    OW = window_out_size(W, kw, sw, pw);
  }
};

// indices: int32, same sizes as out, the flat offset h * W + w of the (first) max in its plane.
inline Kernel<void(const Tensor& out, const Tensor& indices, const Tensor& x, const PoolGeometry& g)>
    max_pool2d_forward{"max_pool2d"};
// grad_x is overwritten: zero, then grad_out scattered to the recorded argmax positions.
inline Kernel<void(const Tensor& grad_x, const Tensor& grad_out, const Tensor& indices, const PoolGeometry& g)>
    max_pool2d_backward{"max_pool2d_backward"};
inline Kernel<void(const Tensor& out, const Tensor& x, const PoolGeometry& g, bool count_include_pad)>
    avg_pool2d_forward{"avg_pool2d"};
inline Kernel<void(const Tensor& grad_x, const Tensor& grad_out, const PoolGeometry& g, bool count_include_pad)>
    avg_pool2d_backward{"avg_pool2d_backward"};
// Window i covers [floor(i * H / OH), ceil((i + 1) * H / OH)) (PyTorch's rule); kh.. unused.
inline Kernel<void(const Tensor& out, const Tensor& x, const PoolGeometry& g)> adaptive_avg_pool2d_forward{
    "adaptive_avg_pool2d"};
inline Kernel<void(const Tensor& grad_x, const Tensor& grad_out, const PoolGeometry& g)> adaptive_avg_pool2d_backward{
    "adaptive_avg_pool2d_backward"};

}  // namespace kiln::kernels
