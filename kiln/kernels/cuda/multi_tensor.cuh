#pragma once
// Multi-tensor apply for the CUDA backend (the design of apex's multi_tensor_apply, written for
// kiln): one launch processes many tensors, with every tensor cut into chunks of kChunk elements
// and one block per chunk.
//
// The launch's metadata - the tensors' data pointers, element counts and the chunk -> tensor map -
// travels in the kernel's argument struct (at most 4 KB of parameters), so nothing is copied to
// the device before the launch and the launch can be captured in a CUDA graph. The chunk -> tensor
// map is a prefix array: tensor t owns chunks [chunk_start[t], chunk_start[t + 1]), and a block finds
// its tensor by binary search (a few uniform reads from the parameter bank). When a list has more
// tensors than one argument struct holds, the launcher splits it into several launches; tensors of
// one launch share a dtype (the kernel is instantiated per storage type).
//
// Inside a chunk each thread handles kVec consecutive elements per iteration, with vector loads
// and stores when every pointer of the tensor is aligned to kVec elements (the usual case: the
// caching allocator hands out 512-byte aligned blocks and chunk starts are multiples of kVec), and
// one element at a time otherwise.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/dtype.h"
#include "kiln/core/tensor.h"
#include "kiln/kernels/cuda/launch.cuh"

namespace kiln::kernels::cuda::mt {

constexpr int64_t kChunk = 16384;  // elements per chunk (= per block)
constexpr int kBlock = 512;        // threads per block
constexpr int kVec = 4;            // consecutive elements per thread and iteration
constexpr size_t kMaxParamBytes = 4000;  // kernel parameters are limited to 4 KB

inline int64_t chunks_of(int64_t numel) { return (numel + kChunk - 1) / kChunk; }

// The chunks of one launch (see above).
template <int MaxT>
struct ChunkMap {
  int32_t ntensors;
  int32_t chunk_start[MaxT + 1];
  int64_t numel[MaxT];
};

// The tensor that owns chunk c: the last t with chunk_start[t] <= c. Every tensor of a launch has
// at least one chunk, so the starts increase strictly.
template <int MaxT>
__device__ __forceinline__ int tensor_of(const ChunkMap<MaxT>& m, int c) {
  int lo = 0, hi = m.ntensors - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (m.chunk_start[mid] <= c) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// Element range [begin, end) of this block's chunk within tensor t.
template <int MaxT>
__device__ __forceinline__ void chunk_range(const ChunkMap<MaxT>& m, int t, int64_t& begin, int64_t& end) {
  begin = static_cast<int64_t>(static_cast<int>(blockIdx.x) - m.chunk_start[t]) * kChunk;
  end = min(m.numel[t], begin + kChunk);
}

template <class T>
struct alignas(sizeof(T) * kVec) VecOf {
  T v[kVec];
};

template <class T>
__device__ __forceinline__ bool vec_aligned(const T* p) {
  return p == nullptr || reinterpret_cast<uintptr_t>(p) % (sizeof(T) * kVec) == 0;
}

// N consecutive elements from p into registers (N == kVec: one vector load; p must be aligned).
template <int N, class T>
__device__ __forceinline__ void load_n(const T* p, T (&r)[N]) {
  if constexpr (N == kVec) {
    const VecOf<T> x = *reinterpret_cast<const VecOf<T>*>(p);
#pragma unroll
    for (int j = 0; j < N; ++j) r[j] = x.v[j];
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) r[j] = p[j];
  }
}

template <int N, class T>
__device__ __forceinline__ void store_n(T* p, const T (&r)[N]) {
  if constexpr (N == kVec) {
    VecOf<T> x;
#pragma unroll
    for (int j = 0; j < N; ++j) x.v[j] = r[j];
    *reinterpret_cast<VecOf<T>*>(p) = x;
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) p[j] = r[j];
  }
}

template <int N>
using RunLength = std::integral_constant<int, N>;

// Calls body(RunLength<N>{}, i) for runs of N consecutive elements starting at i that together
// cover [begin, end) once, spread over the block's threads: N == kVec (vector loads) when `vec`,
// except for the last partial run, N == 1 otherwise. begin must be a multiple of kVec.
template <class Body>
__device__ __forceinline__ void for_each_run(int64_t begin, int64_t end, bool vec, Body body) {
  if (vec) {
    const int64_t step = static_cast<int64_t>(blockDim.x) * kVec;
    for (int64_t i = begin + static_cast<int64_t>(threadIdx.x) * kVec; i < end; i += step) {
      if (i + kVec <= end) {
        body(RunLength<kVec>{}, i);
      } else {
        for (int64_t j = i; j < end; ++j) body(RunLength<1>{}, j);
      }
    }
  } else {
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) body(RunLength<1>{}, i);
  }
}

