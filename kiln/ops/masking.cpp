// Differentiable masking ops: tril, triu, masked_fill (+ masked_fill_).
//
// Each is one `kernels::where` (kernels/pointwise.h, so every backend that has `where` runs them)
// selecting between the input and a scalar; the backward routes the gradient through the same
// mask: where(mask, 0, g). A NaN in a zeroed / filled position does not leak into the output or
// the gradient (a select, not a multiply), as in PyTorch.
#include "kiln/core/autograd.h"
#include "kiln/core/shape.h"
#include "kiln/kernels/pointwise.h"

namespace kiln {

using autograd::SavedTensor;
using autograd::TensorList;

namespace {

// out = keep ? a : fill (fill a scalar of a's dtype); records g -> where(keep, g, 0).
Tensor select_or_fill(const char* name, const Tensor& a, const Tensor& keep, double fill) {
  Tensor out = empty(a.sizes(), a.options());
  Tensor s = scalar_tensor(fill, a.options());
  kernels::where(out, keep, a.detach(), s);
  if (autograd::any_requires_grad({&a})) {
    SavedTensor sk(keep, name);
    autograd::record_function(name, {&a}, {&out}, [sk](const TensorList& g) {
      Tensor z = zeros({}, g[0].options());
      return TensorList{where(sk.get(), g[0], z)};
    });
  }
  return out;
}

// keep[i, j] = lower ? j - i <= diagonal : j - i >= diagonal, over a's last two dims.
Tensor triangle_mask(const Tensor& a, int64_t diagonal, bool lower) {
  NoGradGuard ng;
  const int64_t r = a.size(-2), c = a.size(-1);
  TensorOptions o = TensorOptions().dtype(DType::I64).device(a.device());
  Tensor d = arange(static_cast<double>(c), o).unsqueeze(0) - arange(static_cast<double>(r), o).unsqueeze(1);
  return lower ? d <= static_cast<double>(diagonal) : d >= static_cast<double>(diagonal);
}

Tensor triangle(const char* name, const Tensor& a, int64_t diagonal, bool lower) {
  KILN_CHECK(a.defined(), name, ": input is undefined");
  KILN_CHECK(a.dim() >= 2, name, ": input tensor must have at least 2 dimensions, got sizes ", a.sizes());
  return select_or_fill(lower ? "TrilBackward" : "TriuBackward", a, triangle_mask(a, diagonal, lower), 0.0);
}

void check_mask(const Tensor& a, const Tensor& mask, const char* op) {
  KILN_CHECK(a.defined() && mask.defined(), op, ": input or mask is undefined");
  KILN_CHECK(mask.dtype() == DType::Bool, op, ": mask must be a bool tensor, got ", mask.dtype());
  KILN_CHECK(mask.device() == a.device(), op, ": mask is on ", mask.device(), " but the input is on ", a.device());
  IntList b = broadcast_shapes(a.sizes(), mask.sizes(), op);
  KILN_CHECK(b == a.sizes(), op, ": mask of sizes ", mask.sizes(), " does not broadcast to the input's sizes ",
             a.sizes());
}

}  // namespace

Tensor tril(const Tensor& a, int64_t diagonal) { return triangle("tril", a, diagonal, true); }
Tensor triu(const Tensor& a, int64_t diagonal) { return triangle("triu", a, diagonal, false); }

Tensor masked_fill(const Tensor& a, const Tensor& mask, double value) {
  check_mask(a, mask, "masked_fill");
  Tensor keep;
  {
    NoGradGuard ng;
    keep = logical_not(mask);
  }
  return select_or_fill("MaskedFillBackward", a, keep, value);
}

Tensor Tensor::tril(int64_t diagonal) const { return kiln::tril(*this, diagonal); }
Tensor Tensor::triu(int64_t diagonal) const { return kiln::triu(*this, diagonal); }
Tensor Tensor::masked_fill(const Tensor& mask, double value) const { return kiln::masked_fill(*this, mask, value); }

Tensor& Tensor::masked_fill_(const Tensor& mask, double value) {
  check_mask(*this, mask, "masked_fill_");
  Tensor filled;
  {
    NoGradGuard ng;
    filled = kiln::masked_fill(detach(), mask, value);
  }
  return copy_(filled);  // refuses a tensor that requires grad in grad mode; bumps the version
}

}  // namespace kiln
