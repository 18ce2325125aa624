// CUDA 2-D pooling: max (with int32 argmax offsets h * W + w per plane), average
// (count_include_pad or not) and adaptive average, forward and backward.
//
// Every kernel is one thread per element it writes, in a grid-stride loop, and reads and writes
// every operand through its own strides (NCHW, channels-last or any view). The flat index is
// unflattened with the channel innermost when the written tensor is channels-last, so
// neighbouring threads touch neighbouring addresses in both layouts.
//
// Backward kernels are deterministic and use no atomics: one thread per *input* element gathers
// from the (few) output windows that cover it, in ascending (oh, ow) order - the order in which
// the CPU kernel (kernels/cpu/pool.cpp) scatters, so f32/f64 results match the CPU bitwise. The
// per-element bodies live in pool_math.h (__host__ __device__), where the CPU tests run them
// against the CPU kernels; this file only launches them. Math is done in opmath (f32 for
// f16/bf16), with one rounding to the storage type at the end.
#include <climits>

#include "kiln/kernels/copy_fill.h"
#include "kiln/kernels/conv.h"
#include "kiln/kernels/memory_format.h"
#include "kiln/kernels/pool.h"
#include "kiln/kernels/cuda/launch.cuh"
#include "kiln/kernels/cuda/pool_math.h"

namespace kiln::kernels::cuda {

namespace {

using pool_math::View4;
using pool_math::view4;
using pool_math::unflatten;

// True when consecutive channels are adjacent in memory (channels-last): the kernels then walk
// the channels innermost.
bool channels_inner(const Tensor& t) { return t.size(1) > 1 && t.stride(1) == 1; }

#define KILN_GRID_STRIDE(i, n)                                                              \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n);   \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

template <class T>
__global__ void max_pool_fwd_kernel(View4<const T> X, View4<T> O, View4<int32_t> I,
                                    PoolGeometry g, bool cl) {
  KILN_GRID_STRIDE(i, g.N * g.C * g.OH * g.OW) {
    int64_t n, c, oh, ow;
    unflatten(i, g.C, g.OH, g.OW, cl, n, c, oh, ow);
    opmath_t<T> best;
    int32_t bi;
    pool_math::max_fwd_at<T>(X, g, n, c, oh, ow, best, bi);
    O.at(n, c, oh, ow) = static_cast<T>(best);
    I.at(n, c, oh, ow) = bi;
  }
}

template <class T>
__global__ void max_pool_bwd_kernel(View4<T> GX, View4<const T> GY, View4<const int32_t> I,
                                    PoolGeometry g, bool cl) {
  KILN_GRID_STRIDE(i, g.N * g.C * g.H * g.W) {
    int64_t n, c, h, w;
    unflatten(i, g.C, g.H, g.W, cl, n, c, h, w);
    GX.at(n, c, h, w) = static_cast<T>(pool_math::max_bwd_at<T>(GY, I, g, n, c, h, w));
  }
}

template <class T>
__global__ void avg_pool_fwd_kernel(View4<const T> X, View4<T> O, PoolGeometry g, bool cl,
                                    bool include_pad) {
  KILN_GRID_STRIDE(i, g.N * g.C * g.OH * g.OW) {
    int64_t n, c, oh, ow;
    unflatten(i, g.C, g.OH, g.OW, cl, n, c, oh, ow);
    O.at(n, c, oh, ow) = static_cast<T>(pool_math::avg_fwd_at<T>(X, g, include_pad, n, c, oh, ow));
  }
}

template <class T>
__global__ void avg_pool_bwd_kernel(View4<T> GX, View4<const T> GY, PoolGeometry g, bool cl,
                                    bool include_pad) {
  KILN_GRID_STRIDE(i, g.N * g.C * g.H * g.W) {
    int64_t n, c, h, w;
    unflatten(i, g.C, g.H, g.W, cl, n, c, h, w);
    GX.at(n, c, h, w) = static_cast<T>(pool_math::avg_bwd_at<T>(GY, g, include_pad, n, c, h, w));
  }
}

template <class T>
__global__ void adaptive_fwd_kernel(View4<const T> X, View4<T> O, PoolGeometry g, bool cl) {
  KILN_GRID_STRIDE(i, g.N * g.C * g.OH * g.OW) {
    int64_t n, c, oh, ow;
    unflatten(i, g.C, g.OH, g.OW, cl, n, c, oh, ow);
    O.at(n, c, oh, ow) = static_cast<T>(pool_math::adaptive_fwd_at<T>(X, g, n, c, oh, ow));
  }
}

template <class T>
__global__ void adaptive_bwd_kernel(View4<T> GX, View4<const T> GY, PoolGeometry g, bool cl) {
  KILN_GRID_STRIDE(i, g.N * g.C * g.H * g.W) {
    int64_t n, c, h, w;
    unflatten(i, g.C, g.H, g.W, cl, n, c, h, w);
    GX.at(n, c, h, w) = static_cast<T>(pool_math::adaptive_bwd_at<T>(GY, g, n, c, h, w));
  }
}

#undef KILN_GRID_STRIDE

// ------------------------------------------------------------------------------ host side

void check_operands(const char* op, const Tensor& ref, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) {
    KILN_CHECK(t->dim() == 4, op, ": expected 4-D operands, got sizes ", t->sizes());
    KILN_CHECK(t->device() == ref.device(), op, ": operands on different devices: ", ref.device(),
               " and ", t->device());
    if (t->dtype() != DType::I32)
      KILN_CHECK(t->dtype() == ref.dtype(), op, ": dtype mismatch: ", ref.dtype(), " and ",
                 t->dtype(), " (sizes ", ref.sizes(), " and ", t->sizes(), ")");
  }
}

void check_sizes(const char* op, const Tensor& t, const PoolGeometry& g, bool is_out) {
  const int64_t h = is_out ? g.OH : g.H, w = is_out ? g.OW : g.W;
  KILN_CHECK(t.size(0) == g.N && t.size(1) == g.C && t.size(2) == h && t.size(3) == w, op,
             ": operand sizes ", t.sizes(), " do not match the geometry [", g.N, ", ", g.C, ", ",
             h, ", ", w, "]");
}

}  // namespace

