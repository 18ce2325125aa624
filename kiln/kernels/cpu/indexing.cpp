// CPU indexing kernels: index_select, index_add, gather, scatter_add.
//
// All four are one loop. Each op walks an index-shaped iteration space and touches three
// operands at every position p:
//   "self"  - the tensor the index points into (read by gather/index_select, added into by
//             scatter_add/index_add); its coordinate along `dim` is index[p], not p[dim],
//   "index" - the index values (for the 1-D index of index_select/index_add: stride 0 in every
//             dimension but `dim`, so it reads like an index expanded to the iteration shape),
//   "other" - the gathered output, or the scattered source; its coordinate is p itself.
// The space is split as outer x dim x inner, where inner is the last dimension (when it is not
// `dim`) so the innermost loop runs along memory for contiguous operands, cut into chunks so that
// small outer sizes still give every thread work.
//
// Gathers are race-free in any order and are parallelised over all three. Scatters (the
// backward of gathers) may hit one destination from several positions that differ only along
// `dim`, so they are parallelised over outer x inner-chunks only: a task owns its destination
// elements and walks `dim` in order, which is race-free with repeated indices and deterministic.
//
// Index values are checked against the size of `dim` in one pass before anything is written (an
// exception cannot leave an OpenMP region).
#include <omp.h>

#include <algorithm>
#include <array>
#include <limits>

#include "kiln/kernels/copy_fill.h"
#include "kiln/kernels/cpu/loops.h"
#include "kiln/kernels/indexing.h"

