#pragma once
// Scans (cumsum, cumprod) and sorting along one dimension. CPU: kernels/cpu/sort_scan.cpp; CUDA:
// kernels/cuda/sort_scan.cu. Both move `dim` last (kernels/reduce_layout.h) and work on rows.
// No autograd (kiln/ops/sort_scan.cpp records the backward).
#include <cstdint>
#include <type_traits>

#include "kiln/core/error.h"
#include "kiln/core/macros.h"
#include "kiln/core/tensor.h"
#include "kiln/kernels/copy_fill.h"
#include "kiln/kernels/dispatch.h"
#include "kiln/kernels/reduce_layout.h"

namespace kiln::kernels {

enum class ScanOp : uint8_t { Sum, Prod };

// out = inclusive scan of `in` along dim (reverse: from the end, out[i] = sum/prod of in[i:]).
// out: contiguous, in's sizes and dtype (numeric). Accumulates in double for floating dtypes,
// int64 for integers.
inline Kernel<void(ScanOp op, const Tensor& out, const Tensor& in, int64_t dim, bool reverse)> scan{"scan"};

// indices (int64, contiguous, in's sizes) = the stable sorting permutation of each row of `in`
// along dim, ascending or descending; NaN compares as larger than every number (so it comes last
// ascending, first descending), as in PyTorch.
inline Kernel<void(const Tensor& indices, const Tensor& in, int64_t dim, bool descending)> argsort{"sort"};

// The rows both backends work on: `in` with dim moved last as contiguous rows of length n, and
// where the row results go (`out` itself when dim is already last, else a scratch buffer that
// finish() scatters back into `out`, which is contiguous in `in`'s layout).
struct RowsAlongDim {
  RowsAlongDim(const Tensor& out, const Tensor& in, int64_t dim)
      : out_(out), dim_(dim), direct_(dim == in.dim() - 1 || in.dim() == 0) {
    n = in.dim() == 0 ? 1 : in.size(dim);
    src = dim_last_rows(in, dim);
    dst = direct_ ? out : empty(src.sizes(), out.options());
    rows = n == 0 ? 0 : src.numel() / n;
  }
  void finish() const {
    if (direct_) return;
    IntList perm;
    for (int64_t d = 0; d < out_.dim(); ++d)
      if (d != dim_) perm.push_back(d);
    perm.push_back(dim_);
    copy(out_.detach().permute(perm), dst);
  }

  Tensor src, dst;
  int64_t n = 1, rows = 0;

 private:
  Tensor out_;
  int64_t dim_;
  bool direct_;
};

// The rest is what both backends' scan and argsort share: argument checks, the walk over the
// rows, and the per-row math (KILN_INLINE, so one definition serves the host and the device).

inline void check_scan_output(const Tensor& out, const Tensor& in) {
  KILN_CHECK(out.dtype() == in.dtype() && out.sizes() == in.sizes() && out.is_contiguous(), "scan: bad output");
}

inline void check_sort_indices(const Tensor& indices, const Tensor& in) {
  KILN_CHECK(indices.dtype() == DType::I64 && indices.sizes() == in.sizes() && indices.is_contiguous(),
             "sort: bad indices output");
}

// body(src, dst, rows, n) on the rows of `in` along dim (see RowsAlongDim), then the results
// scattered back into out. Nothing for an empty input.
template <class Body> void on_rows_along_dim(const Tensor& out, const Tensor& in, int64_t dim, Body&& body) {
  if (in.numel() == 0) return;
  const RowsAlongDim layout(out, in, dim);
  body(layout.src, layout.dst, layout.rows, layout.n);
  layout.finish();
}

// The scan's accumulator: double for floating dtypes, int64 for integers.
template <class T> using scan_acc_t = std::conditional_t<std::is_floating_point_v<opmath_t<T>>, double, int64_t>;

// y = the inclusive scan of the row x[0, n) (from the end when reverse).
template <class T> KILN_INLINE void scan_row(const T* x, T* y, int64_t n, bool prod, bool reverse) {
  using M = opmath_t<T>;
  using A = scan_acc_t<T>;
  A acc = prod ? A(1) : A(0);
  for (int64_t k = 0; k < n; ++k) {
    const int64_t i = reverse ? n - 1 - k : k;
    const A v = static_cast<A>(static_cast<M>(x[i]));
    acc = prod ? acc * v : acc + v;
    y[i] = static_cast<T>(static_cast<M>(acc));
  }
}

// a sorts strictly before b; NaN is the largest value (a != a tests NaN; integers never are).
template <class M> KILN_INLINE bool sorts_before(M a, M b, bool descending) {
  if (descending) return (a != a && b == b) || a > b;
  return (b != b && a == a) || a < b;
}

}  // namespace kiln::kernels
