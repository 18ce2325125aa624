// CUDA indexing kernels: index_select, index_add, gather, scatter_add, index_min_max (contract:
// kiln/kernels/indexing.h; the CPU version is kernels/cpu/indexing.cpp).
//
// All four ops walk the same iteration space as the CPU: positions p of the index-shaped space,
// split into K positions along `dim` and "columns" (every combination of the other coordinates;
// size-1 dimensions dropped, neighbours contiguous for all operands merged). At p three operands
// are touched: "self" (the tensor the index points into: its coordinate along dim is index[p]),
// the index, and "other" (the gathered output or the scattered source, at p itself). Linear
// positions run column-fastest, so consecutive threads walk the innermost column dimension
// (coalesced for contiguous operands: an embedding lookup copies whole rows).
//
// Gathers (index_select, gather): one thread per position, any order.
// Scatters (index_add, scatter_add) may hit one destination from several positions:
//   - by default with atomicAdd (f32, f64, f16/bf16 on sm_80+, int32, int64): fast, but the order
//     of the adds - and so the rounding of float sums - varies from run to run;
//   - with kiln::set_deterministic_algorithms(true) (and always for uint8, which has no atomic
//     add) with an ordered algorithm, bitwise reproducible and equal to the CPU result:
//       scatter_add: one thread per column walks dim in order (positions of different columns
//         never share a destination);
//       index_add (1-D index, the embedding backward): the index is sorted by destination with a
//         stable radix sort (CUB), then one thread per (run of equal destinations, column) adds
//         the run's source rows in their original order - parallel over destinations and columns
//         even when dim is long.
//
// Bounds: checked by the kernels themselves, without a host synchronisation (so an embedding
// can run inside a CUDA graph). An index outside [0, size) is skipped (a gather writes 0 there)
// and recorded in the device's error record; the kiln::Error naming the op, the index and the
// range is raised at the next synchronisation point (kiln/cuda/device_error.h,
// docs/kernels.md "Index bounds on the GPU"). index_min_max (one_hot's class count) still reads
// its result back: an explicit, reported synchronisation.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cub/device/device_radix_sort.cuh>
#include <limits>

#include "kiln/cuda/device_error.h"
#include "kiln/core/determinism.h"
#include "kiln/core/sync_debug.h"
#include "kiln/kernels/cuda/block_reduce.cuh"
#include "kiln/kernels/indexing.h"
#include "kiln/kernels/cuda/launch.cuh"

