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

using pool_math::unflatten;
using pool_math::View4;
using pool_math::view4;

// True when consecutive channels are adjacent in memory (channels-last): the kernels then walk
// the channels innermost.
bool channels_inner(const Tensor& t) { return t.size(1) > 1 && t.stride(1) == 1; }

// One thread per element (n, c, h, w) of the written tensor [N, C, H, W] in a grid-stride loop,
// unflattened channels-innermost when cl; f(n, c, h, w) computes and writes it (the functors below).
template <class F> __global__ void pool_kernel(F f, int64_t N, int64_t C, int64_t H, int64_t W, bool cl) {
  const int64_t total = N * C * H * W;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t n, c, h, w;
    unflatten(i, C, H, W, cl, n, c, h, w);
    f(n, c, h, w);
  }
}

enum class Pool { Max, Avg, Adaptive };

// Output element (n, c, oh, ow) of a forward pass: O (and I, the argmax, for max) from X.
template <class T, Pool P> struct PoolForward {
  View4<const T> X;
  View4<T> O;
  View4<int32_t> I;  // max only
  PoolGeometry g;
  bool include_pad;  // avg only
  __device__ void operator()(int64_t n, int64_t c, int64_t oh, int64_t ow) const {
    if constexpr (P == Pool::Max) {
      opmath_t<T> best;
      int32_t bi;
      pool_math::max_fwd_at<T>(X, g, n, c, oh, ow, best, bi);
      O.at(n, c, oh, ow) = static_cast<T>(best);
      I.at(n, c, oh, ow) = bi;
    } else if constexpr (P == Pool::Avg) {
      O.at(n, c, oh, ow) = static_cast<T>(pool_math::avg_fwd_at<T>(X, g, include_pad, n, c, oh, ow));
    } else {
      O.at(n, c, oh, ow) = static_cast<T>(pool_math::adaptive_fwd_at<T>(X, g, n, c, oh, ow));
    }
  }
};

// Input gradient element (n, c, h, w) of a backward pass, gathered from GY.
template <class T, Pool P> struct PoolBackward {
  View4<T> GX;
  View4<const T> GY;
  View4<const int32_t> I;  // max only
  PoolGeometry g;
  bool include_pad;  // avg only
  __device__ void operator()(int64_t n, int64_t c, int64_t h, int64_t w) const {
    opmath_t<T> v;
    if constexpr (P == Pool::Max) v = pool_math::max_bwd_at<T>(GY, I, g, n, c, h, w);
    else if constexpr (P == Pool::Avg) v = pool_math::avg_bwd_at<T>(GY, g, include_pad, n, c, h, w);
    else v = pool_math::adaptive_bwd_at<T>(GY, g, n, c, h, w);
    GX.at(n, c, h, w) = static_cast<T>(v);
  }
};

// ------------------------------------------------------------------------------ host side

void check_operands(const char* op, const Tensor& ref, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) {
    KILN_CHECK(t->dim() == 4, op, ": expected 4-D operands, got sizes ", t->sizes());
    KILN_CHECK(t->device() == ref.device(), op, ": operands on different devices: ", ref.device(), " and ",
               t->device());
    if (t->dtype() != DType::I32)
      KILN_CHECK(t->dtype() == ref.dtype(), op, ": dtype mismatch: ", ref.dtype(), " and ", t->dtype(), " (sizes ",
                 ref.sizes(), " and ", t->sizes(), ")");
  }
}

void check_sizes(const char* op, const Tensor& t, const PoolGeometry& g, bool is_out) {
  const int64_t h = is_out ? g.OH : g.H, w = is_out ? g.OW : g.W;
  KILN_CHECK(t.size(0) == g.N && t.size(1) == g.C && t.size(2) == h && t.size(3) == w, op, ": operand sizes ",
             t.sizes(), " do not match the geometry [", g.N, ", ", g.C, ", ", h, ", ", w, "]");
}

// Launches pool_kernel over the elements of `written` (one of f's operands, on the current device).
template <class F> void launch(const F& f, const Tensor& written, const char* name) {
  pool_kernel<<<grid_for(written.numel()), kThreads, 0, stream_for(written)>>>(
      f, written.size(0), written.size(1), written.size(2), written.size(3), channels_inner(written));
  KILN_CUDA_CHECK_LAUNCH(name);
}

