#pragma once
// Launch helpers for the CUDA backend: the current stream, grid sizes, and the pointwise
// launcher over a PointwiseIter (the same iteration space the CPU backend uses).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kiln/cuda/cuda.h"
#include "kiln/cuda/check.h"
#include "kiln/core/dtype.h"
#include "kiln/kernels/cuda/index_math.h"
#include "kiln/kernels/pointwise_iter.h"

namespace kiln::kernels::cuda {

inline cudaStream_t stream_for(const Tensor& t) {
  return static_cast<cudaStream_t>(kiln::cuda::current_stream(t.device().index).handle);
}

// Makes the tensor's device current for the launch (multi-GPU processes).
struct DeviceGuard : kiln::cuda::internal::DeviceGuard {
  explicit DeviceGuard(const Tensor& t) : kiln::cuda::internal::DeviceGuard(t.device().index) {}
};

constexpr int kThreads = 256;

// Enough blocks to fill the GPU several times over; the kernels are grid-stride loops.
inline unsigned grid_for(int64_t n, int64_t per_thread = 1) {
  int64_t blocks = (n / per_thread + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(blocks, 65535 * 8)));
}

// Byte offsets of element `linear` for every operand (outermost dimension first), in 64-bit
// arithmetic: the fallback for iteration spaces too large for OffsetCalc32.
template <int N> struct Offsets { int64_t v[N]; };

template <int N> __device__ __forceinline__ Offsets<N> offsets_of(const PointwiseIter& it, int64_t linear) {
  Offsets<N> o;
#pragma unroll
  for (int k = 0; k < N; ++k) o.v[k] = 0;
  for (int d = it.ndim - 1; d >= 0; --d) {
    int64_t i = linear % it.sizes[d];
    linear /= it.sizes[d];
#pragma unroll
    for (int k = 0; k < N; ++k) o.v[k] += i * it.strides[k][d];
  }
  return o;
}

// out = f(in...) for one element at byte offsets off. N = number of operands including the output
// (2: unary, 3: binary, 4: the ternary where, whose first input is the bool condition).
template <class In> struct Inputs {
  In x{}, y{};
  bool c = false;
};
template <class Out, class In, int N, class Off>
__device__ __forceinline__ Inputs<In> load_inputs(char* const* data, const Off* off) {
  Inputs<In> v;
  if constexpr (N == 4) {
    v.c = *reinterpret_cast<const bool*>(data[1] + off[1]);
    v.x = *reinterpret_cast<const In*>(data[2] + off[2]);
    v.y = *reinterpret_cast<const In*>(data[3] + off[3]);
  } else {
    v.x = *reinterpret_cast<const In*>(data[1] + off[1]);
    if constexpr (N == 3) v.y = *reinterpret_cast<const In*>(data[2] + off[2]);
  }
  return v;
}
template <class Out, class In, int N, class F> __device__ __forceinline__ Out apply(const F& f, const Inputs<In>& v) {
  using M = opmath_t<In>;
  if constexpr (N == 2) return static_cast<Out>(f(static_cast<M>(v.x)));
  else if constexpr (N == 3) return static_cast<Out>(f(static_cast<M>(v.x), static_cast<M>(v.y)));
  else return v.c ? v.x : v.y;
}

// The 64-bit strided kernel (grid-stride, one element per step). Flat iteration spaces skip the
// index arithmetic.
template <class Out, class In, int N, class F> __global__ void pointwise_kernel(PointwiseIter it, F f) {
  const int64_t n = it.numel;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const bool flat = it.ndim <= 1;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    int64_t off[N];
    if (flat) {
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] = it.ndim == 0 ? 0 : i * it.strides[k][0];
    } else {
      Offsets<N> o = offsets_of<N>(it, i);
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] = o.v[k];
    }
    *reinterpret_cast<Out*>(it.data[0] + off[0]) = apply<Out, In, N>(f, load_inputs<Out, In, N>(it.data, off));
  }
}

// Elements per thread of the 32-bit strided kernel.
constexpr int kStridedUnroll = 4;

template <int N> struct OperandPointers { char* v[N]; };

// The strided kernel for iteration spaces that fit 32-bit offsets (broadcasts, views, transposes,
// unaligned contiguous operands): each thread takes kStridedUnroll elements a block apart, works
// out all their offsets with FastDivmod and issues all their loads before any math, so several
// loads are in flight per thread.
template <class Out, class In, int N, class F>
__global__ void __launch_bounds__(kThreads)
    strided_kernel(OffsetCalc32<N> calc, OperandPointers<N> p, uint32_t n, F f) {
  constexpr int U = kStridedUnroll;
  const uint32_t base = blockIdx.x * (kThreads * U) + threadIdx.x;
  uint32_t off[U][N];
  Inputs<In> in[U];
#pragma unroll
  for (int j = 0; j < U; ++j) {
    const uint32_t i = base + j * kThreads;
    if (i < n) {
      calc.get(i, off[j]);
      in[j] = load_inputs<Out, In, N>(p.v, off[j]);
    }
  }
#pragma unroll
  for (int j = 0; j < U; ++j)
    if (base + j * kThreads < n) *reinterpret_cast<Out*>(p.v[0] + off[j][0]) = apply<Out, In, N>(f, in[j]);
}

