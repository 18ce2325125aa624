// CPU reductions. The input is arranged as [kept, reduced] (rows reduced independently) or, when
// only leading dims of a contiguous tensor are reduced, as [reduced, kept] (rows accumulated
// into the output, which vectorizes along the kept dim: the bias-gradient case).
// Floating sums accumulate in double: exact enough for gradcheck, and still memory-bound.
#include <omp.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "kiln/kernels/copy_fill.h"
#include "kiln/kernels/matmul.h"
#include "kiln/kernels/pointwise.h"
#include "kiln/kernels/reduce.h"
#include "kiln/kernels/softmax.h"
#include "kiln/kernels/cpu/loops.h"
#include "kiln/kernels/reduce_layout.h"

namespace kiln::kernels::cpu {

namespace {

template <class T> using acc_t = std::conditional_t<std::is_floating_point_v<opmath_t<T>>, double, int64_t>;

template <class A> struct SumAcc {
  A init() const { return A(0); }
  A combine(A a, A b) const { return a + b; }
};
template <class A> struct ProdAcc {
  A init() const { return A(1); }
  A combine(A a, A b) const { return a * b; }
};
template <class A> struct MaxAcc {
  A init() const {
    return std::numeric_limits<A>::has_infinity ? -std::numeric_limits<A>::infinity()
                                                : std::numeric_limits<A>::lowest();
  }
  A combine(A a, A b) const { return (a != a || a > b) ? a : b; }  // NaN wins
};
template <class A> struct MinAcc {
  A init() const {
    return std::numeric_limits<A>::has_infinity ? std::numeric_limits<A>::infinity() : std::numeric_limits<A>::max();
  }
  A combine(A a, A b) const { return (a != a || a < b) ? a : b; }
};

template <class T, class A, class R> A reduce_row(const T* p, int64_t n, R r) {
  A acc = r.init();
  for (int64_t i = 0; i < n; ++i) acc = r.combine(acc, static_cast<A>(static_cast<opmath_t<T>>(p[i])));
  return acc;
}

// Specialisation-free fast path for contiguous float sums: the compiler vectorizes this.
template <class T> double sum_row_fast(const T* p, int64_t n) {
  double acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(static_cast<opmath_t<T>>(p[i]));
  return acc;
}

template <class T, class A, class R>
void reduce_inner(const T* in, T* out, int64_t K, int64_t R_, R r, bool mean, bool is_sum) {
  auto finish = [&](A v) {
    if (mean) return static_cast<T>(static_cast<opmath_t<T>>(static_cast<double>(v) / static_cast<double>(R_)));
    return static_cast<T>(static_cast<opmath_t<T>>(v));
  };
  const int nthreads = omp_get_max_threads();
  if (K >= nthreads || K * R_ < kParallelGrain) {
#pragma omp parallel for schedule(static) if (K * R_ >= kParallelGrain)
    for (int64_t k = 0; k < K; ++k) {
      const T* row = in + k * R_;
      A v;
      if constexpr (std::is_same_v<A, double>) {
        v = is_sum ? sum_row_fast(row, R_) : reduce_row<T, A>(row, R_, r);
      } else {
        v = reduce_row<T, A>(row, R_, r);
      }
      out[k] = finish(v);
    }
    return;
  }
  // Few long rows: split each row across threads.
  for (int64_t k = 0; k < K; ++k) {
    const T* row = in + k * R_;
    std::vector<A> partial(nthreads, r.init());
#pragma omp parallel num_threads(nthreads)
    {
      int t = omp_get_thread_num(), nt = omp_get_num_threads();
      int64_t per = (R_ + nt - 1) / nt, b = std::min<int64_t>(R_, t * per), e = std::min<int64_t>(R_, b + per);
      if constexpr (std::is_same_v<A, double>) {
        partial[t] = is_sum ? sum_row_fast(row + b, e - b) : reduce_row<T, A>(row + b, e - b, r);
      } else {
        partial[t] = reduce_row<T, A>(row + b, e - b, r);
      }
    }
    A v = r.init();
    for (A p : partial) v = r.combine(v, p);
    out[k] = finish(v);
  }
}

template <class T, class A, class R> void reduce_outer(const T* in, T* out, int64_t R_, int64_t K, R r, bool mean) {
  const int nthreads = omp_get_max_threads();
  const int64_t chunks = (K * R_ >= kParallelGrain) ? std::min<int64_t>(nthreads, K) : 1;
  const int64_t per = (K + chunks - 1) / chunks;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t b = c * per, e = std::min(K, b + per);
    if (b >= e) continue;
    std::vector<A> acc(e - b, r.init());
    for (int64_t i = 0; i < R_; ++i) {
      const T* row = in + i * K;
      for (int64_t k = b; k < e; ++k)
        acc[k - b] = r.combine(acc[k - b], static_cast<A>(static_cast<opmath_t<T>>(row[k])));
    }
    for (int64_t k = b; k < e; ++k) {
      if (mean)
        out[k] = static_cast<T>(static_cast<opmath_t<T>>(static_cast<double>(acc[k - b]) / static_cast<double>(R_)));
      else out[k] = static_cast<T>(static_cast<opmath_t<T>>(acc[k - b]));
    }
  }
}

}  // namespace

