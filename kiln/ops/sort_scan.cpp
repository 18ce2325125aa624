// Differentiable scans and sorts along one dimension: cumsum, cumprod, sort, argsort, topk.
// Kernels: kernels/sort_scan.h (docs/kernels.md, "Scans and sorts").
//
// Backward formulas, each built from differentiable ops (so create_graph works):
//   cumsum  -> the reverse cumsum of the gradient (a scan from the end; its backward is cumsum)
//   cumprod -> rev_cumsum(g * y) / x when x has no zero; otherwise, for each position k,
//              sum over i >= k of g_i * cumprod(x with x_k replaced by 1)_i (exact with zeros,
//              n cumprods per call; the zero test reads one number back, a sync on a GPU)
//   sort / topk values -> gather(x, dim, indices), whose backward scatters the gradient to the
//              indices (a permutation for sort, so each input gets its own output's gradient)
#include "kiln/core/autograd.h"
#include "kiln/core/shape.h"
#include "kiln/kernels/sort_scan.h"

namespace kiln {

using autograd::SavedTensor;
using autograd::TensorList;
using kernels::ScanOp;

namespace {

// Integer and bool inputs scan in int64, as PyTorch.
Tensor scan_input(const Tensor& a, const char* op) {
  KILN_CHECK(a.defined(), op, ": input is undefined");
  return is_floating(a.dtype()) ? a : a.to(DType::I64);
}

Tensor scan_raw(ScanOp op, const Tensor& x, int64_t dim, bool reverse) {
  Tensor out = empty(x.sizes(), x.options());
  kernels::scan(op, out, x.detach(), dim, reverse);
  return out;
}

// cumsum from the start (reverse = false) or from the end.
Tensor cumsum_dir(const Tensor& x, int64_t dim, bool reverse) {
  Tensor out = scan_raw(ScanOp::Sum, x, dim, reverse);
  if (autograd::any_requires_grad({&x})) {
    autograd::record_function("CumsumBackward", {&x}, {&out}, [dim, reverse](const TensorList& g) {
      return TensorList{cumsum_dir(g[0], dim, !reverse)};
    });
  }
  return out;
}

Tensor cumprod_backward(const Tensor& g, const Tensor& x, const Tensor& y, int64_t dim) {
  if (x.numel() == 0) return zeros_like(x);
  bool has_zero;
  {
    NoGradGuard ng;
    has_zero = (x.detach() == 0.0).to(DType::F64).sum().item<double>() > 0;
  }
  if (!has_zero) return cumsum_dir(g * y, dim, true) / x;
  const int64_t n = x.dim() == 0 ? 1 : x.size(dim);
  if (x.dim() == 0) return g;  // d x / d x
  // pos: 0..n-1 along dim, broadcasting over the other dims
  IntList shape(x.dim(), 1);
  shape[dim] = n;
  Tensor pos = arange(static_cast<double>(n), TensorOptions().dtype(DType::I64).device(x.device())).view(shape);
  std::vector<Tensor> parts;
  parts.reserve(n);
  for (int64_t k = 0; k < n; ++k) {
    Tensor at_k = pos == static_cast<double>(k);
    Tensor xk = where(at_k, ones({}, x.options()), x);
    Tensor ck = cumprod(xk, dim);
    Tensor after = (pos >= static_cast<double>(k)).to(g.dtype());
    parts.push_back(sum(g * ck * after, {dim}, true));
  }
  return cat(parts, dim);
}

}  // namespace

Tensor cumsum(const Tensor& a, int64_t dim) {
  Tensor x = scan_input(a, "cumsum");
  dim = wrap_dim(dim, x.dim(), "cumsum");
  return cumsum_dir(x, dim, false);
}

Tensor cumprod(const Tensor& a, int64_t dim) {
  Tensor x = scan_input(a, "cumprod");
  dim = wrap_dim(dim, x.dim(), "cumprod");
  Tensor out = scan_raw(ScanOp::Prod, x, dim, false);
  if (autograd::any_requires_grad({&x})) {
    SavedTensor sx(x, "CumprodBackward");
    SavedTensor sy = SavedTensor::output(out, "CumprodBackward");
    autograd::record_function("CumprodBackward", {&x}, {&out}, [sx, sy, dim](const TensorList& g) {
      return TensorList{cumprod_backward(g[0], sx.get(), sy.get(), dim)};
    });
  }
  return out;
}

Tensor argsort(const Tensor& a, int64_t dim, bool descending) {
  KILN_CHECK(a.defined(), "argsort: input is undefined");
  dim = wrap_dim(dim, a.dim(), "argsort");
  if (a.dim() == 0) return zeros({}, TensorOptions().dtype(DType::I64).device(a.device()));
  Tensor idx = empty(a.sizes(), TensorOptions().dtype(DType::I64).device(a.device()));
  kernels::argsort(idx, a.detach(), dim, descending);
  return idx;
}

std::tuple<Tensor, Tensor> sort(const Tensor& a, int64_t dim, bool descending) {
  KILN_CHECK(a.defined(), "sort: input is undefined");
  dim = wrap_dim(dim, a.dim(), "sort");
  if (a.dim() == 0) {  // a 0-dim tensor is its own sort, at index 0
    Tensor idx = zeros({1}, TensorOptions().dtype(DType::I64).device(a.device()));
    return {gather(a.reshape({1}), 0, idx).reshape({}), idx.reshape({})};
  }
  Tensor idx = argsort(a, dim, descending);
  return {gather(a, dim, idx), idx};
}

std::tuple<Tensor, Tensor> topk(const Tensor& a, int64_t k, int64_t dim, bool largest, bool sorted) {
  (void)sorted;  // the result is always sorted (a valid answer for sorted = false too)
  KILN_CHECK(a.defined(), "topk: input is undefined");
  dim = wrap_dim(dim, a.dim(), "topk");
  const int64_t n = a.dim() == 0 ? 1 : a.size(dim);
  KILN_CHECK(k >= 0 && k <= n, "topk: k (", k, ") is out of range for dimension ", dim, " of size ", n,
             " (input sizes ", a.sizes(), ")");
  Tensor x = a.dim() == 0 ? a.reshape({1}) : a;
  Tensor idx = argsort(x, dim, largest).narrow(dim, 0, k).contiguous();
  Tensor values = gather(x, dim, idx);
  if (a.dim() == 0) return {values.reshape({}), idx.reshape({})};
  return {values, idx};
}

Tensor Tensor::cumsum(int64_t dim) const { return kiln::cumsum(*this, dim); }
Tensor Tensor::cumprod(int64_t dim) const { return kiln::cumprod(*this, dim); }
std::tuple<Tensor, Tensor> Tensor::sort(int64_t dim, bool descending) const {
  return kiln::sort(*this, dim, descending);
}
Tensor Tensor::argsort(int64_t dim, bool descending) const { return kiln::argsort(*this, dim, descending); }
std::tuple<Tensor, Tensor> Tensor::topk(int64_t k, int64_t dim, bool largest, bool sorted) const {
  return kiln::topk(*this, k, dim, largest, sorted);
}

}  // namespace kiln
