#pragma once
// Helpers shared by the CPU test binaries: f64 options, reading a tensor back as doubles,
// element-wise closeness checks, channels-last copies and scratch folders. Header-only; every
// function is inline so several translation units of one binary can include it.
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include <kiln/kiln.h>
#include "error_of.h"  // by its place next to this header: test_cuda has no repository root on its include path

namespace kiln_test {

// The kiln names most tests use, in scope wherever `using namespace kiln_test;` is.
using kiln::DType;
using kiln::IntList;
using kiln::Reduction;
using kiln::Tensor;

// A list of tensors, as gradcheck and multi-input lambdas take it.
using TL = std::vector<kiln::Tensor>;

// f64 tensor options, optionally requiring grad.
inline kiln::TensorOptions f64(bool requires_grad = false) {
  return kiln::TensorOptions().dtype(kiln::DType::F64).requires_grad(requires_grad);
}

// All values of `t` (any dtype, any strides, any device) as doubles, in row-major logical order.
inline std::vector<double> values(const kiln::Tensor& t) {
  kiln::NoGradGuard ng;
  kiln::Tensor c = t.detach().cpu().to(kiln::DType::F64).contiguous();
  const double* p = c.data_ptr<double>();
  return std::vector<double>(p, p + c.numel());
}

// CHECKs |got - want| <= atol + rtol |want| per element; a NaN want needs a NaN, an inf want the same inf.
inline void check_close(const std::vector<double>& got, const std::vector<double>& want, double rtol, double atol,
                        const std::string& what = "") {
  INFO(what);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << " want " << want[i]);
    if (std::isnan(want[i])) {
      CHECK(std::isnan(got[i]));
    } else if (std::isinf(want[i])) {
      CHECK(got[i] == want[i]);
    } else {
      CHECK(std::abs(got[i] - want[i]) <= atol + rtol * std::abs(want[i]));
    }
  }
}

// check_close on the values of a tensor.
inline void check_close(const kiln::Tensor& got, const std::vector<double>& want, double rtol, double atol,
                        const std::string& what = "") {
  check_close(values(got), want, rtol, atol, what);
}

// CHECKs |got - want| <= atol + rtol |want| per element with no special cases: any NaN or inf fails.
inline void check_close_finite(const std::vector<double>& got, const std::vector<double>& want, double rtol,
                               double atol, const std::string& what = "") {
  INFO(what);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << " want " << want[i]);
    CHECK(std::abs(got[i] - want[i]) <= atol + rtol * std::abs(want[i]));
  }
}

// check_close_finite on the values of a tensor.
inline void check_close_finite(const kiln::Tensor& got, const std::vector<double>& want, double rtol, double atol,
                               const std::string& what = "") {
  check_close_finite(values(got), want, rtol, atol, what);
}

// CHECKs that the worst |got - want| / (1 + |want|) is <= tol (reported with its element); any NaN fails.
inline void check_close_rel(const std::vector<double>& got, const std::vector<double>& want, double tol,
                            const std::string& what = "") {
  INFO(what);
  REQUIRE(got.size() == want.size());
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double e = std::abs(got[i] - want[i]) / (1.0 + std::abs(want[i]));
    if (std::isnan(e)) {  // a NaN is the worst possible element: stop at the first one
      worst = e;
      at = i;
      break;
    }
    if (e > worst) worst = e, at = i;
  }
  if (got.empty()) {
    CHECK(worst <= tol);
    return;
  }
  INFO("worst element " << at << ": got " << got[at] << " want " << want[at]);
  CHECK(worst <= tol);
}

// check_close_rel on the values of a tensor.
inline void check_close_rel(const kiln::Tensor& got, const std::vector<double>& want, double tol,
                            const std::string& what = "") {
  check_close_rel(values(got), want, tol, what);
}

// Channels-last copy of an NCHW tensor (same sizes, NHWC memory); differentiable.
inline kiln::Tensor channels_last(const kiln::Tensor& x) {
  return x.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2});
}

// An empty scratch folder <tmp>/kiln-test-utils-<pid>-<name>; with create = false it is only
// removed, so that the code under test has to create it.
inline std::filesystem::path fresh_dir(const std::string& name, bool create = true) {
  std::filesystem::path d =
      std::filesystem::temp_directory_path() / ("kiln-test-utils-" + std::to_string(getpid()) + "-" + name);
  std::filesystem::remove_all(d);
  if (create) std::filesystem::create_directories(d);
  return d;
}

