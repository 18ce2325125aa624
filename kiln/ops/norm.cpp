// norm (p-norms over dims), composed of differentiable reductions, on every device.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <string>

#include "kiln/core/autograd.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"

namespace kiln {

using autograd::SavedTensor;
using autograd::TensorList;

// ---------------------------------------------------------------- norm

namespace {
// sign(x) as x's dtype: -1, 0 or 1 (0 at NaN)
Tensor sign_of(const Tensor& x) { return x.gt(0.0).to(x.dtype()) - x.lt(0.0).to(x.dtype()); }
}  // namespace

Tensor norm(const Tensor& x, double p, const IntList& dims_in, bool keepdim) {
  KILN_CHECK(x.defined(), "norm: input is undefined");
  KILN_CHECK(is_floating(x.dtype()), "norm: expected a floating-point tensor, got ", x.dtype());
  KILN_CHECK(!std::isnan(p), "norm: p is NaN");
  IntList dims = reduction_dims(dims_in, x.dim(), "norm");
  if (std::isinf(p)) {  // max / min |x|: amax's gradient splits evenly among ties
    return p > 0 ? kiln::abs(x).amax(dims, keepdim) : kiln::abs(x).amin(dims, keepdim);
  }
  if (p == 0) {  // number of non-zeros: no gradient
    NoGradGuard ng;
    return sum(x.detach().ne(0.0).to(x.dtype()), dims, keepdim);
  }
  if (p == 1) return sum(kiln::abs(x), dims, keepdim);
  // p-norm, with a backward that gives 0 where the norm is 0 (sqrt / pow would give NaN there)
  Tensor out, nk;
  {
    NoGradGuard ng;
    Tensor xd = x.detach();
    Tensor s = p == 2 ? sum(xd * xd, dims, true) : sum(kiln::pow(kiln::abs(xd), p), dims, true);
    nk = p == 2 ? s.sqrt() : kiln::pow(s, 1.0 / p);
    out = keepdim ? nk : sum(nk, dims, false);  // drops the size-1 dims
  }
  if (autograd::any_requires_grad({&x})) {
    SavedTensor sx(x, "norm"), sn(nk, "norm");
    IntList keep_sizes = nk.sizes();
    autograd::record_function("NormBackward", {&x}, {&out}, [=](const TensorList& g) {
      Tensor xv = sx.get();
      // create_graph: the norm must be a function of x for the second derivative
      Tensor n = GradMode::is_enabled() && xv.requires_grad() ? kiln::norm(xv, p, dims, true) : sn.get();
      Tensor gk = g[0].reshape(keep_sizes);
      Tensor scale = where(n == 0.0, 0.0, gk / (p == 2 ? n : kiln::pow(n, p - 1)));
      Tensor dx = p == 2 ? xv * scale : where(xv == 0.0, 0.0, sign_of(xv) * kiln::pow(kiln::abs(xv), p - 1)) * scale;
      return TensorList{dx};
    });
  }
  return out;
}

Tensor Tensor::norm(double p) const { return kiln::norm(*this, p); }
Tensor Tensor::norm(double p, const IntList& dims, bool keepdim) const { return kiln::norm(*this, p, dims, keepdim); }

}  // namespace kiln
