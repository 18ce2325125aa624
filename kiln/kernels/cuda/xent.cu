// Fused softmax + cross-entropy on the GPU (contract and formulas: kiln/kernels/cross_entropy.h).
//
// What it computes
//   forward, per row of logits [R, C]: the online (max, sum of exp) pair and the sum of x in ONE
//   read of the row, then loss = (1-e)(lse - x_t) + e(lse - mean x) and lse (both f32 for
//   16-bit logits, f64 for f64);
//   backward: dx_j = (exp(x_j - lse) - q_j) * g_row in one read of x and one write of dx.
//
// Why it is fast
//   The composite (log_softmax, gather, mean over classes, backward through each) reads and writes
//   [R, C] tensors several times and keeps the log-probabilities alive until backward; here the
//   logits are read once per direction and the only thing saved is lse (4 bytes per row).
//   Rows with C <= 1024 get one warp each (8 rows per 256-thread block, shuffles only); longer rows
//   (a GPT-2 vocabulary of 50257) get one 256-thread block each. Loads are 16-byte vectors over
//   the aligned middle of each row (rows of odd C start at any 2-byte offset, so a scalar head
//   and tail surround it); 16-bit values are read natively and converted to f32 in registers.
//   Nothing is read back on the host: an out-of-range target turns into a NaN loss (and NaN
//   gradient) for its row instead of a synchronising range check.
#include <cuda_fp16.h>

#include <cmath>

#include "kiln/kernels/cuda/block_reduce.cuh"
#include "kiln/kernels/cuda/launch.cuh"
#include "kiln/kernels/cross_entropy.h"
#include "kiln/kernels/math/xent_dispatch.h"

namespace kiln::kernels::cuda {

namespace {

using xent::MaxSum;

constexpr int kWarp = 32;
constexpr int64_t kWarpRowMaxC = 1024;  // rows up to this long get a warp, longer ones a block

// Storage <-> opmath conversions; f16 uses the hardware instructions.
template <class T> __device__ __forceinline__ opmath_t<T> load_m(T v) { return static_cast<opmath_t<T>>(v); }
template <> __device__ __forceinline__ float load_m<Half>(Half v) { return __half2float(__ushort_as_half(v.bits)); }
template <class T> __device__ __forceinline__ T store_m(opmath_t<T> v) { return static_cast<T>(v); }
template <> __device__ __forceinline__ Half store_m<Half>(float v) {
  return Half::from_bits(__half_as_ushort(__float2half_rn(v)));
}

template <class T> struct alignas(16) Pack {
  static constexpr int kN = 16 / sizeof(T);
  T v[kN];
};

// Elements before the first 16-byte boundary of `p` (all of the row if `p` is not even
// element-aligned, which no kiln tensor is, or if `q` is not aligned like `p`).
template <class T> __device__ __forceinline__ int64_t head_of(const void* p, const void* q, int64_t C) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(q);
  if (a % sizeof(T) != 0 || a % 16 != b % 16) return C;
  const int64_t h = static_cast<int64_t>((16 - a % 16) % 16 / sizeof(T));
  return h < C ? h : C;
}

// This thread's share of a row: lanes lane, lane + nlanes, ... of the head, the packs and the
// tail. Accumulates the online (max, sum of exp) pair and the plain sum.
template <class T>
__device__ __forceinline__ void row_partial(const T* x, int64_t C, int lane, int nlanes, MaxSum<opmath_t<T>>& ms,
                                            opmath_t<T>& sx) {
  using M = opmath_t<T>;
  using P = Pack<T>;
  const int64_t head = head_of<T>(x, x, C);
  for (int64_t i = lane; i < head; i += nlanes) {
    const M v = load_m(x[i]);
    xent::maxsum_push(ms, v);
    sx += v;
  }
  const int64_t packs = (C - head) / P::kN;
  const P* xp = reinterpret_cast<const P*>(x + head);
  for (int64_t k = lane; k < packs; k += nlanes) {
    const P p = xp[k];
#pragma unroll
    for (int e = 0; e < P::kN; ++e) {
      const M v = load_m(p.v[e]);
      xent::maxsum_push(ms, v);
      sx += v;
    }
  }
  for (int64_t i = head + packs * P::kN + lane; i < C; i += nlanes) {
    const M v = load_m(x[i]);
    xent::maxsum_push(ms, v);
    sx += v;
  }
}

// Combines the (max, sum of exp, sum of x) triples of a warp; every lane gets the result.
template <class M> __device__ __forceinline__ void warp_combine(MaxSum<M>& ms, M& sx) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset >>= 1) {
    MaxSum<M> other{__shfl_xor_sync(0xffffffffu, ms.max, offset), __shfl_xor_sync(0xffffffffu, ms.sum, offset)};
    ms = xent::maxsum_merge(ms, other);
    sx += __shfl_xor_sync(0xffffffffu, sx, offset);
  }
}