namespace kiln::kernels::cuda {

namespace {

// ---------------------------------------------------------------- iteration space

struct IndexSpace {
  int ndim = 0;  // column dimensions, outermost first
  int64_t sizes[kMaxDims] = {};
  int64_t stride[3][kMaxDims] = {};  // element strides of self, index, other per column dim
  int64_t columns = 1;
  int64_t K = 1;                   // positions along dim
  int64_t kstride[3] = {0, 0, 0};  // strides along dim (self's multiplies the index value)
};

// sizes: the iteration shape; st[k]: element strides of self, index, other over it.
IndexSpace make_space(const IntList& sizes, int64_t dim, const IntList (&st)[3], const char* op) {
  IndexSpace s;
  const int64_t nd = static_cast<int64_t>(sizes.size());
  KILN_CHECK(nd <= kMaxDims, op, ": tensors with more than ", kMaxDims, " dimensions are not supported");
  if (nd == 0) return s;  // one position
  s.K = sizes[dim];
  for (int k = 0; k < 3; ++k) s.kstride[k] = st[k][dim];
  for (int64_t d = 0; d < nd; ++d) {
    if (d == dim || sizes[d] == 1) continue;
    if (s.ndim > 0) {  // merge into the previous column dim when contiguous with it for all three
      bool merge = true;
      for (int k = 0; k < 3; ++k) merge = merge && s.stride[k][s.ndim - 1] == st[k][d] * sizes[d];
      if (merge) {
        s.sizes[s.ndim - 1] *= sizes[d];
        for (int k = 0; k < 3; ++k) s.stride[k][s.ndim - 1] = st[k][d];
        continue;
      }
    }
    s.sizes[s.ndim] = sizes[d];
    for (int k = 0; k < 3; ++k) s.stride[k][s.ndim] = st[k][d];
    ++s.ndim;
  }
  for (int d = 0; d < s.ndim; ++d) s.columns *= s.sizes[d];
  return s;
}

// Element offsets of self, index and other at column c (position 0 along dim).
__device__ __forceinline__ void column_offsets(const IndexSpace& s, int64_t c, int64_t (&off)[3]) {
  off[0] = off[1] = off[2] = 0;
  for (int d = s.ndim - 1; d >= 0; --d) {
    const int64_t x = c % s.sizes[d];
    c /= s.sizes[d];
#pragma unroll
    for (int k = 0; k < 3; ++k) off[k] += x * s.stride[k][d];
  }
}

// Element strides of a 1-D (or 0-D) index spread over `ndim` dims (0 everywhere but dim).
IntList spread_index_strides(const Tensor& index, int64_t ndim, int64_t dim) {
  IntList st(ndim, 0);
  if (index.dim() == 1) st[dim] = index.stride(0);
  return st;
}

// ---------------------------------------------------------------- bounds

// Where a kernel reports an index outside [0, bound) along dimension `dim`.
struct Bounds {
  int64_t bound;
  int64_t dim;
  int32_t site;  // kiln::cuda::internal::error_site of the op
  kiln::cuda::internal::DeviceErrorRecord* record;
};

Bounds bounds_for(const Tensor& t, int64_t bound, int64_t dim, const char* op) {
  return Bounds{bound, dim, kiln::cuda::internal::error_site(op),
                kiln::cuda::internal::device_error_record(t.device().index)};
}

// True when idx is in range; otherwise records it (the first error of the device wins).
__device__ __forceinline__ bool in_bounds(const Bounds& b, int64_t idx) {
  if (idx >= 0 && idx < b.bound) return true;
  if (atomicCAS(&b.record->flag, 0, 1) == 0) {
    b.record->site = b.site;
    b.record->value = idx;
    b.record->bound = b.bound;
    b.record->dim = b.dim;
  }
  return false;
}

// ---------------------------------------------------------------- kernels

// f(idx, self_at, other_at) for every position (column c, k along dim) of the space, one thread
// each: idx is the index value there, self_at self's offset at the column (idx not yet applied
// along dim), other_at other's offset at the position.
template <class I, class F>
__device__ __forceinline__ void for_each_position(const IndexSpace& s, const I* index, F f) {
  const int64_t total = s.columns * s.K;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const int64_t c = i % s.columns, k = i / s.columns;
    int64_t off[3];
    column_offsets(s, c, off);
    const int64_t idx = static_cast<int64_t>(index[off[1] + k * s.kstride[1]]);
    f(idx, off[0], off[2] + k * s.kstride[2]);
  }
}

// other[p] = self[p with p[dim] = index[p]] (T: a storage type of the element's size; 0 bits for
// an out-of-range index).
template <class T, class I>
__global__ void gather_kernel(IndexSpace s, const T* self, const I* index, T* other, Bounds b) {
  for_each_position(s, index, [&](int64_t idx, int64_t self_at, int64_t other_at) {
    other[other_at] = in_bounds(b, idx) ? self[self_at + idx * s.kstride[0]] : T(0);
  });
}

__device__ __forceinline__ void atomic_add(float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(double* p, double v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(Half* p, Half v) {
  atomicAdd(reinterpret_cast<__half*>(p), __ushort_as_half(v.bits));
}
__device__ __forceinline__ void atomic_add(BFloat16* p, BFloat16 v) {
  atomicAdd(reinterpret_cast<__nv_bfloat16*>(p), __ushort_as_bfloat16(v.bits));
}
__device__ __forceinline__ void atomic_add(int32_t* p, int32_t v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(int64_t* p, int64_t v) {  // two's complement: unsigned add is the same
  atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
}

template <class T> constexpr bool kHasAtomicAdd = !std::is_same_v<T, uint8_t>;

// self[p with p[dim] = index[p]] += other[p], one thread per position, atomic adds.
template <class T, class I>
__global__ void scatter_add_atomic_kernel(IndexSpace s, T* self, const I* index, const T* other, Bounds b) {
  for_each_position(s, index, [&](int64_t idx, int64_t self_at, int64_t other_at) {
    if (in_bounds(b, idx)) atomic_add(self + self_at + idx * s.kstride[0], other[other_at]);
  });
}

// Deterministic scatter_add: one thread per column adds the K positions in order (the CPU's
// order and rounding: the destination is rounded to T after every add).
template <class T, class I>
__global__ void scatter_add_ordered_kernel(IndexSpace s, T* self, const I* index, const T* other, Bounds b) {
  using M = opmath_t<T>;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < s.columns; c += step) {
    int64_t off[3];
    column_offsets(s, c, off);
    for (int64_t k = 0; k < s.K; ++k) {
      const int64_t idx = static_cast<int64_t>(index[off[1] + k * s.kstride[1]]);
      if (!in_bounds(b, idx)) continue;
      T* d = self + off[0] + idx * s.kstride[0];
      *d = static_cast<T>(static_cast<M>(*d) + static_cast<M>(other[off[2] + k * s.kstride[2]]));
    }
  }
}

// Sort input for the deterministic index_add: key = destination row, value = position along dim.
// An out-of-range index gets key b.bound, which index_add_sorted_kernel skips.
template <class I>
__global__ void index_keys_kernel(const I* index, int64_t istride, int64_t K, uint64_t* keys, int64_t* pos, Bounds b) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < K; k += step) {
    const int64_t idx = static_cast<int64_t>(index[k * istride]);
    keys[k] = static_cast<uint64_t>(in_bounds(b, idx) ? idx : b.bound);
    pos[k] = k;
  }
}

// Deterministic index_add over the sorted index: the thread of (j, column) where j starts a run
// of equal keys adds the run's source elements, in their original order, into the destination.
template <class T>
__global__ void index_add_sorted_kernel(IndexSpace s, T* self, const uint64_t* keys, const int64_t* pos, const T* other,
                                        uint64_t bound) {
  using M = opmath_t<T>;
  const int64_t total = s.columns * s.K;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const int64_t c = i % s.columns, j = i / s.columns;
    const uint64_t key = keys[j];
    if (key >= bound || (j > 0 && keys[j - 1] == key)) continue;  // out of range, or not a run's start
    int64_t off[3];
    column_offsets(s, c, off);
    T* d = self + off[0] + static_cast<int64_t>(key) * s.kstride[0];
    T acc = *d;
    for (int64_t r = j; r < s.K && keys[r] == key; ++r)
      acc = static_cast<T>(static_cast<M>(acc) + static_cast<M>(other[off[2] + pos[r] * s.kstride[2]]));
    *d = acc;
  }
}