void max_pool2d_forward(const Tensor& out, const Tensor& indices, const Tensor& x,
                        const PoolGeometry& g) {
  const char* op = "max_pool2d";
  check_operands(op, x, {&out, &indices, &x});
  check_sizes(op, x, g, false);
  check_sizes(op, out, g, true);
  check_sizes(op, indices, g, true);
  KILN_CHECK(indices.dtype() == DType::I32, op, ": indices must be int32, got ", indices.dtype());
  KILN_CHECK(g.H * g.W <= INT32_MAX, op, ": planes larger than 2^31 elements are not supported");
  if (out.numel() == 0) return;
  DeviceGuard guard(x);
  dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    max_pool_fwd_kernel<T><<<grid_for(out.numel()), kThreads, 0, stream_for(x)>>>(
        view4<const T>(x), view4<T>(out), view4<int32_t>(indices), g, channels_inner(out));
    KILN_CUDA_CHECK_LAUNCH("max_pool_fwd_kernel");
  });
}
KILN_REGISTER_KERNEL(kernels::max_pool2d_forward, CUDA, max_pool2d_forward);

void max_pool2d_backward(const Tensor& grad_x, const Tensor& grad_out, const Tensor& indices,
                         const PoolGeometry& g) {
  const char* op = "max_pool2d_backward";
  check_operands(op, grad_x, {&grad_x, &grad_out, &indices});
  check_sizes(op, grad_x, g, false);
  check_sizes(op, grad_out, g, true);
  check_sizes(op, indices, g, true);
  KILN_CHECK(indices.dtype() == DType::I32, op, ": indices must be int32, got ", indices.dtype());
  if (grad_x.numel() == 0) return;
  DeviceGuard guard(grad_x);
  if (grad_out.numel() == 0) {
    fill(grad_x, 0.0);
    return;
  }
  dispatch_floating(grad_x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    max_pool_bwd_kernel<T><<<grid_for(grad_x.numel()), kThreads, 0, stream_for(grad_x)>>>(
        view4<T>(grad_x), view4<const T>(grad_out), view4<const int32_t>(indices), g,
        channels_inner(grad_x));
    KILN_CUDA_CHECK_LAUNCH("max_pool_bwd_kernel");
  });
}
KILN_REGISTER_KERNEL(kernels::max_pool2d_backward, CUDA, max_pool2d_backward);