void reduce(ReduceOp op, const Tensor& out, const Tensor& in, const IntList& dims) {
  const ReduceLayout layout = reduce_layout(op, out, in, dims);
  const int64_t K = layout.K, R_ = layout.R;
  if (K == 0) return;
  const bool outer = layout.leading;
  Tensor src = outer ? in : layout.rows(in);
  const bool mean = op == ReduceOp::Mean;
  dispatch_numeric(in.dtype(), "reduce", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const T* ip = static_cast<const T*>(src.data_ptr());
    T* op_ = static_cast<T*>(out.data_ptr());
    auto go = [&](auto r, bool is_sum) {
      if (outer) reduce_outer<T, A>(ip, op_, R_, K, r, mean);
      else reduce_inner<T, A>(ip, op_, K, R_, r, mean, is_sum);
    };
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Mean: return go(SumAcc<A>{}, true);
      case ReduceOp::Prod: return go(ProdAcc<A>{}, false);
      case ReduceOp::Max: return go(MaxAcc<opmath_t<T>>{}, false);
      case ReduceOp::Min: return go(MinAcc<opmath_t<T>>{}, false);
    }
  });
}
KILN_REGISTER_KERNEL(kernels::reduce, CPU, reduce);

void arg_reduce(bool is_max, const Tensor& values, const Tensor& indices, const Tensor& in, int64_t dim) {
  KILN_CHECK(indices.dtype() == DType::I64 && values.dtype() == in.dtype() && values.is_contiguous() &&
                 indices.is_contiguous(),
             "arg_reduce: bad outputs");
  const int64_t n = in.sizes().empty() ? 1 : in.sizes()[dim];
  KILN_CHECK(n > 0, is_max ? "max" : "min", ": cannot reduce over an empty dimension (sizes ", in.sizes(), ")");
  // Move `dim` last, keeping the other dims in order: row r of the result is output element r.
  Tensor src = dim_last_rows(in, dim);
  const int64_t rows = src.numel() / n;
  KILN_CHECK(values.numel() == rows && indices.numel() == rows, "arg_reduce: output size mismatch");
  dispatch_numeric(in.dtype(), is_max ? "max" : "min", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = opmath_t<T>;
    const T* p = static_cast<const T*>(src.data_ptr());
    T* vo = static_cast<T*>(values.data_ptr());
    int64_t* io = static_cast<int64_t*>(indices.data_ptr());
#pragma omp parallel for schedule(static) if (src.numel() >= kParallelGrain)
    for (int64_t r = 0; r < rows; ++r) {
      const T* row = p + r * n;
      M best = static_cast<M>(row[0]);
      int64_t bi = 0;
      if (best == best) {
        for (int64_t i = 1; i < n; ++i) {
          M v = static_cast<M>(row[i]);
          if (v != v) {
            best = v;
            bi = i;
            break;
          }  // NaN is the extreme value, as in PyTorch
          if (is_max ? v > best : v < best) {
            best = v;
            bi = i;
          }
        }
      }
      vo[r] = static_cast<T>(best);
      io[r] = bi;
    }
  });
}
KILN_REGISTER_KERNEL(kernels::arg_reduce, CPU, arg_reduce);

}  // namespace kiln::kernels::cpu