namespace kiln::kernels::cpu {

namespace {

struct Space {
  IntList sizes;                  // the iteration shape (ndim >= 1)
  int64_t dim = 0;                // the indexed dimension
  std::array<IntList, 3> stride;  // element strides of self, index, other over the iteration dims
};

// The space over `sizes` with the strides of self, index and other; a 0-dim problem is a 1-D
// problem of size 1.
Space make_space(IntList sizes, int64_t dim, std::array<IntList, 3> stride) {
  if (sizes.empty()) return Space{{1}, 0, {IntList{0}, IntList{0}, IntList{0}}};
  return Space{std::move(sizes), dim, std::move(stride)};
}

// Element strides of the 1-D (or 0-D) index of index_select/index_add, spread over `ndim` dims.
IntList spread_index_strides(const Tensor& index, int64_t ndim, int64_t dim) {
  IntList st(ndim, 0);
  if (index.dim() == 1) st[dim] = index.stride(0);
  return st;
}

// Calls body(base, k0, k1, l0, l1) for tasks covering the space; `base` holds the element offsets
// of the three operands at (outer position, k = 0, l = 0). With `split_dim` false each task gets
// the whole range of `dim` (scatter); with it true, `dim` is split across tasks too (gather).
template <class Body> void for_each_task(const Space& s, bool split_dim, Body body) {
  const int64_t nd = static_cast<int64_t>(s.sizes.size());
  const int64_t last = nd - 1;
  const bool has_inner = s.dim != last;
  const int64_t K = s.sizes[s.dim];
  const int64_t L = has_inner ? s.sizes[last] : 1;
  IntList odims;
  int64_t outer = 1;
  for (int64_t d = 0; d < nd; ++d) {
    if (d == s.dim || (has_inner && d == last)) continue;
    odims.push_back(d);
    outer *= s.sizes[d];
  }
  const int64_t numel = outer * K * L;
  if (numel == 0) return;
  const bool parallel = numel >= kParallelGrain;
  const int64_t threads = parallel ? omp_get_max_threads() : 1;

  // Inner chunks: whole rows when the other splits already give every thread work.
  int64_t chunk = L;
  const int64_t coarse = outer * (split_dim ? K : 1);
  if (parallel && coarse < 2 * threads) {
    int64_t want = (2 * threads + coarse - 1) / coarse;
    chunk = std::max<int64_t>(32, (L + want - 1) / want);
  }
  chunk = std::max<int64_t>(1, std::min(chunk, L));
  const int64_t nchunks = (L + chunk - 1) / chunk;
  // Blocks along dim (gather only): enough k per task that a task is not a single element.
  const int64_t kblock = split_dim ? std::max<int64_t>(1, std::min<int64_t>(K, 256 / chunk)) : K;
  const int64_t nkblocks = (K + kblock - 1) / kblock;
  const int64_t tasks = outer * nkblocks * nchunks;

#pragma omp parallel for schedule(static) if (parallel && tasks > 1)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t c = t % nchunks;
    const int64_t kb = (t / nchunks) % nkblocks;
    int64_t rem = t / (nchunks * nkblocks);
    int64_t base[3] = {0, 0, 0};
    for (int64_t i = static_cast<int64_t>(odims.size()) - 1; i >= 0; --i) {
      const int64_t d = odims[i];
      const int64_t x = rem % s.sizes[d];
      rem /= s.sizes[d];
      for (int k = 0; k < 3; ++k) base[k] += x * s.stride[k][d];
    }
    const int64_t k0 = kb * kblock, k1 = std::min(K, k0 + kblock);
    const int64_t l0 = c * chunk, l1 = std::min(L, l0 + chunk);
    body(base, k0, k1, l0, l1);
  }
}

// Strides of operand k along dim and along the inner (last) dimension (0 when there is none).
struct Steps {
  int64_t k[3];
  int64_t l[3];
};
Steps steps_of(const Space& s) {
  const int64_t last = static_cast<int64_t>(s.sizes.size()) - 1;
  Steps st{};
  for (int i = 0; i < 3; ++i) {
    st.k[i] = s.stride[i][s.dim];
    st.l[i] = s.dim != last ? s.stride[i][last] : 0;
  }
  return st;
}

// Every value of `index` in [0, bound), or an Error naming the op, the value and the dimension.
void check_range(const Tensor& index, int64_t bound, int64_t dim, const char* op) {
  if (index.numel() == 0) return;
  auto [lo, hi] = index_min_max(index, op);
  KILN_CHECK(lo >= 0, op, ": index ", lo, " is out of range for dimension ", dim, " with size ", bound,
             " (negative indices are not allowed)");
  KILN_CHECK(hi < bound, op, ": index ", hi, " is out of range for dimension ", dim, " with size ", bound);
}

// out-of-place gather over a Space: other[p] = self[p with p[dim] = index[p]].
void run_gather(const Space& s, const Tensor& self, const Tensor& index, const Tensor& other, const char* op) {
  const Steps st = steps_of(s);
  const int64_t self_k = st.k[0];
  dispatch_by_size(self.dtype(), [&](auto vtag) {
    using T = typename decltype(vtag)::type;
    dispatch_index(index.dtype(), op, [&](auto itag) {
      using I = typename decltype(itag)::type;
      const T* sp = static_cast<const T*>(self.data_ptr());
      const I* ip = static_cast<const I*>(index.data_ptr());
      T* op_ = static_cast<T*>(other.data_ptr());
      for_each_task(s, /*split_dim=*/true, [&](const int64_t* base, int64_t k0, int64_t k1, int64_t l0, int64_t l1) {
        for (int64_t k = k0; k < k1; ++k) {
          const I* ik = ip + base[1] + k * st.k[1];
          T* ok = op_ + base[2] + k * st.k[2];
          const T* sk = sp + base[0];
          if (st.l[1] == 0 && st.l[0] == 1 && st.l[2] == 1) {  // one index for the whole row
            const T* row = sk + static_cast<int64_t>(*ik) * self_k;
            for (int64_t l = l0; l < l1; ++l) ok[l] = row[l];
          } else {
            for (int64_t l = l0; l < l1; ++l)
              ok[l * st.l[2]] = sk[static_cast<int64_t>(ik[l * st.l[1]]) * self_k + l * st.l[0]];
          }
        }
      });
    });
  });
}

// accumulating scatter over a Space: self[p with p[dim] = index[p]] += other[p].
void run_scatter_add(const Space& s, const Tensor& self, const Tensor& index, const Tensor& other, const char* op) {
  const Steps st = steps_of(s);
  const int64_t self_k = st.k[0];
  dispatch_numeric(self.dtype(), op, [&](auto vtag) {
    using T = typename decltype(vtag)::type;
    using M = opmath_t<T>;
    dispatch_index(index.dtype(), op, [&](auto itag) {
      using I = typename decltype(itag)::type;
      T* sp = static_cast<T*>(self.data_ptr());
      const I* ip = static_cast<const I*>(index.data_ptr());
      const T* op_ = static_cast<const T*>(other.data_ptr());
      for_each_task(s, /*split_dim=*/false, [&](const int64_t* base, int64_t k0, int64_t k1, int64_t l0, int64_t l1) {
        T* sb = sp + base[0];
        for (int64_t k = k0; k < k1; ++k) {  // in order: repeated indices add up race-free
          const I* ik = ip + base[1] + k * st.k[1];
          const T* ok = op_ + base[2] + k * st.k[2];
          if (st.l[1] == 0 && st.l[0] == 1 && st.l[2] == 1) {
            T* row = sb + static_cast<int64_t>(*ik) * self_k;
#pragma omp simd
            for (int64_t l = l0; l < l1; ++l) row[l] = static_cast<T>(static_cast<M>(row[l]) + static_cast<M>(ok[l]));
          } else {
            for (int64_t l = l0; l < l1; ++l) {
              T& d = sb[static_cast<int64_t>(ik[l * st.l[1]]) * self_k + l * st.l[0]];
              d = static_cast<T>(static_cast<M>(d) + static_cast<M>(ok[l * st.l[2]]));
            }
          }
        }
      });
    });
  });
}

}  // namespace

