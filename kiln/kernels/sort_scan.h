#pragma once
// Scans (cumsum, cumprod) and sorting along one dimension. CPU: kernels/cpu/sort_scan.cpp; CUDA:
// kernels/cuda/sort_scan.cu. Both move `dim` last (kernels/reduce_layout.h) and work on rows.
// No autograd (kiln/ops/sort_scan.cpp records the backward).
#include <cstdint>

#include "kiln/core/tensor.h"
#include "kiln/kernels/copy_fill.h"
#include "kiln/kernels/dispatch.h"
#include "kiln/kernels/reduce_layout.h"

namespace kiln::kernels {

enum class ScanOp : uint8_t { Sum, Prod };

// out = inclusive scan of `in` along dim (reverse: from the end, out[i] = sum/prod of in[i:]).
// out: contiguous, in's sizes and dtype (numeric). Accumulates in double for floating dtypes,
// int64 for integers.
inline Kernel<void(ScanOp op, const Tensor& out, const Tensor& in, int64_t dim, bool reverse)> scan{
    "scan"};

// indices (int64, contiguous, in's sizes) = the stable sorting permutation of each row of `in`
// along dim, ascending or descending; NaN compares as larger than every number (so it comes last
// ascending, first descending), as in PyTorch.
inline Kernel<void(const Tensor& indices, const Tensor& in, int64_t dim, bool descending)> argsort{
    "sort"};

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

}  // namespace kiln::kernels
