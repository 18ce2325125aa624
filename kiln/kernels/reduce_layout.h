#pragma once
// How both backends lay out a reduction: the input seen as [K kept, R reduced] rows (after
// moving the reduced dims last), or — when only the leading dims of a contiguous tensor are
// reduced — as [R, K] read in place, which the column kernels accumulate without a copy.
#include "kiln/kernels/copy_fill.h"
#include "kiln/kernels/reduce.h"

namespace kiln::kernels {

struct ReduceLayout {
  int64_t K = 1;         // output elements
  int64_t R = 1;         // elements reduced into each
  bool leading = false;  // only leading dims reduced, input contiguous: read [R, K] in place
  IntList perm;          // kept dims then reduced dims

  // The [K, R] row-major source (a copy only when the permuted view is not contiguous).
  Tensor rows(const Tensor& in) const { return contiguous(in.detach().permute(perm)); }
};

inline ReduceLayout reduce_layout(ReduceOp op, const Tensor& out, const Tensor& in, const IntList& dims) {
  KILN_CHECK(out.is_contiguous() && out.dtype() == in.dtype(), "reduce: bad output");
  ReduceLayout l;
  const int64_t nd = in.dim();
  std::vector<bool> is_red(static_cast<size_t>(nd), false);
  for (int64_t d : dims) is_red[static_cast<size_t>(d)] = true;
  for (int64_t d = 0; d < nd; ++d)
    if (!is_red[static_cast<size_t>(d)]) {
      l.perm.push_back(d);
      l.K *= in.sizes()[d];
    }
  for (int64_t d = 0; d < nd; ++d)
    if (is_red[static_cast<size_t>(d)]) {
      l.perm.push_back(d);
      l.R *= in.sizes()[d];
    }
  KILN_CHECK(out.numel() == l.K, "reduce: output has ", out.numel(), " elements, expected ", l.K);
  KILN_CHECK(!(l.R == 0 && l.K > 0 && (op == ReduceOp::Max || op == ReduceOp::Min)), "max/min: cannot reduce ",
             "over a dimension of size 0 (sizes ", in.sizes(), ")");
  l.leading = in.is_contiguous() && !dims.empty() && l.K > 1;
  for (size_t i = 0; i < dims.size(); ++i) l.leading = l.leading && dims[i] == static_cast<int64_t>(i);
  return l;
}

// For arg max/min along `dim`: `in` with dim moved last (other dims in order) as contiguous rows
// of length size(dim): row r of the result is output element r.
inline Tensor dim_last_rows(const Tensor& in, int64_t dim) {
  IntList perm;
  for (int64_t d = 0; d < in.dim(); ++d)
    if (d != dim) perm.push_back(d);
  if (in.dim() > 0) perm.push_back(dim);
  return contiguous(in.detach().permute(perm));
}

}  // namespace kiln::kernels
