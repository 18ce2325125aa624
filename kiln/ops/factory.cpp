// Tensor creation that writes values (full, zeros, ones, arange, tensor, the random factories):
// `empty` and the views live in core; everything that runs a kernel is here.
#include <cmath>
#include <cstring>

#include "kiln/core/generator.h"
#include "kiln/core/tensor.h"
#include "kiln/kernels/copy_fill.h"

namespace kiln {

Tensor full(const IntList& sizes, double value, const TensorOptions& opts) {
  TensorOptions o = opts;
  o.requires_grad(false);
  Tensor t = empty(sizes, o);
  kernels::fill(t, value);
  if (opts.requires_grad()) t.requires_grad_(true);
  return t;
}
Tensor zeros(const IntList& sizes, const TensorOptions& opts) { return full(sizes, 0.0, opts); }
Tensor ones(const IntList& sizes, const TensorOptions& opts) { return full(sizes, 1.0, opts); }
Tensor zeros_like(const Tensor& t) { return zeros(t.sizes(), t.options()); }
Tensor ones_like(const Tensor& t) { return ones(t.sizes(), t.options()); }
Tensor empty_like(const Tensor& t) { return empty(t.sizes(), t.options()); }
Tensor full_like(const Tensor& t, double v) { return full(t.sizes(), v, t.options()); }
Tensor scalar_tensor(double value, const TensorOptions& opts) { return full({}, value, opts); }

Tensor arange(double end, const TensorOptions& opts) { return arange(0, end, 1, opts); }
Tensor arange(double start, double end, double step, const TensorOptions& opts) {
  KILN_CHECK(step != 0, "arange: step must be non-zero");
  KILN_CHECK((end - start) * step >= 0, "arange: (end - start) and step have different signs: start=", start,
             " end=", end, " step=", step);
  auto n = static_cast<int64_t>(std::ceil((end - start) / step));
  Tensor host = empty({n}, TensorOptions().dtype(DType::F64));
  auto* p = host.data_ptr<double>();
  for (int64_t i = 0; i < n; ++i) p[i] = start + static_cast<double>(i) * step;
  Tensor t = host.to(opts.device(), opts.dtype());
  if (opts.requires_grad()) t.requires_grad_(true);
  return t;
}

template <class T> Tensor tensor(const std::vector<T>& values, const TensorOptions& opts) {
  auto n = static_cast<int64_t>(values.size());
  Tensor host = empty({n}, TensorOptions().dtype(dtype_of<T>::value));
  if constexpr (std::is_same_v<T, bool>) {
    auto* p = host.data_ptr<bool>();
    for (int64_t i = 0; i < n; ++i) p[i] = values[i];
  } else if (n > 0) {
    std::memcpy(host.data_ptr(), values.data(), n * sizeof(T));
  }
  Tensor t = host.to(opts.device(), opts.dtype());
  if (opts.requires_grad()) t.requires_grad_(true);
  return t;
}
template Tensor tensor(const std::vector<float>&, const TensorOptions&);
template Tensor tensor(const std::vector<double>&, const TensorOptions&);
template Tensor tensor(const std::vector<int64_t>&, const TensorOptions&);
template Tensor tensor(const std::vector<int32_t>&, const TensorOptions&);
template Tensor tensor(const std::vector<uint8_t>&, const TensorOptions&);
template Tensor tensor(const std::vector<bool>&, const TensorOptions&);
template Tensor tensor(const std::vector<Half>&, const TensorOptions&);
template Tensor tensor(const std::vector<BFloat16>&, const TensorOptions&);

Tensor tensor(std::initializer_list<TensorLiteral> values, const TensorOptions& opts) {
  // The kind of the list: bool if every element is, float if any is, int otherwise.
  bool all_bool = values.size() > 0, any_float = values.size() == 0;
  for (const auto& v : values) {
    all_bool = all_bool && v.kind == TensorLiteral::Kind::Bool;
    any_float = any_float || v.kind == TensorLiteral::Kind::Float;
  }
  TensorOptions o = opts;
  if (!opts.has_dtype()) o.dtype(all_bool ? DType::Bool : any_float ? DType::F32 : DType::I64);
  if (all_bool || !any_float) {
    std::vector<int64_t> v;
    for (const auto& x : values) v.push_back(x.i);
    return tensor(v, o);
  }
  std::vector<double> v;
  for (const auto& x : values) v.push_back(x.f);
  return tensor(v, o);
}

// ---------------------------------------------------------------- random

namespace {
// rand and randn: a floating tensor that the kernel `fill` (fill_uniform, fill_normal) fills from
// the device's default generator; requires_grad is set only after the fill.
template <class FillKernel>
Tensor random_floating(const char* op, const IntList& sizes, const TensorOptions& opts, const FillKernel& fill) {
  KILN_CHECK(is_floating(opts.dtype()), op, ": dtype must be floating point, got ", opts.dtype());
  TensorOptions o = opts;
  o.requires_grad(false);
  Tensor t = empty(sizes, o);
  auto [seed, offset] = default_generator(opts.device()).reserve(t.numel());
  fill(t, seed, offset);
  if (opts.requires_grad()) t.requires_grad_(true);
  return t;
}
}  // namespace

Tensor rand(const IntList& sizes, const TensorOptions& opts) {
  return random_floating("rand", sizes, opts, kernels::fill_uniform);
}

Tensor randn(const IntList& sizes, const TensorOptions& opts) {
  return random_floating("randn", sizes, opts, kernels::fill_normal);
}

Tensor randint(int64_t low, int64_t high, const IntList& sizes, const TensorOptions& opts) {
  KILN_CHECK(high > low, "randint: expected low < high, got low=", low, " high=", high);
  Tensor t = empty(sizes, opts);
  auto [seed, offset] = default_generator(opts.device()).reserve(t.numel());
  kernels::fill_randint(t, low, high, seed, offset);
  return t;
}

Tensor rand_like(const Tensor& t) { return rand(t.sizes(), t.options()); }
Tensor randn_like(const Tensor& t) { return randn(t.sizes(), t.options()); }

}  // namespace kiln
