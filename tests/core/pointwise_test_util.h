#pragma once
// What the pointwise tests share (test_pointwise.cpp, test_pointwise_dtypes.cpp): elementwise
// reference maps, the reference activations, and random inputs away from kinks or positive.
#include <cmath>
#include <functional>
#include <vector>

#include <kiln/kiln.h>
#include "tests/test_util.h"

namespace pointwise_test {

using namespace kiln_test;

using kiln::DType;
using kiln::Tensor;
using kiln::TensorOptions;

inline std::vector<double> map1(const std::vector<double>& x, const std::function<double(double)>& f) {
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = f(x[i]);
  return out;
}

inline std::vector<double> map2(const std::vector<double>& x, const std::vector<double>& y,
                                const std::function<double(double, double)>& f) {
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = f(x[i], y[i]);
  return out;
}

inline double ref_sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double ref_gelu(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
inline double ref_gelu_tanh(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

// Random values bounded away from 0 (for kinks: relu, abs, clamp at 0).
inline Tensor away_from_zero(const kiln::IntList& shape, bool rg) {
  kiln::NoGradGuard ng;
  Tensor u = kiln::rand(shape, f64());
  Tensor sign = kiln::where(kiln::rand(shape, f64()) < 0.5, -1.0, kiln::ones(shape, f64()));
  Tensor x = ((u + 0.2) * sign).detach();
  x.requires_grad_(rg);
  return x;
}

inline Tensor positive(const kiln::IntList& shape, bool rg, double lo = 0.5) {
  Tensor x;
  {
    kiln::NoGradGuard ng;
    x = (kiln::rand(shape, f64()) + lo).detach();
  }
  x.requires_grad_(rg);
  return x;
}

}  // namespace pointwise_test
