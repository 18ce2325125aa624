// Differentiable reductions: sum, mean, max/min (full and along a dim), arg max/min, variance,
// logsumexp.
#include <algorithm>
#include <cmath>
#include <functional>

#include "kiln/core/autograd.h"
#include "kiln/core/shape.h"
#include "kiln/kernels/copy_fill.h"
#include "kiln/kernels/matmul.h"
#include "kiln/kernels/pointwise.h"
#include "kiln/kernels/reduce.h"
#include "kiln/kernels/softmax.h"

namespace kiln {

using autograd::SavedTensor;
using autograd::TensorList;
using kernels::ReduceOp;

IntList reduction_dims(const IntList& dims, int64_t ndim, const char* op) {
  IntList out;
  if (dims.empty()) {
    for (int64_t d = 0; d < ndim; ++d) out.push_back(d);
    return out;
  }
  for (int64_t d : dims) out.push_back(wrap_dim(d, ndim, op));
  std::sort(out.begin(), out.end());
  KILN_CHECK(std::adjacent_find(out.begin(), out.end()) == out.end(), op, ": dimension repeated in ", dims);
  if (ndim == 0) out.clear();  // a 0-dim tensor reduces over nothing
  return out;
}

namespace {

IntList reduced_shape(const IntList& sizes, const IntList& dims, bool keepdim) {
  IntList out;
  for (int64_t d = 0; d < static_cast<int64_t>(sizes.size()); ++d) {
    bool r = std::binary_search(dims.begin(), dims.end(), d);
    if (!r) out.push_back(sizes[d]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}

// Broadcasts a reduced gradient (keepdim or not) back over the input's shape.
Tensor expand_grad(const Tensor& g, const IntList& in_sizes, const IntList& dims, bool keepdim) {
  Tensor gk = g;
  if (!keepdim) {
    for (int64_t d : dims) gk = gk.unsqueeze(d);
  }
  return gk.expand(in_sizes);
}

Tensor reduce_raw(ReduceOp op, const Tensor& x, const IntList& dims, bool keepdim) {
  Tensor out = empty(reduced_shape(x.sizes(), dims, keepdim), x.options());
  kernels::reduce(op, out, x, dims);
  return out;
}

DType sum_dtype(DType d) { return is_floating(d) ? d : DType::I64; }

// A reduction's backward, declared once (docs/architecture.md, "Ops"): the node's name, whether
// it keeps the input and the output, and the gradient of the input as differentiable ops of the
// output's gradient and the output, both broadcast back over the input's shape, the input, and
// the reduced dims (sorted).
struct ReduceOperands {
  Tensor g, x, out;  // x and out undefined unless kept
  const IntList& dims;
};
struct ReduceGrad {
  const char* node;
  bool keeps_input_and_output;
  std::function<Tensor(const ReduceOperands&)> formula;
};

// Reduces x (x_in converted to the dtype the reduction computes in) over dims with `op`, and
// records the backward `grad` declares.
Tensor reduce(ReduceOp op, const Tensor& x_in, const Tensor& x, const IntList& dims, bool keepdim,
              const ReduceGrad& grad) {
  Tensor out = reduce_raw(op, x, dims, keepdim);
  if (!autograd::any_requires_grad({&x_in})) return out;
  const SavedTensor sx = grad.keeps_input_and_output ? SavedTensor(x, grad.node) : SavedTensor();
  const SavedTensor so = grad.keeps_input_and_output ? SavedTensor::output(out, grad.node) : SavedTensor();
  autograd::record_function(grad.node, {&x_in}, {&out},
                            [=, f = grad.formula, in_sizes = x.sizes()](const TensorList& g) {
                              const Tensor o = so.get();
                              return TensorList{f({expand_grad(g[0], in_sizes, dims, keepdim), sx.get(),
                                                   o.defined() ? expand_grad(o, in_sizes, dims, keepdim) : o, dims})};
                            });
  return out;
}

// The gradient of a max or min: shared evenly by the elements equal to the result, as PyTorch
// does. For max()/min() over everything a NaN result ties with the NaN elements, so they get the
// gradient; amax/amin, as PyTorch's, have no such rule (a NaN result gives 0/0).
enum class NanTies { No, Yes };
Tensor extremum_grad(const ReduceOperands& r, NanTies nan_ties) {
  Tensor equal = r.x == r.out;
  if (nan_ties == NanTies::Yes) equal = logical_or(equal, logical_and(isnan(r.x), isnan(r.out)));
  const Tensor mask = equal.to(r.g.dtype());
  return mask * r.g / sum(mask, r.dims, true);
}

}  // namespace

Tensor sum(const Tensor& x_in, const IntList& dims_in, bool keepdim) {
  KILN_CHECK(x_in.defined(), "sum: input is undefined");
  Tensor x = x_in.dtype() == sum_dtype(x_in.dtype()) ? x_in : x_in.to(sum_dtype(x_in.dtype()));
  return reduce(ReduceOp::Sum, x_in, x, reduction_dims(dims_in, x.dim(), "sum"), keepdim,
                {"SumBackward", false, [](const ReduceOperands& r) { return r.g; }});
}

Tensor mean(const Tensor& x, const IntList& dims_in, bool keepdim) {
  KILN_CHECK(x.defined(), "mean: input is undefined");
  KILN_CHECK(is_floating(x.dtype()), "mean: expected a floating-point tensor, got ", x.dtype(),
             "; convert with .to(kiln::DType::F32)");
  const IntList dims = reduction_dims(dims_in, x.dim(), "mean");
  int64_t count = 1;
  for (int64_t d : dims) count *= x.size(d);
  return reduce(ReduceOp::Mean, x, x, dims, keepdim,
                {"MeanBackward", false,
                 [n = static_cast<double>(std::max<int64_t>(count, 1))](const ReduceOperands& r) { return r.g / n; }});
}

Tensor Tensor::sum() const { return kiln::sum(*this); }
Tensor Tensor::sum(const IntList& dims, bool keepdim) const {
  KILN_CHECK(!dims.empty(), "sum: pass at least one dim (or call sum() to reduce everything)");
  return kiln::sum(*this, dims, keepdim);
}
Tensor Tensor::mean() const { return kiln::mean(*this); }
Tensor Tensor::mean(const IntList& dims, bool keepdim) const {
  KILN_CHECK(!dims.empty(), "mean: pass at least one dim (or call mean() to reduce everything)");
  return kiln::mean(*this, dims, keepdim);
}

// ---- max / min

namespace {

// Values and indices along one dim; gradient flows to the selected index.
std::tuple<Tensor, Tensor> minmax_dim(const Tensor& x, int64_t dim, bool keepdim, bool is_max) {
  const char* name = is_max ? "max" : "min";
  KILN_CHECK(x.defined(), name, ": input is undefined");
  dim = wrap_dim(dim, x.dim(), name);
  IntList dims = x.dim() == 0 ? IntList{} : IntList{dim};
  IntList shape = reduced_shape(x.sizes(), dims, keepdim);
  Tensor values = empty(shape, x.options());
  Tensor indices = empty(shape, TensorOptions().dtype(DType::I64).device(x.device()));
  kernels::arg_reduce(is_max, values, indices, x, dim);
  if (autograd::any_requires_grad({&x})) {
    IntList in_sizes = x.sizes();
    SavedTensor si(indices, is_max ? "MaxBackward" : "MinBackward");
    autograd::record_function(is_max ? "MaxBackward" : "MinBackward", {&x}, {&values}, [=](const TensorList& g) {
      if (in_sizes.empty()) return TensorList{g[0]};
      // one_hot(indices) along dim times the gradient
      Tensor idx = keepdim ? si.get() : si.get().unsqueeze(dim);
      Tensor gk = keepdim ? g[0] : g[0].unsqueeze(dim);
      Tensor pos = arange(static_cast<double>(in_sizes[dim]), TensorOptions().dtype(DType::I64).device(gk.device()));
      IntList view_shape(in_sizes.size(), 1);
      view_shape[dim] = in_sizes[dim];
      Tensor mask = (pos.view(view_shape) == idx);
      return TensorList{where(mask, gk, zeros({}, gk.options()))};
    });
  }
  return {values, indices};
}

// Full reduction; the gradient goes to the tied extreme elements (extremum_grad).
Tensor minmax_all(const Tensor& x, bool is_max) {
  const char* name = is_max ? "max" : "min";
  KILN_CHECK(x.defined(), name, ": input is undefined");
  KILN_CHECK(x.numel() > 0, name, ": cannot reduce an empty tensor (sizes ", x.sizes(), ")");
  return reduce(is_max ? ReduceOp::Max : ReduceOp::Min, x, x, reduction_dims({}, x.dim(), name), false,
                {is_max ? "MaxBackward" : "MinBackward", true,
                 [](const ReduceOperands& r) { return extremum_grad(r, NanTies::Yes); }});
}

Tensor amaxmin(const Tensor& x, const IntList& dims_in, bool keepdim, bool is_max) {
  const char* name = is_max ? "amax" : "amin";
  KILN_CHECK(x.defined(), name, ": input is undefined");
  return reduce(is_max ? ReduceOp::Max : ReduceOp::Min, x, x, reduction_dims(dims_in, x.dim(), name), keepdim,
                {is_max ? "AmaxBackward" : "AminBackward", true,
                 [](const ReduceOperands& r) { return extremum_grad(r, NanTies::No); }});
}

}  // namespace

Tensor Tensor::max() const { return minmax_all(*this, true); }
Tensor Tensor::min() const { return minmax_all(*this, false); }
std::tuple<Tensor, Tensor> Tensor::max(int64_t dim, bool keepdim) const {
  return minmax_dim(*this, dim, keepdim, true);
}
std::tuple<Tensor, Tensor> Tensor::min(int64_t dim, bool keepdim) const {
  return minmax_dim(*this, dim, keepdim, false);
}
Tensor Tensor::amax(const IntList& dims, bool keepdim) const { return amaxmin(*this, dims, keepdim, true); }
Tensor Tensor::amin(const IntList& dims, bool keepdim) const { return amaxmin(*this, dims, keepdim, false); }

Tensor Tensor::argmax() const {
  NoGradGuard ng;
  return std::get<1>(minmax_dim(detach().reshape({-1}), 0, false, true));
}
Tensor Tensor::argmax(int64_t dim, bool keepdim) const {
  NoGradGuard ng;
  return std::get<1>(minmax_dim(detach(), dim, keepdim, true));
}
Tensor Tensor::argmin(int64_t dim, bool keepdim) const {
  NoGradGuard ng;
  return std::get<1>(minmax_dim(detach(), dim, keepdim, false));
}

// ---- variance: composed from differentiable ops (mean, sub, square, sum)

Tensor Tensor::var(const IntList& dims_in, int64_t correction, bool keepdim) const {
  KILN_CHECK(is_floating(dtype()), "var: expected a floating-point tensor, got ", dtype());
  IntList dims = reduction_dims(dims_in, dim(), "var");
  int64_t n = 1;
  for (int64_t d : dims) n *= sizes()[d];
  Tensor mu = kiln::mean(*this, dims, true);
  Tensor dev = *this - mu;
  Tensor ss = kiln::sum(dev * dev, dims, keepdim);
  // n - correction <= 0 gives inf/nan, as in PyTorch
  return ss / static_cast<double>(n - correction);
}
Tensor Tensor::var() const { return var({}, 1, false); }
Tensor Tensor::std(const IntList& dims, int64_t correction, bool keepdim) const {
  return kiln::sqrt(var(dims, correction, keepdim));
}

Tensor logsumexp(const Tensor& x, const IntList& dims_in, bool keepdim) {
  IntList dims = reduction_dims(dims_in, x.dim(), "logsumexp");
  Tensor m;
  {
    NoGradGuard ng;
    m = reduce_raw(ReduceOp::Max, x.detach(), dims, true);
    m = where(isinf(m), zeros_like(m), m);  // all -inf rows: keep exp finite
  }
  Tensor s = kiln::sum(kiln::exp(x - m), dims, true);
  Tensor out = kiln::log(s) + m;
  if (!keepdim) {
    for (auto it = dims.rbegin(); it != dims.rend(); ++it) out = out.squeeze(*it);
  }
  return out;
}

}  // namespace kiln