// ---- index_min_max: per-block (min, max) partials, then one block combines them.
struct IndexShape {
  int ndim;
  int64_t sizes[kMaxDims];
  int64_t strides[kMaxDims];
};

template <class I> __global__ void min_max_partial_kernel(IndexShape sh, int64_t n, const I* index, int64_t* partial) {
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    int64_t off = 0, rem = i;
    for (int d = sh.ndim - 1; d >= 0; --d) {
      off += (rem % sh.sizes[d]) * sh.strides[d];
      rem /= sh.sizes[d];
    }
    const int64_t v = static_cast<int64_t>(index[off]);
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  }
  lo = block_reduce(lo, MinOp(), std::numeric_limits<int64_t>::max());
  hi = block_reduce(hi, MaxOp(), std::numeric_limits<int64_t>::min());
  if (threadIdx.x == 0) {
    partial[2 * blockIdx.x] = lo;
    partial[2 * blockIdx.x + 1] = hi;
  }
}

__global__ void min_max_final_kernel(const int64_t* partial, int nblocks, int64_t* out) {
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
  for (int b = threadIdx.x; b < nblocks; b += blockDim.x) {
    lo = partial[2 * b] < lo ? partial[2 * b] : lo;
    hi = partial[2 * b + 1] > hi ? partial[2 * b + 1] : hi;
  }
  lo = block_reduce(lo, MinOp(), std::numeric_limits<int64_t>::max());
  hi = block_reduce(hi, MaxOp(), std::numeric_limits<int64_t>::min());
  if (threadIdx.x == 0) {
    out[0] = lo;
    out[1] = hi;
  }
}

// ---------------------------------------------------------------- host side

void run_gather(const IndexSpace& s, const Tensor& self, const Tensor& index, const Tensor& other, const Bounds& b,
                const char* op) {
  const int64_t total = s.columns * s.K;
  if (total == 0) return;
  DeviceGuard g(other);
  cudaStream_t stream = stream_for(other);
  dispatch_by_size(self.dtype(), [&](auto vtag) {
    using T = typename decltype(vtag)::type;
    dispatch_index(index.dtype(), op, [&](auto itag) {
      using I = typename decltype(itag)::type;
      gather_kernel<T, I><<<grid_for(total), kThreads, 0, stream>>>(s, static_cast<const T*>(self.data_ptr()),
                                                                    static_cast<const I*>(index.data_ptr()),
                                                                    static_cast<T*>(other.data_ptr()), b);
      KILN_CUDA_CHECK_LAUNCH("gather_kernel");
    });
  });
}