// The whole content of a file as bytes ("" if it cannot be opened).
inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// REQUIREs a defined got with want's sizes, then check_close_rel of their values.
inline void check_same_tensor(const kiln::Tensor& got, const kiln::Tensor& want, double tol, const std::string& what) {
  INFO(what);
  REQUIRE(got.defined());
  REQUIRE(got.sizes() == want.sizes());
  check_close_rel(got, values(want), tol, what);
}

// GradScaler's back-off and growth, on `w` (a parameter of `opt`, on any device) after a clean
// step at scale 65536 with growth_interval 3: an Inf gradient skips the step (w unchanged) and
// halves the scale; 3 clean steps double it back.
inline void check_grad_scaler_backoff_and_growth(kiln::amp::GradScaler& scaler, kiln::optim::Optimizer& opt,
                                                 const kiln::Tensor& w) {
  opt.zero_grad();
  const kiln::Tensor before = w.detach().cpu().clone();
  const int64_t skipped = scaler.num_skipped_steps();
  scaler.scale((w * INFINITY).sum()).backward();
  scaler.step(opt);
  scaler.update();
  REQUIRE(kiln::equal(w.detach().cpu(), before));
  REQUIRE(scaler.get_scale() == 32768.0);
  REQUIRE(scaler.num_skipped_steps() == skipped + 1);  // counted
  opt.zero_grad();
  for (int i = 0; i < 3; ++i) {
    scaler.scale((w * w).sum()).backward();
    scaler.step(opt);
    scaler.update();
    opt.zero_grad();
  }
  REQUIRE(scaler.get_scale() == 65536.0);
  REQUIRE(scaler.num_skipped_steps() == skipped + 1);  // clean steps are not counted
}

// sin(arange(n) * a + b) in f64: inputs that a PyTorch script rebuilds exactly, so reference
// values computed there can be pasted into a test.
inline kiln::Tensor sin_seq(int64_t n, double a, double b) {
  return kiln::sin(kiln::arange(static_cast<double>(n), f64()) * a + b);
}

// sum(t * sin_seq(numel, a, b)): the loss the PyTorch reference scripts take the gradients of, a
// different weight for every element of t (in row-major order).
inline kiln::Tensor weighted_sum(const kiln::Tensor& t, double a, double b) {
  return (t * sin_seq(t.numel(), a, b).view(t.sizes())).sum();
}

// Converts m to f64 and sets its parameter k (in registration order, which is PyTorch's for the
// modules that mirror one) to 0.5 sin(0.1 i + 0.7 k): the reference scripts do the same to the
// PyTorch module, so its outputs can be pasted into a test.
inline void set_params_to_sequence(kiln::nn::Module& m) {
  kiln::NoGradGuard ng;
  m.to(kiln::DType::F64);
  int k = 0;
  for (kiln::Tensor p : m.parameters()) p.copy_(sin_seq(p.numel(), 0.1, 0.7 * k++).view(p.sizes()) * 0.5);
}

// The names of m's parameters, in registration order (recursing into its modules).
inline std::vector<std::string> parameter_names(const kiln::nn::Module& m) {
  std::vector<std::string> names;
  for (const auto& [name, p] : m.named_parameters()) names.push_back(name);
  return names;
}

// m has `count` parameters, and the ones at the positions given have these names (torch's names
// and order, for a module that mirrors one of torch's).
inline void check_parameter_names(const kiln::nn::Module& m, size_t count,
                                  std::initializer_list<std::pair<size_t, const char*>> names_at) {
  const std::vector<std::string> names = parameter_names(m);
  REQUIRE(names.size() == count);
  for (const auto& [i, name] : names_at) CHECK(names[i] == name);
}

// Runs body() once at every CPU level this processor and build have (kiln/core/cpu_isa.h), with
// that level in use and a Catch2 INFO naming it, then goes back to the level from before.
template <class F> void for_each_cpu_isa(F&& body) {
  const kiln::CpuIsa before = kiln::cpu_isa();
  for (int i = 0; i < kiln::kNumCpuIsas; ++i) {
    const auto isa = static_cast<kiln::CpuIsa>(i);
    if (!kiln::cpu_supports(isa) || !kiln::cpu_isa_built(isa)) continue;
    kiln::set_cpu_isa(isa);
    INFO("CPU level " << kiln::cpu_isa_name(isa));
    try {
      body();
    } catch (...) {
      kiln::set_cpu_isa(before);
      throw;
    }
  }
  kiln::set_cpu_isa(before);
}

}  // namespace kiln_test