// State (and master-weight) type of a parameter storage type: double for f64, float otherwise.
template <class P> struct state_of { using type = float; };
template <> struct state_of<double> { using type = double; };
template <class P> using state_t = typename state_of<P>::type;

// ---------------------------------------------------------------- host side

// One tensor of a multi-tensor call: its element count (> 0), dtype, and position in the caller's lists.
struct Item {
  int64_t numel;
  DType dtype;
  int index;
};

// Items [begin, end) go into one launch whose first chunk has the global id chunk_base (ids run
// over all items of the call in order, for per-chunk scratch buffers).
struct Launch {
  size_t begin, end;
  int64_t chunk_base;
};

// Splits items into launches of at most max_tensors tensors of one dtype, in order.
inline std::vector<Launch> plan_launches(const std::vector<Item>& items, int max_tensors, int64_t* total_chunks = nullptr) {
  std::vector<Launch> out;
  int64_t chunk = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    if (out.empty() || items[i].dtype != items[out.back().begin].dtype ||
        out.back().end - out.back().begin >= static_cast<size_t>(max_tensors))
      out.push_back({i, i, chunk});
    out.back().end = i + 1;
    chunk += chunks_of(items[i].numel);
  }
  if (total_chunks) *total_chunks = chunk;
  return out;
}

// Fills the chunk map of one launch; returns its number of chunks (the grid size).
template <int MaxT>
int fill_map(ChunkMap<MaxT>& m, const std::vector<Item>& items, const Launch& l) {
  const int n = static_cast<int>(l.end - l.begin);
  KILN_CHECK(n >= 1 && n <= MaxT, "multi_tensor_apply: bad launch of ", n, " tensors");
  m.ntensors = n;
  int64_t c = 0;
  for (int k = 0; k < n; ++k) {
    m.chunk_start[k] = static_cast<int32_t>(c);
    m.numel[k] = items[l.begin + k].numel;
    c += chunks_of(m.numel[k]);
  }
  KILN_CHECK(c < (int64_t{1} << 31), "multi_tensor_apply: too many chunks in one launch (", c, ")");
  m.chunk_start[n] = static_cast<int32_t>(c);
  return static_cast<int>(c);
}

// A list launch's arguments: Depth pointers per tensor (e.g. dst and src for lerp).
constexpr int kListT = 110;  // tensors per list launch

template <int Depth>
struct ListMeta {
  ChunkMap<kListT> map;
  void* ptr[Depth][kListT];
  int64_t chunk_base;
};
static_assert(sizeof(ListMeta<2>) + 64 <= kMaxParamBytes, "ListMeta exceeds the kernel parameter limit");

// The arguments of launch l: pointer d of tensor k is lists[d][items[l.begin + k].index]. Sets the grid size.
template <int Depth>
ListMeta<Depth> list_meta(const std::vector<Item>& items, const Launch& l, const std::vector<Tensor>* const (&lists)[Depth],
                          int& grid) {
  ListMeta<Depth> a;
  grid = fill_map(a.map, items, l);
  a.chunk_base = l.chunk_base;
  for (size_t k = 0; k < l.end - l.begin; ++k)
    for (int d = 0; d < Depth; ++d) a.ptr[d][k] = (*lists[d])[items[l.begin + k].index].data_ptr();
  return a;
}

// Non-overlapping and dense: some permutation of the dimensions is contiguous, so the elements
// occupy numel consecutive slots from data_ptr().
inline bool is_dense(const Tensor& t) {
  if (t.is_contiguous()) return true;
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) != 1) dims.emplace_back(t.stride(d), t.size(d));
  std::sort(dims.begin(), dims.end());
  int64_t expected = 1;
  for (auto& [st, sz] : dims) {
    if (st != expected) return false;
    expected *= sz;
  }
  return true;
}

// Same sizes, and the same strides wherever the size is not 1 (the flat memory orders match).
inline bool same_layout(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes()) return false;
  for (int64_t d = 0; d < a.dim(); ++d)
    if (a.size(d) != 1 && a.stride(d) != b.stride(d)) return false;
  return true;
}

}  // namespace kiln::kernels::cuda::mt
