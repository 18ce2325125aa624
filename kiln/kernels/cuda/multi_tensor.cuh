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
//
// The second half is the generic optimizer step, multi_tensor_step<Rule>, which runs any update
// rule of kiln/optim/<name>.h (contract: kernels/multi_tensor.h); each optimizer's .cu instantiates
// it and registers it. Its non-template host side (checks, launch planning, the step increment)
// is StepLaunches in multi_tensor.cu.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/dtype.h"
#include "kiln/core/tensor.h"
#include "kiln/kernels/cuda/block_reduce.cuh"
#include "kiln/kernels/cuda/launch.cuh"
#include "kiln/kernels/multi_tensor.h"

namespace kiln::kernels::cuda::mt {

constexpr int64_t kChunk = 16384;        // elements per chunk (= per block)
constexpr int kBlock = 512;              // threads per block
constexpr int kVec = 4;                  // consecutive elements per thread and iteration
constexpr size_t kMaxParamBytes = 4000;  // kernel parameters are limited to 4 KB

inline int64_t chunks_of(int64_t numel) { return (numel + kChunk - 1) / kChunk; }

// The chunks of one launch (see above).
template <int MaxT> struct ChunkMap {
  int32_t ntensors;
  int32_t chunk_start[MaxT + 1];
  int64_t numel[MaxT];
};

// The tensor that owns chunk c: the last t with chunk_start[t] <= c. Every tensor of a launch has
// at least one chunk, so the starts increase strictly.
template <int MaxT> __device__ __forceinline__ int tensor_of(const ChunkMap<MaxT>& m, int c) {
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

template <class T> struct alignas(sizeof(T) * kVec) VecOf { T v[kVec]; };

template <class T> __device__ __forceinline__ bool vec_aligned(const T* p) {
  return p == nullptr || reinterpret_cast<uintptr_t>(p) % (sizeof(T) * kVec) == 0;
}

// N consecutive elements from p into registers (N == kVec: one vector load; p must be aligned).
template <int N, class T> __device__ __forceinline__ void load_n(const T* p, T (&r)[N]) {
  if constexpr (N == kVec) {
    const VecOf<T> x = *reinterpret_cast<const VecOf<T>*>(p);
#pragma unroll
    for (int j = 0; j < N; ++j) r[j] = x.v[j];
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) r[j] = p[j];
  }
}

template <int N, class T> __device__ __forceinline__ void store_n(T* p, const T (&r)[N]) {
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

template <int N> using RunLength = std::integral_constant<int, N>;

// Calls body(RunLength<N>{}, i) for runs of N consecutive elements starting at i that together
// cover [begin, end) once, spread over the block's threads: N == kVec (vector loads) when `vec`,
// except for the last partial run, N == 1 otherwise. begin must be a multiple of kVec.
template <class Body> __device__ __forceinline__ void for_each_run(int64_t begin, int64_t end, bool vec, Body body) {
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

// This block's chunk, where every chunk kernel starts: tensor t of the launch and the element
// range [begin, end) within it.
struct Chunk {
  int t;
  int64_t begin, end;
};
template <int MaxT> __device__ __forceinline__ Chunk block_chunk(const ChunkMap<MaxT>& m) {
  Chunk ch;
  ch.t = tensor_of(m, blockIdx.x);
  chunk_range(m, ch.t, ch.begin, ch.end);
  return ch;
}

// x[i] = f(x[i]) for i in [begin, end), in the runs of for_each_run (vector loads where x is aligned).
template <class P, class F> __device__ __forceinline__ void update_in_place(P* x, int64_t begin, int64_t end, F f) {
  for_each_run(begin, end, vec_aligned(x), [&](auto len, int64_t i) {
    constexpr int N = decltype(len)::value;
    P r[N];
    load_n<N>(x + i, r);
#pragma unroll
    for (int j = 0; j < N; ++j) r[j] = f(r[j]);
    store_n<N>(x + i, r);
  });
}

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
inline std::vector<Launch> plan_launches(const std::vector<Item>& items, int max_tensors,
                                         int64_t* total_chunks = nullptr) {
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
template <int MaxT> int fill_map(ChunkMap<MaxT>& m, const std::vector<Item>& items, const Launch& l) {
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

template <int Depth> struct ListMeta {
  ChunkMap<kListT> map;
  void* ptr[Depth][kListT];
  int64_t chunk_base;
};
static_assert(sizeof(ListMeta<2>) + 64 <= kMaxParamBytes, "ListMeta exceeds the kernel parameter limit");

// The arguments of launch l: pointer d of tensor k is lists[d][items[l.begin + k].index]. Sets the grid size.
template <int Depth>
ListMeta<Depth> list_meta(const std::vector<Item>& items, const Launch& l,
                          const std::vector<Tensor>* const (&lists)[Depth], int& grid) {
  ListMeta<Depth> a;
  grid = fill_map(a.map, items, l);
  a.chunk_base = l.chunk_base;
  for (size_t k = 0; k < l.end - l.begin; ++k)
    for (int d = 0; d < Depth; ++d) a.ptr[d][k] = (*lists[d])[items[l.begin + k].index].data_ptr();
  return a;
}

}  // namespace kiln::kernels::cuda::mt

namespace kiln::kernels::cuda {

// ---------------------------------------------------------------- the optimizer step: arguments
//
// Why it is fast: a per-parameter loop of tensor ops launches ~10 kernels per parameter (each a
// pass over memory, plus temporaries); here AdamW reads param, grad, exp_avg, exp_avg_sq once and
// writes param, exp_avg, exp_avg_sq once, for all parameters in ceil(#tensors / 40) launches, with
// 16-byte vector loads.
//
// No host synchronisation: the learning rate, the steps, found_inf and grad_scale are read by the
// kernels from device memory. Every chunk of a tensor reads step + 1; a separate tiny kernel
// increments the step tensors afterwards (skipped, like everything else, when found_inf is set),
// so each is incremented exactly once.
//
// Rules with per-tensor norms (LAMB, LARS): the norm pass writes two partial sums per chunk to a
// scratch buffer, a small kernel sums each tensor's partials in chunk order (deterministic, no
// float atomics) into the rule's trust ratio, and the update pass reads it.

constexpr int kOptT = 40;     // tensors per optimizer launch
constexpr int kTrustT = 256;  // tensors per trust-ratio launch

struct OptimMeta {
  mt::ChunkMap<kOptT> map;
  void* p[kOptT];                          // params (storage type P)
  const void* g[kOptT];                    // grads (P)
  void* buf[kMaxOptimizerBuffers][kOptT];  // the rule's buffers (state type S), null when unused
  float* w[kOptT];                         // f32 master weights of f16/bf16 params, else null
  const double* step[kOptT];
  uint8_t fresh[kOptT];  // buffers just created
  int32_t tensor_base;   // global tensor id of tensor 0 (per-tensor trust ratios)
  int64_t chunk_base;    // global chunk id of this launch's chunk 0 (partials)
};

template <class Rule> struct StepArgs {
  Rule rule;
  const double* lr;
  const float* found_inf;    // null: no loss scaler
  const double* grad_scale;  // null: gradients are not scaled
  double* partials;          // norm pass: two per global chunk
  const double* trust;       // update pass: one per global tensor (rules with per-tensor norms)
};

struct TrustMeta {
  int32_t ntensors;
  int32_t tensor_base;
  int64_t chunk_begin[kTrustT + 1];  // global chunk ids: tensor k owns [chunk_begin[k], chunk_begin[k + 1])
};

// ---------------------------------------------------------------- the optimizer step: device side

__device__ __forceinline__ bool skip_step(const float* found_inf) { return found_inf != nullptr && *found_inf != 0.0f; }
__device__ __forceinline__ double inv_scale_of(const double* grad_scale) {
  return grad_scale != nullptr ? 1.0 / *grad_scale : 1.0;
}

// What the rule gets for tensor t of this launch (read from device memory).
template <class Rule>
__device__ __forceinline__ UpdateScalars update_scalars(const OptimMeta& a, const StepArgs<Rule>& s, int t) {
  const double trust = Rule::kPerTensorNorms && s.trust != nullptr ? s.trust[a.tensor_base + t] : 1.0;
  return UpdateScalars{*s.lr, *a.step[t] + 1.0, inv_scale_of(s.grad_scale), a.fresh[t] != 0, trust};
}

// The element loop of every pass over elements [begin, end) of tensor t: f(x, g, b0, b1) with x
// the f32/f64 weight (the master copy for f16/bf16 params), g the gradient, b0 and b1 the buffers,
// all in the state type S. Only the first NBuf buffers are read and written (the others are zero),
// the gradient only when ReadGrad; WriteWeight false leaves the weight unwritten (the norm pass).
template <class P, bool ReadGrad, int NBuf, bool WriteWeight, class F>
__device__ __forceinline__ void optim_chunk(const OptimMeta& a, int t, int64_t begin, int64_t end, F&& f) {
  using S = state_t<P>;
  constexpr bool kMaster = !std::is_same_v<P, S>;
  P* p = static_cast<P*>(a.p[t]);
  const P* g = ReadGrad ? static_cast<const P*>(a.g[t]) : nullptr;
  S* b0 = NBuf > 0 ? static_cast<S*>(a.buf[0][t]) : nullptr;
  S* b1 = NBuf > 1 ? static_cast<S*>(a.buf[1][t]) : nullptr;
  float* w = kMaster ? a.w[t] : nullptr;
  const bool vec =
      mt::vec_aligned(p) && mt::vec_aligned(g) && mt::vec_aligned(b0) && mt::vec_aligned(b1) && mt::vec_aligned(w);
  mt::for_each_run(begin, end, vec, [&](auto len, int64_t i) {
    constexpr int N = decltype(len)::value;
    S x[N], gi[N], s0[N], s1[N];
    if constexpr (kMaster) {
      mt::load_n<N>(w + i, x);
    } else {
      mt::load_n<N>(p + i, x);
    }
    if constexpr (ReadGrad) {
      P gr[N];
      mt::load_n<N>(g + i, gr);
#pragma unroll
      for (int j = 0; j < N; ++j) gi[j] = static_cast<S>(gr[j]);
    } else {
#pragma unroll
      for (int j = 0; j < N; ++j) gi[j] = S(0);
    }
    if constexpr (NBuf > 0) {
      mt::load_n<N>(b0 + i, s0);
    } else {
#pragma unroll
      for (int j = 0; j < N; ++j) s0[j] = S(0);
    }
    if constexpr (NBuf > 1) {
      mt::load_n<N>(b1 + i, s1);
    } else {
#pragma unroll
      for (int j = 0; j < N; ++j) s1[j] = S(0);
    }
#pragma unroll
    for (int j = 0; j < N; ++j) f(x[j], gi[j], s0[j], s1[j]);
    if constexpr (NBuf > 0) mt::store_n<N>(b0 + i, s0);
    if constexpr (NBuf > 1) mt::store_n<N>(b1 + i, s1);
    if constexpr (WriteWeight) {
      if constexpr (kMaster) {
        mt::store_n<N>(w + i, x);
        P pr[N];
#pragma unroll
        for (int j = 0; j < N; ++j) pr[j] = static_cast<P>(x[j]);
        mt::store_n<N>(p + i, pr);
      } else {
        mt::store_n<N>(p + i, x);
      }
    }
  });
}

// The update pass. The rule's per-tensor functor is built by every thread from the device
// scalars (a few double operations, negligible next to the chunk's memory traffic).
template <class Rule, class P, int NBuf>
__global__ void __launch_bounds__(mt::kBlock) step_update_kernel(OptimMeta a, StepArgs<Rule> s) {
  if (skip_step(s.found_inf)) return;
  using S = state_t<P>;
  const mt::Chunk ch = mt::block_chunk(a.map);
  const auto f = s.rule.template update<S>(update_scalars(a, s, ch.t));
  optim_chunk<P, Rule::kUpdateReadsGrad, NBuf, true>(a, ch.t, ch.begin, ch.end, f);
}

// The norm pass of a rule with per-tensor norms: per chunk, the sums of the rule's NormTerms.
template <class Rule, class P>
__global__ void __launch_bounds__(mt::kBlock) step_norms_kernel(OptimMeta a, StepArgs<Rule> s) {
  if (skip_step(s.found_inf)) return;
  using S = state_t<P>;
  const mt::Chunk ch = mt::block_chunk(a.map);
  const auto f = s.rule.template norm_terms<S>(update_scalars(a, s, ch.t));
  double sum_a = 0.0, sum_b = 0.0;
  optim_chunk<P, true, Rule::kNormPassBuffers, false>(a, ch.t, ch.begin, ch.end, [&](S& x, S g, S& b0, S& b1) {
    const NormTerms n = f(x, g, b0, b1);
    sum_a += n.a;
    sum_b += n.b;
  });
  sum_a = block_reduce(sum_a, SumOp(), 0.0);
  sum_b = block_reduce(sum_b, SumOp(), 0.0);
  if (threadIdx.x == 0) {
    s.partials[2 * (a.chunk_base + blockIdx.x)] = sum_a;
    s.partials[2 * (a.chunk_base + blockIdx.x) + 1] = sum_b;
  }
}

// One thread per tensor sums its chunks' partials in chunk order (deterministic) and writes the
// tensor's trust ratio.
template <class Rule> __global__ void trust_ratio_kernel(TrustMeta tm, StepArgs<Rule> s, double* trust) {
  if (skip_step(s.found_inf)) return;
  const int k = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (k >= tm.ntensors) return;
  NormTerms sums{0.0, 0.0};
  for (int64_t c = tm.chunk_begin[k]; c < tm.chunk_begin[k + 1]; ++c) {
    sums.a += s.partials[2 * c];
    sums.b += s.partials[2 * c + 1];
  }
  trust[tm.tensor_base + k] = s.rule.trust_ratio(sums, inv_scale_of(s.grad_scale));
}

// ---------------------------------------------------------------- the optimizer step: host side

// The rule-independent host side of one step (multi_tensor.cu): checks the lists, reads nothing
// back, converts the scalars to device pointers, and plans the launches over the parameters that
// have a gradient and elements.
class StepLaunches {
 public:
  StepLaunches(const char* op, const MultiTensorLists& lists, int num_buffers, const StepScalars& scalars);
  bool has_work() const { return !active_.empty(); }
  const Tensor& first_param() const { return lists_.params[active_.front()]; }

  // The step's device scalars; grad_scale and found_inf are null when not given.
  const double* lr() const { return lr_.data_ptr<double>(); }
  const float* found_inf() const { return found_inf_.defined() ? found_inf_.data_ptr<float>() : nullptr; }
  const double* grad_scale() const { return grad_scale_.defined() ? grad_scale_.data_ptr<double>() : nullptr; }

  // Runs launch(dtype, meta, grid) for every launch of at most kOptT tensors of one dtype.
  template <class F> void for_each(F&& launch) const {
    for (const mt::Launch& l : launches_) {
      int grid = 0;
      const OptimMeta a = meta(l, grid);
      launch(items_[l.begin].dtype, a, grid);
    }
  }

  // Scratch of rules with per-tensor norms: two partials per chunk, one trust ratio per tensor.
  void allocate_norm_scratch();
  double* partials() const { return partials_.data_ptr<double>(); }
  double* trust() const { return trust_.data_ptr<double>(); }
  std::vector<TrustMeta> trust_batches() const;

  // After every pass: each step tensor advances once (on the device, skipped with found_inf), and
  // the parameters record their in-place writes.
  void finish(cudaStream_t stream) const;

 private:
  OptimMeta meta(const mt::Launch& l, int& grid) const;

  const MultiTensorLists& lists_;
  int num_buffers_;
  std::vector<int> active_;
  std::vector<mt::Item> items_;
  std::vector<mt::Launch> launches_;
  int64_t total_chunks_ = 0;
  Tensor lr_, found_inf_, grad_scale_, partials_, trust_;
};

// One optimizer step with `rule` over every parameter of the lists (contract: MultiTensorLists in
// kernels/multi_tensor.h), on the CUDA device of the lists' tensors.
template <class Rule>
void multi_tensor_step(const Rule& rule, const MultiTensorLists& lists, const StepScalars& scalars) {
  static_assert(sizeof(OptimMeta) + sizeof(StepArgs<Rule>) <= mt::kMaxParamBytes,
                "optimizer kernel arguments exceed the 4 KB parameter limit");
  static_assert(sizeof(TrustMeta) + sizeof(StepArgs<Rule>) + sizeof(void*) <= mt::kMaxParamBytes,
                "trust-ratio kernel arguments exceed the 4 KB parameter limit");
  const char* op = Rule::kStepName;
  const int nbuf = rule.num_buffers();
  KILN_CHECK(nbuf >= 0 && nbuf <= Rule::kMaxBuffers, op, ": the rule uses ", nbuf, " buffers");
  StepLaunches plan(op, lists, nbuf, scalars);
  if (!plan.has_work()) return;
  DeviceGuard guard(plan.first_param());
  cudaStream_t stream = stream_for(plan.first_param());
  StepArgs<Rule> s{rule, plan.lr(), plan.found_inf(), plan.grad_scale(), nullptr, nullptr};

  if constexpr (Rule::kPerTensorNorms) {
    plan.allocate_norm_scratch();
    s.partials = plan.partials();
    s.trust = plan.trust();
    plan.for_each([&](DType dtype, const OptimMeta& a, int grid) {
      dispatch_floating(dtype, op, [&](auto tag) {
        using P = typename decltype(tag)::type;
        step_norms_kernel<Rule, P><<<grid, mt::kBlock, 0, stream>>>(a, s);
        KILN_CUDA_CHECK_LAUNCH("step_norms_kernel");
      });
    });
    for (const TrustMeta& tm : plan.trust_batches()) {
      trust_ratio_kernel<Rule><<<(tm.ntensors + 127) / 128, 128, 0, stream>>>(tm, s, plan.trust());
      KILN_CUDA_CHECK_LAUNCH("trust_ratio_kernel");
    }
  }

  plan.for_each([&](DType dtype, const OptimMeta& a, int grid) {
    dispatch_floating(dtype, op, [&](auto tag) {
      using P = typename decltype(tag)::type;
      if constexpr (Rule::kMaxBuffers >= 2) {
        if (nbuf == 2) {
          step_update_kernel<Rule, P, 2><<<grid, mt::kBlock, 0, stream>>>(a, s);
          KILN_CUDA_CHECK_LAUNCH("step_update_kernel");
          return;
        }
      }
      if constexpr (Rule::kMaxBuffers >= 1) {
        if (nbuf == 1) {
          step_update_kernel<Rule, P, 1><<<grid, mt::kBlock, 0, stream>>>(a, s);
          KILN_CUDA_CHECK_LAUNCH("step_update_kernel");
          return;
        }
      }
      step_update_kernel<Rule, P, 0><<<grid, mt::kBlock, 0, stream>>>(a, s);
      KILN_CUDA_CHECK_LAUNCH("step_update_kernel");
    });
  });
  plan.finish(stream);
}

}  // namespace kiln::kernels::cuda
