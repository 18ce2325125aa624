#include "kiln/nn/init.h"

#include <cmath>

#include "kiln/core/autograd.h"

namespace kiln::nn::init {

double calculate_gain(const std::string& nl, double param) {
  if (nl == "linear" || nl == "conv1d" || nl == "conv2d" || nl == "sigmoid") return 1.0;
  if (nl == "tanh") return 5.0 / 3.0;
  if (nl == "relu") return std::sqrt(2.0);
  if (nl == "leaky_relu") return std::sqrt(2.0 / (1.0 + param * param));
  if (nl == "selu") return 3.0 / 4.0;
  KILN_FAIL("calculate_gain: unknown nonlinearity '", nl, "'");
}

std::pair<int64_t, int64_t> fans(const Tensor& t) {
  KILN_CHECK(t.dim() >= 2, "init: fan in and fan out need a tensor with at least 2 dimensions, got sizes ", t.sizes());
  int64_t receptive = 1;
  for (int64_t d = 2; d < t.dim(); ++d) receptive *= t.size(d);
  return {t.size(1) * receptive, t.size(0) * receptive};
}

namespace {
Tensor& fill_from(Tensor& t, const Tensor& values) {
  NoGradGuard ng;
  t.copy_(values);
  return t;
}
}  // namespace

Tensor& uniform_(Tensor& t, double low, double high) {
  NoGradGuard ng;
  Tensor r = kiln::rand(t.sizes(), TensorOptions().dtype(DType::F64).device(t.device()));
  return fill_from(t, r * (high - low) + low);
}

Tensor& normal_(Tensor& t, double mean, double std) {
  NoGradGuard ng;
  Tensor r = kiln::randn(t.sizes(), TensorOptions().dtype(DType::F64).device(t.device()));
  return fill_from(t, r * std + mean);
}

Tensor& trunc_normal_(Tensor& t, double mean, double std, double a, double b) {
  KILN_CHECK(a < b, "trunc_normal_: the lower bound a (", a, ") must be below the upper bound b (", b, ")");
  KILN_CHECK(std > 0, "trunc_normal_: std must be positive, got ", std);
  NoGradGuard ng;
  const TensorOptions o = TensorOptions().dtype(DType::F64).device(t.device());
  Tensor r = kiln::randn(t.sizes(), o) * std + mean;
  for (int round = 0;; ++round) {
    Tensor outside = logical_or(r<a, r> b);
    if (!outside.any().item<bool>()) break;
    KILN_CHECK(round < 1000, "trunc_normal_: [", a, ", ", b, "] holds too little of N(", mean, ", ", std,
               "^2) to draw from it");
    r = where(outside, kiln::randn(t.sizes(), o) * std + mean, r);
  }
  return fill_from(t, r);
}

Tensor& constant_(Tensor& t, double value) {
  NoGradGuard ng;
  t.fill_(value);
  return t;
}
Tensor& zeros_(Tensor& t) { return constant_(t, 0.0); }
Tensor& ones_(Tensor& t) { return constant_(t, 1.0); }

Tensor& xavier_uniform_(Tensor& t, double gain) {
  auto [fi, fo] = fans(t);
  double a = gain * std::sqrt(6.0 / static_cast<double>(fi + fo));
  return uniform_(t, -a, a);
}

Tensor& xavier_normal_(Tensor& t, double gain) {
  auto [fi, fo] = fans(t);
  return normal_(t, 0.0, gain * std::sqrt(2.0 / static_cast<double>(fi + fo)));
}

Tensor& kaiming_uniform_(Tensor& t, double a, FanMode mode, const std::string& nl) {
  auto [fi, fo] = fans(t);
  double fan = static_cast<double>(mode == FanMode::FanIn ? fi : fo);
  double bound = calculate_gain(nl, a) * std::sqrt(3.0 / fan);
  return uniform_(t, -bound, bound);
}

Tensor& kaiming_normal_(Tensor& t, double a, FanMode mode, const std::string& nl) {
  auto [fi, fo] = fans(t);
  double fan = static_cast<double>(mode == FanMode::FanIn ? fi : fo);
  return normal_(t, 0.0, calculate_gain(nl, a) / std::sqrt(fan));
}

Tensor& orthogonal_(Tensor& t, double gain) {
  KILN_CHECK(t.dim() >= 2, "orthogonal_: needs at least 2 dimensions, got sizes ", t.sizes());
  const int64_t rows = t.size(0), cols = t.numel() / rows;
  // Gram-Schmidt (modified, twice for stability) on a Gaussian matrix in f64 on the host: the
  // rows (or columns, whichever are fewer) come out orthonormal.
  const bool transpose = rows < cols;
  const int64_t n = transpose ? rows : cols, m = transpose ? cols : rows;  // n vectors of length m
  Tensor g = kiln::randn({n, m}, TensorOptions().dtype(DType::F64));
  double* a = g.data_ptr<double>();
  for (int pass = 0; pass < 2; ++pass) {
    for (int64_t i = 0; i < n; ++i) {
      double* vi = a + i * m;
      for (int64_t j = 0; j < i; ++j) {
        const double* vj = a + j * m;
        double dot = 0;
        for (int64_t k = 0; k < m; ++k) dot += vi[k] * vj[k];
        for (int64_t k = 0; k < m; ++k) vi[k] -= dot * vj[k];
      }
      double norm = 0;
      for (int64_t k = 0; k < m; ++k) norm += vi[k] * vi[k];
      norm = std::sqrt(norm);
      for (int64_t k = 0; k < m; ++k) vi[k] /= norm;
    }
  }
  NoGradGuard ng;
  Tensor q = transpose ? g : g.t();  // [rows, cols]
  return fill_from(t, (q * gain).reshape(t.sizes()).to(t.device()));
}

}  // namespace kiln::nn::init