// scatter_add / index_add with a full-rank index (or the atomic path of index_add).
void run_scatter_add(const IndexSpace& s, const Tensor& self, const Tensor& index, const Tensor& other, const Bounds& b,
                     const char* op) {
  const int64_t total = s.columns * s.K;
  if (total == 0) return;
  DeviceGuard g(self);
  cudaStream_t stream = stream_for(self);
  dispatch_numeric(self.dtype(), op, [&](auto vtag) {
    using T = typename decltype(vtag)::type;
    dispatch_index(index.dtype(), op, [&](auto itag) {
      using I = typename decltype(itag)::type;
      T* sp = static_cast<T*>(self.data_ptr());
      const I* ip = static_cast<const I*>(index.data_ptr());
      const T* op_ = static_cast<const T*>(other.data_ptr());
      if constexpr (kHasAtomicAdd<T>) {
        if (!deterministic_algorithms()) {
          scatter_add_atomic_kernel<T, I><<<grid_for(total), kThreads, 0, stream>>>(s, sp, ip, op_, b);
          KILN_CUDA_CHECK_LAUNCH("scatter_add_atomic_kernel");
          return;
        }
      }
      scatter_add_ordered_kernel<T, I><<<grid_for(s.columns), kThreads, 0, stream>>>(s, sp, ip, op_, b);
      KILN_CUDA_CHECK_LAUNCH("scatter_add_ordered_kernel");
    });
  });
}

// Deterministic index_add (1-D index of K entries): stable sort by destination, keys in
// [0, b.bound] (b.bound: out of range).
void run_index_add_sorted(const IndexSpace& s, const Tensor& self, const Tensor& index, const Tensor& src,
                          const Bounds& b, const char* op) {
  const int64_t K = s.K;
  if (K == 0 || s.columns == 0) return;
  KILN_CHECK(K < (int64_t{1} << 31), op, ": deterministic index_add supports at most 2^31 - 1 indices, got ", K);
  DeviceGuard g(self);
  cudaStream_t stream = stream_for(self);
  const Device dev = self.device();
  auto buffer = [&](int64_t n, DType dt) { return empty({n}, TensorOptions().dtype(dt).device(dev)); };
  Tensor keys_in = buffer(K, DType::I64), keys_out = buffer(K, DType::I64);
  Tensor pos_in = buffer(K, DType::I64), pos_out = buffer(K, DType::I64);
  auto* kin = reinterpret_cast<uint64_t*>(keys_in.data_ptr());
  auto* kout = reinterpret_cast<uint64_t*>(keys_out.data_ptr());
  auto* pin = pos_in.data_ptr<int64_t>();
  auto* pout = pos_out.data_ptr<int64_t>();
  const int64_t istride = index.dim() == 1 ? index.stride(0) : 0;
  dispatch_index(index.dtype(), op, [&](auto itag) {
    using I = typename decltype(itag)::type;
    index_keys_kernel<I>
        <<<grid_for(K), kThreads, 0, stream>>>(static_cast<const I*>(index.data_ptr()), istride, K, kin, pin, b);
    KILN_CUDA_CHECK_LAUNCH("index_keys_kernel");
  });
  // Only the bits that can be set in [0, bound] take part in the sort.
  int end_bit = 1;
  while (end_bit < 64 && (static_cast<uint64_t>(b.bound) >> end_bit) != 0) ++end_bit;
  const int n = static_cast<int>(K);
  size_t temp_bytes = 0;
  KILN_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, kin, kout, pin, pout, n, 0, end_bit, stream));
  Tensor temp = buffer(static_cast<int64_t>(std::max<size_t>(temp_bytes, 1)), DType::U8);
  KILN_CUDA_CHECK(
      cub::DeviceRadixSort::SortPairs(temp.data_ptr(), temp_bytes, kin, kout, pin, pout, n, 0, end_bit, stream));
  dispatch_numeric(self.dtype(), op, [&](auto vtag) {
    using T = typename decltype(vtag)::type;
    index_add_sorted_kernel<T><<<grid_for(s.columns * K), kThreads, 0, stream>>>(
        s, static_cast<T*>(self.data_ptr()), kout, pout, static_cast<const T*>(src.data_ptr()),
        static_cast<uint64_t>(b.bound));
    KILN_CUDA_CHECK_LAUNCH("index_add_sorted_kernel");
  });
}

}  // namespace

