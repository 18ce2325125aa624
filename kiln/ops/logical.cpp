// all and any, composed of comparisons and sums, on every device.
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

// ---------------------------------------------------------------- all, any

namespace {
// 1 where a is non-zero (NaN counts as non-zero), as f32.
Tensor nonzero_f32(const Tensor& a) {
  if (a.dtype() == DType::Bool) return a.to(DType::F32);
  return a.ne(0.0).to(DType::F32);
}
Tensor all_any(const Tensor& a, const IntList& dims, bool keepdim, bool is_all, const char* op) {
  KILN_CHECK(a.defined(), op, ": input is undefined");
  NoGradGuard ng;
  Tensor x = a.detach();
  if (x.numel() == 0) {  // all() of nothing is true, any() false
    IntList out_sizes;
    IntList rd = reduction_dims(dims, x.dim(), op);
    for (int64_t d = 0; d < x.dim(); ++d) {
      bool reduced = std::find(rd.begin(), rd.end(), d) != rd.end();
      if (!reduced) out_sizes.push_back(x.size(d));
      else if (keepdim) out_sizes.push_back(1);
    }
    return full(out_sizes, is_all ? 1.0 : 0.0, TensorOptions().dtype(DType::Bool).device(x.device()));
  }
  Tensor nz = nonzero_f32(x);
  Tensor r = is_all ? nz.amin(dims, keepdim) : nz.amax(dims, keepdim);
  return r.gt(0.5);
}
}  // namespace

Tensor Tensor::all() const { return all_any(*this, {}, false, true, "all"); }
Tensor Tensor::all(int64_t dim, bool keepdim) const { return all_any(*this, {dim}, keepdim, true, "all"); }
Tensor Tensor::any() const { return all_any(*this, {}, false, false, "any"); }
Tensor Tensor::any(int64_t dim, bool keepdim) const { return all_any(*this, {dim}, keepdim, false, "any"); }
Tensor all(const Tensor& a) { return a.all(); }
Tensor any(const Tensor& a) { return a.any(); }

}  // namespace kiln