// The same across the block (blockDim.x a multiple of 32); the result is valid in thread 0.
template <class M> __device__ __forceinline__ void block_combine(MaxSum<M>& ms, M& sx) {
  __shared__ M s_max[32], s_sum[32], s_sx[32];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, nwarps = blockDim.x / kWarp;
  warp_combine(ms, sx);
  __syncthreads();  // the arrays may still be read for the previous row
  if (lane == 0) {
    s_max[warp] = ms.max;
    s_sum[warp] = ms.sum;
    s_sx[warp] = sx;
  }
  __syncthreads();
  if (warp == 0) {
    ms = lane < nwarps ? MaxSum<M>{s_max[lane], s_sum[lane]} : xent::maxsum_init<M>();
    sx = lane < nwarps ? s_sx[lane] : M(0);
    warp_combine(ms, sx);
  }
}

// Thread 0 of a row's group writes the row's loss and lse.
template <class T, class I>
__device__ __forceinline__ void write_row(const T* x, int64_t r, int64_t C, const I* target, int64_t ignore_index,
                                          opmath_t<T> eps, MaxSum<opmath_t<T>> ms, opmath_t<T> sx, opmath_t<T>* loss,
                                          opmath_t<T>* lse) {
  using M = opmath_t<T>;
  const int64_t t = static_cast<int64_t>(target[r]);
  const int kind = xent::target_kind(t, C, ignore_index);
  const M x_t = kind == xent::kClass ? load_m(x[t]) : M(0);
  const xent::RowLoss<M> rl = xent::row_loss(ms.max, ms.sum, sx, x_t, C, eps);
  lse[r] = rl.lse;
  loss[r] = kind == xent::kClass ? rl.loss : kind == xent::kIgnored ? M(0) : M(NAN);
}

// Forward, one warp per row (C <= kWarpRowMaxC).
template <class T, class I>
__global__ void xent_forward_warp_kernel(const T* __restrict__ logits, const I* __restrict__ target,
                                         opmath_t<T>* __restrict__ loss, opmath_t<T>* __restrict__ lse, int64_t R,
                                         int64_t C, int64_t ignore_index, opmath_t<T> eps) {
  using M = opmath_t<T>;
  const int lane = threadIdx.x % kWarp;
  const int64_t warps_per_block = blockDim.x / kWarp;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * warps_per_block + threadIdx.x / kWarp; r < R;
       r += static_cast<int64_t>(gridDim.x) * warps_per_block) {
    const T* x = logits + r * C;
    MaxSum<M> ms = xent::maxsum_init<M>();
    M sx = 0;
    row_partial(x, C, lane, kWarp, ms, sx);
    warp_combine(ms, sx);
    if (lane == 0) write_row(x, r, C, target, ignore_index, eps, ms, sx, loss, lse);
  }
}

// Forward, one block per row.
template <class T, class I>
__global__ void xent_forward_block_kernel(const T* __restrict__ logits, const I* __restrict__ target,
                                          opmath_t<T>* __restrict__ loss, opmath_t<T>* __restrict__ lse, int64_t R,
                                          int64_t C, int64_t ignore_index, opmath_t<T> eps) {
  using M = opmath_t<T>;
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const T* x = logits + r * C;
    MaxSum<M> ms = xent::maxsum_init<M>();
    M sx = 0;
    row_partial(x, C, threadIdx.x, blockDim.x, ms, sx);
    block_combine(ms, sx);
    if (threadIdx.x == 0) write_row(x, r, C, target, ignore_index, eps, ms, sx, loss, lse);
  }
}

// This thread's share of one row's gradient (the group of nlanes threads covers the row).
template <class T>
__device__ __forceinline__ void row_backward(T* d, const T* x, int64_t C, int lane, int nlanes, int kind, int64_t t,
                                             opmath_t<T> l, opmath_t<T> g, opmath_t<T> q, opmath_t<T> q_target) {
  using M = opmath_t<T>;
  using P = Pack<T>;
  if (kind == xent::kIgnored) {
    for (int64_t i = lane; i < C; i += nlanes) d[i] = store_m<T>(M(0));
    return;
  }
  const int64_t head = head_of<T>(x, d, C);
  for (int64_t i = lane; i < head; i += nlanes)
    d[i] = store_m<T>(xent::grad_elem(load_m(x[i]), l, i == t ? q_target : q, g));
  const int64_t packs = (C - head) / P::kN;
  const P* xp = reinterpret_cast<const P*>(x + head);
  P* dp = reinterpret_cast<P*>(d + head);
  for (int64_t k = lane; k < packs; k += nlanes) {
    const P p = xp[k];
    P o;
    const int64_t base = head + k * P::kN;
#pragma unroll
    for (int e = 0; e < P::kN; ++e)
      o.v[e] = store_m<T>(xent::grad_elem(load_m(p.v[e]), l, base + e == t ? q_target : q, g));
    dp[k] = o;
  }
  for (int64_t i = head + packs * P::kN + lane; i < C; i += nlanes)
    d[i] = store_m<T>(xent::grad_elem(load_m(x[i]), l, i == t ? q_target : q, g));
}

