#pragma once
// CPU launchers for the shared pointwise functors. A PointwiseIter is split into rows along its
// innermost dimension; rows are spread over OpenMP threads, and a row whose operands are all
// contiguous runs as a plain typed loop the compiler vectorizes.
#include <omp.h>

#include <cstdint>

#include "kiln/core/dtype.h"
#include "kiln/core/tensor.h"
#include "kiln/kernels/pointwise_iter.h"

namespace kiln::kernels::cpu {

// Below this many elements a kernel runs on the calling thread (thread start-up costs more).
constexpr int64_t kParallelGrain = 32768;

// An operand's data as T, or null when it is undefined (an optional operand, a gradient not wanted).
template <class T> const T* cptr(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.data_ptr()) : nullptr;
}
template <class T> T* mptr(const Tensor& t) { return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr; }

// body(x, y) for each of `rows` contiguous rows of n elements, x = in + r * n and y = out + r * n;
// the rows are spread over OpenMP threads when there are kParallelGrain elements or more.
template <class I, class O, class Body>
void for_each_contiguous_row(const I* in, O* out, int64_t rows, int64_t n, Body&& body) {
#pragma omp parallel for schedule(static) if (rows * n >= kParallelGrain)
  for (int64_t r = 0; r < rows; ++r) body(in + r * n, out + r * n);
}

// The sum of term(i) for i in [0, n), for the row sums of softmax and cross-entropy: each block of
// kSumBlock terms is summed in the term's type across vector lanes (full SIMD width), the block
// sums in double. A 50,257-class row summed in f32 lanes alone loses up to 6e-5 of its sum, by an
// amount that depends on the vector width (docs/kernels.md, "Reductions"); a block of 256 loses
// about 1e-7, whatever the ISA.
constexpr int64_t kSumBlock = 256;
template <class Term> double blocked_sum(int64_t n, Term&& term) {
  using V = decltype(term(int64_t{0}));
  double total = 0;
  for (int64_t b = 0; b < n; b += kSumBlock) {
    const int64_t e = b + kSumBlock < n ? b + kSumBlock : n;
    V s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = b; i < e; ++i) s += term(i);
    total += static_cast<double>(s);
  }
  return total;
}

// Calls row(ptrs, n, inner_strides) for every contiguous run of the iteration space.
template <class RowFn> void for_each_row(const PointwiseIter& it, RowFn row) {
  const int nops = it.noperands;
  if (it.numel == 0) return;
  if (it.ndim == 0) {
    int64_t zero[kMaxOperands] = {};
    char* p[kMaxOperands];
    for (int k = 0; k < nops; ++k) p[k] = it.data[k];
    row(p, int64_t{1}, zero);
    return;
  }
  const int64_t inner = it.sizes[it.ndim - 1];
  int64_t inner_st[kMaxOperands];
  for (int k = 0; k < nops; ++k) inner_st[k] = it.strides[k][it.ndim - 1];
  const int64_t rows = it.numel / inner;
  if (rows == 1) {  // one long row: split it into chunks
    const int64_t chunks = it.numel >= kParallelGrain ? omp_get_max_threads() : 1;
    const int64_t per = (inner + chunks - 1) / chunks;
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (int64_t c = 0; c < chunks; ++c) {
      int64_t begin = c * per, n = std::min(inner, begin + per) - begin;
      if (n <= 0) continue;
      char* p[kMaxOperands];
      for (int k = 0; k < nops; ++k) p[k] = it.data[k] + begin * inner_st[k];
      row(p, n, inner_st);
    }
    return;
  }
  // Each thread takes a contiguous range of rows: the first row's position comes from divisions,
  // the next ones from an odometer over the outer dims (a division per dim per row cost more than
  // copying a row of 32 floats: the strided copies of a permuted tensor).
#pragma omp parallel if (it.numel >= kParallelGrain)
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t r0 = rows * t / nt, r1 = rows * (t + 1) / nt;
    if (r0 < r1) {
      char* p[kMaxOperands];
      int64_t idx[kMaxDims] = {};
      for (int k = 0; k < nops; ++k) p[k] = it.data[k];
      int64_t rem = r0;
      for (int d = it.ndim - 2; d >= 0; --d) {
        idx[d] = rem % it.sizes[d];
        rem /= it.sizes[d];
        for (int k = 0; k < nops; ++k) p[k] += idx[d] * it.strides[k][d];
      }
      for (int64_t r = r0; r < r1; ++r) {
        char* q[kMaxOperands];  // the row function may move its pointers
        for (int k = 0; k < nops; ++k) q[k] = p[k];
        row(q, inner, inner_st);
        for (int d = it.ndim - 2; d >= 0; --d) {  // next row
          for (int k = 0; k < nops; ++k) p[k] += it.strides[k][d];
          if (++idx[d] < it.sizes[d]) break;
          for (int k = 0; k < nops; ++k) p[k] -= it.sizes[d] * it.strides[k][d];
          idx[d] = 0;
        }
      }
    }
  }
}

// out = f(in...) elementwise. Out and In are storage types; f gets and returns opmath values.
template <class Out, class In, class F> void unary_loop(const PointwiseIter& it, F f) {
  for_each_row(it, [&](char** p, int64_t n, const int64_t* st) {
    Out* o = reinterpret_cast<Out*>(p[0]);
    const In* a = reinterpret_cast<const In*>(p[1]);
    if (st[0] == sizeof(Out) && st[1] == sizeof(In)) {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) o[i] = static_cast<Out>(f(static_cast<opmath_t<In>>(a[i])));
    } else {
      for (int64_t i = 0; i < n; ++i) {
        *reinterpret_cast<Out*>(p[0] + i * st[0]) =
            static_cast<Out>(f(static_cast<opmath_t<In>>(*reinterpret_cast<const In*>(p[1] + i * st[1]))));
      }
    }
  });
}

template <class Out, class In, class F> void binary_loop(const PointwiseIter& it, F f) {
  for_each_row(it, [&](char** p, int64_t n, const int64_t* st) {
    using M = opmath_t<In>;
    Out* o = reinterpret_cast<Out*>(p[0]);
    const In* a = reinterpret_cast<const In*>(p[1]);
    const In* b = reinterpret_cast<const In*>(p[2]);
    if (st[0] == sizeof(Out) && st[1] == sizeof(In) && st[2] == sizeof(In)) {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) o[i] = static_cast<Out>(f(static_cast<M>(a[i]), static_cast<M>(b[i])));
    } else if (st[0] == sizeof(Out) && st[1] == sizeof(In) && st[2] == 0) {  // tensor op scalar
      const M bv = static_cast<M>(*b);
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) o[i] = static_cast<Out>(f(static_cast<M>(a[i]), bv));
    } else {
      for (int64_t i = 0; i < n; ++i) {
        M x = static_cast<M>(*reinterpret_cast<const In*>(p[1] + i * st[1]));
        M y = static_cast<M>(*reinterpret_cast<const In*>(p[2] + i * st[2]));
        *reinterpret_cast<Out*>(p[0] + i * st[0]) = static_cast<Out>(f(x, y));
      }
    }
  });
}

}  // namespace kiln::kernels::cpu