// The direction kBackward of pool P: forward writes dst = out [N, C, OH, OW] (and, for max, the
// int32 argmax indices) from src = x [N, C, H, W]; backward writes dst = grad_x from src = grad_out
// (and the indices), zeros when grad_out is empty. Operands are checked first.
template <Pool P, bool kBackward>
void run_pool(const char* op, const Tensor& dst, const Tensor& src, const Tensor& indices, const PoolGeometry& g,
              bool include_pad) {
  const Tensor& in = kBackward ? dst : src;
  const Tensor& out = kBackward ? src : dst;
  if constexpr (P != Pool::Max) check_operands(op, in, {&dst, &src});
  else if constexpr (kBackward) check_operands(op, in, {&dst, &src, &indices});
  else check_operands(op, in, {&dst, &indices, &src});
  check_sizes(op, in, g, false);
  check_sizes(op, out, g, true);
  if constexpr (P == Pool::Max) {
    check_sizes(op, indices, g, true);
    KILN_CHECK(indices.dtype() == DType::I32, op, ": indices must be int32, got ", indices.dtype());
    if (!kBackward) KILN_CHECK(g.H * g.W <= INT32_MAX, op, ": planes larger than 2^31 elements are not supported");
  }
  if (dst.numel() == 0) return;
  if constexpr (P == Pool::Adaptive) {
    if (kBackward) KILN_CHECK(g.OH > 0 && g.OW > 0, op, ": empty output size");
    else KILN_CHECK(g.H > 0 && g.W > 0, op, ": empty spatial input");
  }
  DeviceGuard guard(dst);
  if (kBackward && src.numel() == 0) {
    fill(dst, 0.0);
    return;
  }
  dispatch_floating(dst.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (kBackward) {
      const auto I = indices.defined() ? view4<const int32_t>(indices) : View4<const int32_t>{};
      launch(PoolBackward<T, P>{view4<T>(dst), view4<const T>(src), I, g, include_pad}, dst, op);
    } else {
      const auto I = indices.defined() ? view4<int32_t>(indices) : View4<int32_t>{};
      launch(PoolForward<T, P>{view4<const T>(src), view4<T>(dst), I, g, include_pad}, dst, op);
    }
  });
}

}  // namespace

void max_pool2d_forward(const Tensor& out, const Tensor& indices, const Tensor& x, const PoolGeometry& g) {
  run_pool<Pool::Max, false>("max_pool2d", out, x, indices, g, false);
}
KILN_REGISTER_KERNEL(kernels::max_pool2d_forward, CUDA, max_pool2d_forward);

void max_pool2d_backward(const Tensor& grad_x, const Tensor& grad_out, const Tensor& indices, const PoolGeometry& g) {
  run_pool<Pool::Max, true>("max_pool2d_backward", grad_x, grad_out, indices, g, false);
}
KILN_REGISTER_KERNEL(kernels::max_pool2d_backward, CUDA, max_pool2d_backward);

void avg_pool2d_forward(const Tensor& out, const Tensor& x, const PoolGeometry& g, bool count_include_pad) {
  run_pool<Pool::Avg, false>("avg_pool2d", out, x, Tensor(), g, count_include_pad);
}
KILN_REGISTER_KERNEL(kernels::avg_pool2d_forward, CUDA, avg_pool2d_forward);

void avg_pool2d_backward(const Tensor& grad_x, const Tensor& grad_out, const PoolGeometry& g, bool count_include_pad) {
  run_pool<Pool::Avg, true>("avg_pool2d_backward", grad_x, grad_out, Tensor(), g, count_include_pad);
}
KILN_REGISTER_KERNEL(kernels::avg_pool2d_backward, CUDA, avg_pool2d_backward);

void adaptive_avg_pool2d_forward(const Tensor& out, const Tensor& x, const PoolGeometry& g) {
  run_pool<Pool::Adaptive, false>("adaptive_avg_pool2d", out, x, Tensor(), g, false);
}
KILN_REGISTER_KERNEL(kernels::adaptive_avg_pool2d_forward, CUDA, adaptive_avg_pool2d_forward);

void adaptive_avg_pool2d_backward(const Tensor& grad_x, const Tensor& grad_out, const PoolGeometry& g) {
  run_pool<Pool::Adaptive, true>("adaptive_avg_pool2d_backward", grad_x, grad_out, Tensor(), g, false);
}
KILN_REGISTER_KERNEL(kernels::adaptive_avg_pool2d_backward, CUDA, adaptive_avg_pool2d_backward);

}  // namespace kiln::kernels::cuda