// Backward; rows_per_block = blockDim.x / 32 with a warp per row, or 1 with the block per row.
template <class T, class I>
__global__ void xent_backward_kernel(T* __restrict__ dx, const opmath_t<T>* __restrict__ grad, int64_t grad_stride,
                                     const T* __restrict__ logits, const opmath_t<T>* __restrict__ lse,
                                     const I* __restrict__ target, int64_t R, int64_t C, int64_t ignore_index,
                                     opmath_t<T> eps, bool warp_per_row) {
  using M = opmath_t<T>;
  const int64_t rows_per_block = warp_per_row ? blockDim.x / kWarp : 1;
  const int lane = warp_per_row ? threadIdx.x % kWarp : threadIdx.x;
  const int nlanes = warp_per_row ? kWarp : blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * rows_per_block + (warp_per_row ? threadIdx.x / kWarp : 0);
  const M q = xent::q_other(eps, C);
  for (int64_t r = first; r < R; r += static_cast<int64_t>(gridDim.x) * rows_per_block) {
    const int64_t t = static_cast<int64_t>(target[r]);
    const int kind = xent::target_kind(t, C, ignore_index);
    const M g = kind == xent::kClass ? grad[r * grad_stride] : M(NAN);
    row_backward(dx + r * C, logits + r * C, C, lane, nlanes, kind, t, lse[r], g, q, q + (M(1) - eps));
  }
}

unsigned blocks_for_rows(int64_t R, bool warp_per_row) {
  const int64_t rows_per_block = warp_per_row ? kThreads / kWarp : 1;
  const int64_t blocks = (R + rows_per_block - 1) / rows_per_block;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(blocks, 1 << 20)));
}

}  // namespace

void cross_entropy_forward(const Tensor& loss, const Tensor& lse, const Tensor& logits, const Tensor& target,
                           int64_t ignore_index, double label_smoothing) {
  const int64_t R = logits.size(0), C = logits.size(1);
  DeviceGuard guard(logits);
  const bool warp_per_row = C <= kWarpRowMaxC;
  const unsigned blocks = blocks_for_rows(R, warp_per_row);
  xent::dispatch_logits_targets(logits, target, "cross_entropy", [&](auto tag, auto itag) {
    using T = typename decltype(tag)::type;
    using M = opmath_t<T>;
    using I = typename decltype(itag)::type;
    const T* x = static_cast<const T*>(logits.data_ptr());
    const I* t = static_cast<const I*>(target.data_ptr());
    M* lp = static_cast<M*>(loss.data_ptr());
    M* sp = static_cast<M*>(lse.data_ptr());
    const M eps = static_cast<M>(label_smoothing);
    if (warp_per_row) {
      xent_forward_warp_kernel<T, I>
          <<<blocks, kThreads, 0, stream_for(logits)>>>(x, t, lp, sp, R, C, ignore_index, eps);
      KILN_CUDA_CHECK_LAUNCH("xent_forward_warp_kernel");
    } else {
      xent_forward_block_kernel<T, I>
          <<<blocks, kThreads, 0, stream_for(logits)>>>(x, t, lp, sp, R, C, ignore_index, eps);
      KILN_CUDA_CHECK_LAUNCH("xent_forward_block_kernel");
    }
  });
}
KILN_REGISTER_KERNEL(kernels::backend::cross_entropy_forward, CUDA, cross_entropy_forward);

void cross_entropy_backward(const Tensor& dx, const Tensor& grad, const Tensor& logits, const Tensor& lse,
                            const Tensor& target, int64_t ignore_index, double label_smoothing) {
  const int64_t R = logits.size(0), C = logits.size(1);
  DeviceGuard guard(logits);
  const bool warp_per_row = C <= kWarpRowMaxC;
  const unsigned blocks = blocks_for_rows(R, warp_per_row);
  const int64_t grad_stride = grad.numel() == 1 ? 0 : 1;
  xent::dispatch_logits_targets(logits, target, "cross_entropy_backward", [&](auto tag, auto itag) {
    using T = typename decltype(tag)::type;
    using M = opmath_t<T>;
    using I = typename decltype(itag)::type;
    xent_backward_kernel<T, I><<<blocks, kThreads, 0, stream_for(logits)>>>(
        static_cast<T*>(dx.data_ptr()), static_cast<const M*>(grad.data_ptr()), grad_stride,
        static_cast<const T*>(logits.data_ptr()), static_cast<const M*>(lse.data_ptr()),
        static_cast<const I*>(target.data_ptr()), R, C, ignore_index, static_cast<M>(label_smoothing), warp_per_row);
    KILN_CUDA_CHECK_LAUNCH("xent_backward_kernel");
  });
}
KILN_REGISTER_KERNEL(kernels::backend::cross_entropy_backward, CUDA, cross_entropy_backward);

}  // namespace kiln::kernels::cuda