void avg_pool2d_forward(const Tensor& out, const Tensor& x, const PoolGeometry& g,
                        bool count_include_pad) {
  const char* op = "avg_pool2d";
  check_operands(op, x, {&out, &x});
  check_sizes(op, x, g, false);
  check_sizes(op, out, g, true);
  if (out.numel() == 0) return;
  DeviceGuard guard(x);
  dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    avg_pool_fwd_kernel<T><<<grid_for(out.numel()), kThreads, 0, stream_for(x)>>>(
        view4<const T>(x), view4<T>(out), g, channels_inner(out), count_include_pad);
    KILN_CUDA_CHECK_LAUNCH("avg_pool_fwd_kernel");
  });
}
KILN_REGISTER_KERNEL(kernels::avg_pool2d_forward, CUDA, avg_pool2d_forward);

void avg_pool2d_backward(const Tensor& grad_x, const Tensor& grad_out, const PoolGeometry& g,
                         bool count_include_pad) {
  const char* op = "avg_pool2d_backward";
  check_operands(op, grad_x, {&grad_x, &grad_out});
  check_sizes(op, grad_x, g, false);
  check_sizes(op, grad_out, g, true);
  if (grad_x.numel() == 0) return;
  DeviceGuard guard(grad_x);
  if (grad_out.numel() == 0) {
    fill(grad_x, 0.0);
    return;
  }
  dispatch_floating(grad_x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    avg_pool_bwd_kernel<T><<<grid_for(grad_x.numel()), kThreads, 0, stream_for(grad_x)>>>(
        view4<T>(grad_x), view4<const T>(grad_out), g, channels_inner(grad_x), count_include_pad);
    KILN_CUDA_CHECK_LAUNCH("avg_pool_bwd_kernel");
  });
}
KILN_REGISTER_KERNEL(kernels::avg_pool2d_backward, CUDA, avg_pool2d_backward);

void adaptive_avg_pool2d_forward(const Tensor& out, const Tensor& x, const PoolGeometry& g) {
  const char* op = "adaptive_avg_pool2d";
  check_operands(op, x, {&out, &x});
  check_sizes(op, x, g, false);
  check_sizes(op, out, g, true);
  if (out.numel() == 0) return;
  KILN_CHECK(g.H > 0 && g.W > 0, op, ": empty spatial input");
  DeviceGuard guard(x);
  dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    adaptive_fwd_kernel<T><<<grid_for(out.numel()), kThreads, 0, stream_for(x)>>>(
        view4<const T>(x), view4<T>(out), g, channels_inner(out));
    KILN_CUDA_CHECK_LAUNCH("adaptive_fwd_kernel");
  });
}
KILN_REGISTER_KERNEL(kernels::adaptive_avg_pool2d_forward, CUDA, adaptive_avg_pool2d_forward);

void adaptive_avg_pool2d_backward(const Tensor& grad_x, const Tensor& grad_out,
                                  const PoolGeometry& g) {
  const char* op = "adaptive_avg_pool2d_backward";
  check_operands(op, grad_x, {&grad_x, &grad_out});
  check_sizes(op, grad_x, g, false);
  check_sizes(op, grad_out, g, true);
  if (grad_x.numel() == 0) return;
  KILN_CHECK(g.OH > 0 && g.OW > 0, op, ": empty output size");
  DeviceGuard guard(grad_x);
  dispatch_floating(grad_x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    adaptive_bwd_kernel<T><<<grid_for(grad_x.numel()), kThreads, 0, stream_for(grad_x)>>>(
        view4<T>(grad_x), view4<const T>(grad_out), g, channels_inner(grad_x));
    KILN_CUDA_CHECK_LAUNCH("adaptive_bwd_kernel");
  });
}
KILN_REGISTER_KERNEL(kernels::adaptive_avg_pool2d_backward, CUDA, adaptive_avg_pool2d_backward);

}  // namespace kiln::kernels::cuda