std::pair<int64_t, int64_t> index_min_max(const Tensor& index, const char* op) {
  const int64_t n = index.numel();
  KILN_CHECK(n > 0, op, ": index_min_max needs a non-empty index");
  KILN_CHECK(index.dim() <= kMaxDims, op, ": index with more than ", kMaxDims, " dimensions");
  IndexShape sh{};
  sh.ndim = static_cast<int>(index.dim());
  for (int d = 0; d < sh.ndim; ++d) {
    sh.sizes[d] = index.size(d);
    sh.strides[d] = index.stride(d);
  }
  DeviceGuard g(index);
  cudaStream_t stream = stream_for(index);
  const int nblocks = static_cast<int>(std::min<int64_t>(256, (n + kThreads - 1) / kThreads));
  Tensor partial = empty({2 * nblocks + 2}, TensorOptions().dtype(DType::I64).device(index.device()));
  int64_t* pp = partial.data_ptr<int64_t>();
  dispatch_index(index.dtype(), op, [&](auto itag) {
    using I = typename decltype(itag)::type;
    min_max_partial_kernel<I><<<nblocks, kThreads, 0, stream>>>(sh, n, static_cast<const I*>(index.data_ptr()), pp);
    KILN_CUDA_CHECK_LAUNCH("min_max_partial_kernel");
  });
  min_max_final_kernel<<<1, kThreads, 0, stream>>>(pp, nblocks, pp + 2 * nblocks);
  KILN_CUDA_CHECK_LAUNCH("min_max_final_kernel");
  int64_t host[2] = {0, 0};
  kiln::cuda::internal::report_sync(::kiln::detail::concat(op, ": index_min_max reads the index range back"));
  KILN_CUDA_CHECK(cudaMemcpyAsync(host, pp + 2 * nblocks, sizeof(host), cudaMemcpyDeviceToHost, stream));
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
  return {host[0], host[1]};
}
KILN_REGISTER_KERNEL(kernels::backend::index_min_max, CUDA, index_min_max);

void index_select(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index, const char* op) {
  if (out.numel() == 0 || index.numel() == 0) return;
  const IntList st[3] = {in.strides(), spread_index_strides(index, out.dim(), dim), out.strides()};
  run_gather(make_space(out.sizes(), dim, st, op), in, index, out, bounds_for(in, in.size(dim), dim, op), op);
}
KILN_REGISTER_KERNEL(kernels::backend::index_select, CUDA, index_select);

void index_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, const char* op) {
  if (src.numel() == 0 || index.numel() == 0) return;
  const IntList st[3] = {out.strides(), spread_index_strides(index, src.dim(), dim), src.strides()};
  const IndexSpace s = make_space(src.sizes(), dim, st, op);
  const Bounds b = bounds_for(out, out.size(dim), dim, op);
  if (deterministic_algorithms() || out.dtype() == DType::U8) return run_index_add_sorted(s, out, index, src, b, op);
  run_scatter_add(s, out, index, src, b, op);
}
KILN_REGISTER_KERNEL(kernels::backend::index_add, CUDA, index_add);

void gather(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index, const char* op) {
  if (out.numel() == 0 || index.numel() == 0) return;
  const IntList st[3] = {in.strides(), index.strides(), out.strides()};
  const Bounds b = bounds_for(in, in.dim() == 0 ? 1 : in.size(dim), dim, op);
  run_gather(make_space(index.sizes(), dim, st, op), in, index, out, b, op);
}
KILN_REGISTER_KERNEL(kernels::backend::gather, CUDA, gather);

void scatter_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, const char* op) {
  if (index.numel() == 0) return;
  // The source is read over the index's shape with the source's strides.
  const IntList st[3] = {out.strides(), index.strides(), src.dim() == 0 ? IntList{} : src.strides()};
  const Bounds b = bounds_for(out, out.dim() == 0 ? 1 : out.size(dim), dim, op);
  run_scatter_add(make_space(index.sizes(), dim, st, op), out, index, src, b, op);
}
KILN_REGISTER_KERNEL(kernels::backend::scatter_add, CUDA, scatter_add);

}  // namespace kiln::kernels::cuda