std::pair<int64_t, int64_t> index_min_max(const Tensor& index_in, const char* op) {
  const Tensor index = contiguous(index_in);
  const int64_t n = index.numel();
  return dispatch_index(index.dtype(), op, [&](auto tag) {
    using I = typename decltype(tag)::type;
    const I* p = static_cast<const I*>(index.data_ptr());
    int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
#pragma omp parallel for reduction(min : lo) reduction(max : hi) if (n >= kParallelGrain)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t v = static_cast<int64_t>(p[i]);
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    return std::pair<int64_t, int64_t>(lo, hi);
  });
}
KILN_REGISTER_KERNEL(kernels::backend::index_min_max, CPU, index_min_max);

void index_select(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index, const char* op) {
  check_range(index, in.size(dim), dim, op);
  if (out.numel() == 0) return;
  run_gather(make_space(out.sizes(), dim, {in.strides(), spread_index_strides(index, out.dim(), dim), out.strides()}),
             in, index, out, op);
}
KILN_REGISTER_KERNEL(kernels::backend::index_select, CPU, index_select);

void index_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, const char* op) {
  check_range(index, out.size(dim), dim, op);
  if (src.numel() == 0) return;
  run_scatter_add(
      make_space(src.sizes(), dim, {out.strides(), spread_index_strides(index, src.dim(), dim), src.strides()}), out,
      index, src, op);
}
KILN_REGISTER_KERNEL(kernels::backend::index_add, CPU, index_add);

void gather(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index, const char* op) {
  check_range(index, in.dim() == 0 ? 1 : in.size(dim), dim, op);
  if (out.numel() == 0) return;
  run_gather(make_space(index.sizes(), dim, {in.strides(), index.strides(), out.strides()}), in, index, out, op);
}
KILN_REGISTER_KERNEL(kernels::backend::gather, CPU, gather);

void scatter_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, const char* op) {
  check_range(index, out.dim() == 0 ? 1 : out.size(dim), dim, op);
  if (index.numel() == 0) return;
  run_scatter_add(make_space(index.sizes(), dim, {out.strides(), index.strides(), src.strides()}), out, index, src, op);
}
KILN_REGISTER_KERNEL(kernels::backend::scatter_add, CPU, scatter_add);

}  // namespace kiln::kernels::cpu
