// Differentiable reductions: sum, mean, max/min (full and along a dim), arg max/min, variance,
// logsumexp.
#include <algorithm>
#include <cmath>

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

}  // namespace

Tensor sum(const Tensor& x_in, const IntList& dims_in, bool keepdim) {
  KILN_CHECK(x_in.defined(), "sum: input is undefined");
  Tensor x = x_in.dtype() == sum_dtype(x_in.dtype()) ? x_in : x_in.to(sum_dtype(x_in.dtype()));
  IntList dims = reduction_dims(dims_in, x.dim(), "sum");
  Tensor out = reduce_raw(ReduceOp::Sum, x, dims, keepdim);
  if (autograd::any_requires_grad({&x_in})) {
    IntList in_sizes = x.sizes();
    autograd::record_function("SumBackward", {&x_in}, {&out}, [=](const TensorList& g) {
      return TensorList{expand_grad(g[0], in_sizes, dims, keepdim)};
    });
  }
  return out;
}

Tensor mean(const Tensor& x, const IntList& dims_in, bool keepdim) {
  KILN_CHECK(x.defined(), "mean: input is undefined");
  KILN_CHECK(is_floating(x.dtype()), "mean: expected a floating-point tensor, got ", x.dtype(),
             "; convert with .to(kiln::DType::F32)");
  IntList dims = reduction_dims(dims_in, x.dim(), "mean");
  Tensor out = reduce_raw(ReduceOp::Mean, x, dims, keepdim);
  if (autograd::any_requires_grad({&x})) {
    IntList in_sizes = x.sizes();
    int64_t count = 1;
    for (int64_t d : dims) count *= in_sizes[d];
    autograd::record_function("MeanBackward", {&x}, {&out}, [=](const TensorList& g) {
      return TensorList{expand_grad(g[0] / static_cast<double>(std::max<int64_t>(count, 1)), in_sizes, dims, keepdim)};
    });
  }
  return out;
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

// Full reduction: gradient is split evenly between tied extreme elements (PyTorch's rule; a NaN
// result ties with the NaN elements, so they get the gradient rather than 0/0 everywhere).
Tensor minmax_all(const Tensor& x, bool is_max) {
  const char* name = is_max ? "max" : "min";
  KILN_CHECK(x.defined(), name, ": input is undefined");
  KILN_CHECK(x.numel() > 0, name, ": cannot reduce an empty tensor (sizes ", x.sizes(), ")");
  IntList dims = reduction_dims({}, x.dim(), name);
  Tensor out = reduce_raw(is_max ? ReduceOp::Max : ReduceOp::Min, x, dims, false);
  if (autograd::any_requires_grad({&x})) {
    SavedTensor sx(x, name), so = SavedTensor::output(out, name);
    autograd::record_function(is_max ? "MaxBackward" : "MinBackward", {&x}, {&out}, [=](const TensorList& g) {
      Tensor xs = sx.get(), os = so.get();
      Tensor mask = logical_or(xs == os, logical_and(isnan(xs), isnan(os))).to(g[0].dtype());
      return TensorList{mask * (g[0] / mask.sum())};
    });
  }
  return out;
}

Tensor amaxmin(const Tensor& x, const IntList& dims_in, bool keepdim, bool is_max) {
  const char* name = is_max ? "amax" : "amin";
  KILN_CHECK(x.defined(), name, ": input is undefined");
  IntList dims = reduction_dims(dims_in, x.dim(), name);
  Tensor out = reduce_raw(is_max ? ReduceOp::Max : ReduceOp::Min, x, dims, keepdim);
  if (autograd::any_requires_grad({&x})) {
    SavedTensor sx(x, name), so = SavedTensor::output(out, name);
    IntList in_sizes = x.sizes();
    autograd::record_function(is_max ? "AmaxBackward" : "AminBackward", {&x}, {&out}, [=](const TensorList& g) {
      Tensor ob = expand_grad(so.get(), in_sizes, dims, keepdim);
      Tensor mask = (sx.get() == ob).to(g[0].dtype());
      Tensor count = sum(mask, dims, true);
      return TensorList{mask * expand_grad(g[0], in_sizes, dims, keepdim) / count};
    });
  }
  return out;
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
