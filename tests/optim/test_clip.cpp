// Gradient clipping: the total norm's value (2, 1, p, inf), the scaling, and edge cases.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/core/tensor.h"
#include "kiln/kernels/multi_tensor.h"
#include "kiln/optim/optim.h"
#include "tests/test_util.h"

using namespace kiln;
using kiln_test::values;

namespace {
std::vector<Tensor> two_params() {
  Tensor a = zeros({2}).requires_grad_();
  Tensor b = zeros({2, 1}).requires_grad_();
  a.set_grad(tensor({3.0, -4.0}, DType::F32));
  b.set_grad(tensor({12.0, 0.0}, DType::F32).view({2, 1}));
  return {a, b};
}
}  // namespace

TEST_CASE("clip_grad_norm: total 2-norm and scaling", "[clip]") {
  auto ps = two_params();  // norm sqrt(9 + 16 + 144) = 13
  Tensor n = optim::clip_grad_norm(ps, 100.0);
  CHECK(n.dim() == 0);
  CHECK(n.dtype() == DType::F32);
  CHECK(n.item<double>() == Approx(13.0));
  CHECK(values(ps[0].grad()) == std::vector<double>{3.0, -4.0});  // coefficient 1: unchanged

  n = optim::clip_grad_norm(ps, 6.5);
  CHECK(n.item<double>() == Approx(13.0));
  const float coef = 6.5f / (13.0f + 1e-6f);
  CHECK(values(ps[0].grad())[0] == Approx(3.0 * coef).epsilon(1e-6));
  CHECK(values(ps[1].grad())[0] == Approx(12.0 * coef).epsilon(1e-6));
  CHECK(optim::clip_grad_norm(ps, 100.0).item<double>() == Approx(6.5).epsilon(1e-6));
}

TEST_CASE("clip_grad_norm: inf, 1 and p norms", "[clip]") {
  auto ps = two_params();
  CHECK(optim::clip_grad_norm(ps, 1e9, optim::kInfNorm).item<double>() == 12.0);
  CHECK(optim::clip_grad_norm(ps, 1e9, 1.0).item<double>() == 19.0);
  CHECK(optim::clip_grad_norm(ps, 1e9, 3.0).item<double>() == Approx(std::cbrt(27.0 + 64.0 + 1728.0)));
  Tensor n = optim::clip_grad_norm(ps, 6.0, optim::kInfNorm);
  CHECK(n.item<double>() == 12.0);
  CHECK(values(ps[1].grad())[0] == Approx(6.0).epsilon(1e-6));
  CHECK(values(ps[0].grad())[1] == Approx(-2.0).epsilon(1e-6));
}

TEST_CASE("clip_grad_norm: many chunks, skipped params, NaN, f64", "[clip]") {
  manual_seed(1);
  std::vector<Tensor> ps;
  double ref = 0;
  for (int64_t n : {300000, 5, 65536, 65537}) {
    Tensor p = zeros({n}).requires_grad_();
    p.set_grad(randn({n}));
    for (double v : values(p.grad())) ref += v * v;
    ps.push_back(p);
  }
  ps.push_back(zeros({3}).requires_grad_());  // no gradient: skipped
  CHECK(optim::clip_grad_norm(ps, 1e9).item<double>() == Approx(std::sqrt(ref)).epsilon(1e-6));
  CHECK(optim::clip_grad_norm({zeros({3}).requires_grad_()}, 1.0).item<double>() == 0.0);

  Tensor d = zeros({2}, DType::F64).requires_grad_();
  d.set_grad(tensor({1.0, 1.0}, DType::F64));
  Tensor nd = optim::clip_grad_norm({d}, 1.0);
  CHECK(nd.dtype() == DType::F64);
  CHECK(values(d.grad())[0] == Approx(1.0 / (std::sqrt(2.0) + 1e-6)));

  Tensor bad = zeros({2}).requires_grad_();
  bad.set_grad(tensor({1.0, std::nan("")}, DType::F32));
  CHECK(std::isnan(optim::clip_grad_norm({bad}, 1.0).item<double>()));
  CHECK(std::isnan(optim::clip_grad_norm({bad}, 1.0, optim::kInfNorm).item<double>()));
  bad.set_grad(tensor({1.0, std::nan("")}, DType::F32));
  CHECK_THROWS_AS(optim::clip_grad_norm({bad}, 1.0, 2.0, true), kiln::Error);
  CHECK_THROWS_AS(optim::clip_grad_norm({bad}, 1.0, -1.0), kiln::Error);
}

TEST_CASE("clip_grad_value and multi_tensor_scale_", "[clip]") {
  auto ps = two_params();
  optim::clip_grad_value(ps, 3.5);
  CHECK(values(ps[0].grad()) == std::vector<double>{3.0, -3.5});
  CHECK(values(ps[1].grad()) == std::vector<double>{3.5, 0.0});
  std::vector<Tensor> ts = {ones({70000}, DType::BF16), ones({3})};
  kernels::multi_tensor_scale_(ts, full({}, 0.5));
  CHECK(values(ts[0])[69999] == 0.5);
  CHECK(values(ts[1])[2] == 0.5);
}