// Contiguous unary fast path: 16-byte vector loads and stores when both pointers are aligned
// (a vectorized grid-stride loop).
template <class T, class F>
__global__ void unary_vec_kernel(T* __restrict__ out, const T* __restrict__ in, int64_t n, F f) {
  using M = opmath_t<T>;
  constexpr int V = 16 / sizeof(T);
  struct alignas(16) Pack {
    T v[V];
  };
  const int64_t packs = n / V;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < packs; p += stride) {
    Pack x = reinterpret_cast<const Pack*>(in)[p];
    Pack y;
#pragma unroll
    for (int j = 0; j < V; ++j) y.v[j] = static_cast<T>(f(static_cast<M>(x.v[j])));
    reinterpret_cast<Pack*>(out)[p] = y;
  }
  for (int64_t i = packs * V + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = static_cast<T>(f(static_cast<M>(in[i])));
}

// Elements per pack of the contiguous vector path: 16 bytes of the wider of In and Out.
template <class Out, class In> constexpr int vec_width() {
  return 16 / static_cast<int>(sizeof(In) > sizeof(Out) ? sizeof(In) : sizeof(Out));
}

// Contiguous fast path for binary ops (Ins = 2) and casts (Ins = 1, Out != In): V elements per
// thread and step through vector loads and stores, V = 16 bytes / the wider of In and Out (a cast
// to a narrower type stores narrower packs). No __restrict__: out may be an input (in place).
template <class Out, class In, int Ins, class F>
__global__ void contiguous_vec_kernel(Out* out, const In* a, const In* b, int64_t n, F f) {
  using M = opmath_t<In>;
  constexpr int V = vec_width<Out, In>();
  struct alignas(V * sizeof(In)) InPack {
    In v[V];
  };
  struct alignas(V * sizeof(Out)) OutPack {
    Out v[V];
  };
  auto one = [&](In x, In y) {
    if constexpr (Ins == 1) return static_cast<Out>(f(static_cast<M>(x)));
    else return static_cast<Out>(f(static_cast<M>(x), static_cast<M>(y)));
  };
  const int64_t packs = n / V;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < packs; p += stride) {
    const InPack x = reinterpret_cast<const InPack*>(a)[p];
    const InPack y = Ins == 2 ? reinterpret_cast<const InPack*>(b)[p] : x;
    OutPack o;
#pragma unroll
    for (int j = 0; j < V; ++j) o.v[j] = one(x.v[j], y.v[j]);
    reinterpret_cast<OutPack*>(out)[p] = o;
  }
  for (int64_t i = packs * V + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = one(a[i], Ins == 2 ? b[i] : a[i]);
}

// Whether the contiguous vector path takes these operands: flat and contiguous, every pointer
// aligned to its pack (V elements of its type).
template <class Out, class In> bool vec_path_applies(const PointwiseIter& it) {
  constexpr size_t V = vec_width<Out, In>();
  if (!it.is_flat_contiguous()) return false;
  if (reinterpret_cast<uintptr_t>(it.data[0]) % (V * sizeof(Out)) != 0) return false;
  for (int k = 1; k < it.noperands; ++k)
    if (reinterpret_cast<uintptr_t>(it.data[k]) % (V * sizeof(In)) != 0) return false;
  return true;
}

template <class Out, class In, int N, class F> void launch_pointwise(const PointwiseIter& it, const Tensor& out, F f) {
  if (it.numel == 0) return;
  DeviceGuard g(out);
  if constexpr (N == 2 && std::is_same_v<Out, In>) {
    const bool aligned =
        (reinterpret_cast<uintptr_t>(it.data[0]) % 16 == 0) && (reinterpret_cast<uintptr_t>(it.data[1]) % 16 == 0);
    if (it.is_flat_contiguous() && aligned) {
      unary_vec_kernel<Out><<<grid_for(it.numel, 16 / sizeof(Out)), kThreads, 0, stream_for(out)>>>(
          reinterpret_cast<Out*>(it.data[0]), reinterpret_cast<const In*>(it.data[1]), it.numel, f);
      KILN_CUDA_CHECK_LAUNCH("unary_vec_kernel");
      return;
    }
  }
  // binary ops and casts between non-bool types (comparisons and predicates write bool)
  constexpr bool kVecBinary = N == 3 && std::is_same_v<Out, In>;
  constexpr bool kVecCast =
      N == 2 && !std::is_same_v<Out, In> && !std::is_same_v<Out, bool> && !std::is_same_v<In, bool>;
  if constexpr (kVecBinary || kVecCast) {
    if (vec_path_applies<Out, In>(it)) {
      constexpr int V = vec_width<Out, In>();
      const In* b = kVecBinary ? reinterpret_cast<const In*>(it.data[2]) : nullptr;
      contiguous_vec_kernel<Out, In, kVecBinary ? 2 : 1><<<grid_for(it.numel, V), kThreads, 0, stream_for(out)>>>(
          reinterpret_cast<Out*>(it.data[0]), reinterpret_cast<const In*>(it.data[1]), b, it.numel, f);
      KILN_CUDA_CHECK_LAUNCH("contiguous_vec_kernel");
      return;
    }
  }
  if (fits_32bit_indexing(it)) {
    OperandPointers<N> p;
    for (int k = 0; k < N; ++k) p.v[k] = it.data[k];
    const auto n = static_cast<uint32_t>(it.numel);
    const unsigned blocks = (n + kThreads * kStridedUnroll - 1) / (kThreads * kStridedUnroll);
    strided_kernel<Out, In, N><<<blocks, kThreads, 0, stream_for(out)>>>(OffsetCalc32<N>(it), p, n, f);
    KILN_CUDA_CHECK_LAUNCH("strided_kernel");
    return;
  }
  pointwise_kernel<Out, In, N><<<grid_for(it.numel), kThreads, 0, stream_for(out)>>>(it, f);
  KILN_CUDA_CHECK_LAUNCH("pointwise_kernel");
}

}  // namespace kiln::kernels::cuda
