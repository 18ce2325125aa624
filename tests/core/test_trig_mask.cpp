// sin, cos, tril, triu, masked_fill: forward against values computed here, f64 gradcheck, odd
// sizes and non-contiguous inputs, NaN behaviour as PyTorch, and the errors for bad input.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include <kiln/kiln.h>
#include "tests/test_util.h"

using namespace kiln_test;

namespace {

std::vector<double> map(const std::vector<double>& v, double (*f)(double)) {
  std::vector<double> out;
  for (double x : v) out.push_back(f(x));
  return out;
}

double sin_(double x) { return std::sin(x); }
double cos_(double x) { return std::cos(x); }

}  // namespace

TEST_CASE("trig: sin and cos forward, odd and non-contiguous", "[trig]") {
  Tensor x = kiln::randn({5, 3}, f64()) * 3.0;
  Tensor xt = x.t();  // [3, 5], not contiguous
  REQUIRE_FALSE(xt.is_contiguous());
  check_close(kiln::sin(xt), map(values(xt), sin_), 1e-15, 1e-15);
  check_close(xt.cos(), map(values(xt), cos_), 1e-15, 1e-15);
  Tensor f = x.to(DType::F32);
  CHECK(kiln::sin(f).dtype() == DType::F32);
  check_close(kiln::sin(f), map(values(f), sin_), 1e-6, 1e-6);
  check_close(kiln::cos(f.t()), map(values(f.t()), cos_), 1e-6, 1e-6);
  // exact values
  check_close(kiln::sin(kiln::tensor(std::vector<double>{0.0, M_PI / 2, -M_PI / 6})), {0.0, 1.0, -0.5}, 1e-15, 1e-15);
  check_close(kiln::cos(kiln::tensor(std::vector<double>{0.0, M_PI, M_PI / 3})), {1.0, -1.0, 0.5}, 1e-15, 1e-15);
  // integers compute in f32, as PyTorch
  Tensor i = kiln::tensor(std::vector<int64_t>{0, 1, 2});
  CHECK(kiln::sin(i).dtype() == DType::F32);
  check_close(kiln::cos(i), {1.0, std::cos(1.0), std::cos(2.0)}, 1e-6, 1e-7);
}

TEST_CASE("trig: NaN and inf give NaN, as PyTorch", "[trig][nan]") {
  const double inf = INFINITY;
  Tensor x = kiln::tensor(std::vector<double>{NAN, inf, -inf});
  for (double v : values(kiln::sin(x))) CHECK(std::isnan(v));
  for (double v : values(kiln::cos(x))) CHECK(std::isnan(v));
}

TEST_CASE("trig: gradcheck of sin and cos, and their second derivatives", "[trig][gradcheck]") {
  Tensor x = kiln::randn({3, 5}, f64(true));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::sin(in[0]); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::cos(in[0].t()); }, {x}));
  // d/dx of sin'(x) = cos(x) through create_graph: -sin(x)
  Tensor y = kiln::randn({7}, f64(true));
  Tensor g = kiln::autograd::grad({kiln::sin(y).sum()}, {y}, {}, true, true)[0];
  check_close(g, values(kiln::cos(y.detach())), 1e-14, 1e-14);
  Tensor gg = kiln::autograd::grad({g.sum()}, {y})[0];
  check_close(gg, values(-kiln::sin(y.detach())), 1e-14, 1e-14);
}

TEST_CASE("masking: tril and triu exact values with diagonals", "[masking]") {
  Tensor a = kiln::arange(1, 13, 1, DType::F64).view({3, 4});  // 1..12
  check_close(kiln::tril(a), {1, 0, 0, 0, 5, 6, 0, 0, 9, 10, 11, 0}, 0, 0);
  check_close(a.tril(1), {1, 2, 0, 0, 5, 6, 7, 0, 9, 10, 11, 12}, 0, 0);
  check_close(a.tril(-1), {0, 0, 0, 0, 5, 0, 0, 0, 9, 10, 0, 0}, 0, 0);
  check_close(kiln::triu(a), {1, 2, 3, 4, 0, 6, 7, 8, 0, 0, 11, 12}, 0, 0);
  check_close(a.triu(2), {0, 0, 3, 4, 0, 0, 0, 8, 0, 0, 0, 0}, 0, 0);
  check_close(a.triu(-1), {1, 2, 3, 4, 5, 6, 7, 8, 0, 10, 11, 12}, 0, 0);
  check_close(a.tril(-5), std::vector<double>(12, 0.0), 0, 0);
  check_close(a.triu(-5), values(a), 0, 0);
  // batched and non-contiguous: tril of the transpose of each [3, 3] matrix
  Tensor b = kiln::arange(0, 18, 1, DType::F64).view({2, 3, 3}).transpose(1, 2);
  REQUIRE_FALSE(b.is_contiguous());
  check_close(b.tril(), {0, 0, 0, 1, 4, 0, 2, 5, 8, 9, 0, 0, 10, 13, 0, 11, 14, 17}, 0, 0);
  // dtype kept (int64, bool)
  Tensor i = kiln::ones({2, 2}, DType::I64);
  CHECK(i.triu().dtype() == DType::I64);
  check_close(i.triu(), {1, 1, 0, 1}, 0, 0);
  Tensor m = kiln::ones({3, 3}, DType::Bool).tril();
  CHECK(m.dtype() == DType::Bool);
  check_close(m, {1, 0, 0, 1, 1, 0, 1, 1, 1}, 0, 0);
}

TEST_CASE("masking: tril/triu zero a NaN outside the triangle, and their gradients", "[masking][nan][gradcheck]") {
  Tensor a = kiln::tensor(std::vector<double>{1, NAN, NAN, 4}).view({2, 2});
  check_close(a.tril(), {1, 0, NAN, 4}, 0, 0);
  check_close(a.triu(), {1, NAN, 0, 4}, 0, 0);
  Tensor x = kiln::randn({2, 3, 5}, f64(true));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::tril(in[0], 1); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::triu(in[0].transpose(1, 2), -1); }, {x}));
  Tensor y = kiln::randn({3, 3}, f64(true));
  kiln::tril(y).sum().backward();
  check_close(y.grad(), {1, 0, 0, 1, 1, 0, 1, 1, 1}, 0, 0);
}

TEST_CASE("masking: tril/triu errors", "[masking][errors]") {
  CHECK_THROWS_WITH(kiln::tril(kiln::zeros({4})),
                    Catch::Contains("tril: input tensor must have at least 2 dimensions"));
  CHECK_THROWS_AS(kiln::triu(kiln::zeros({})), kiln::Error);
}

TEST_CASE("masking: masked_fill values, broadcast mask, NaN and -inf", "[masking]") {
  Tensor a = kiln::arange(0, 6, 1, DType::F64).view({2, 3});
  Tensor mask = kiln::tensor(std::vector<int64_t>{1, 0, 1}).view({1, 3}) == 1.0;
  check_close(kiln::masked_fill(a, mask, -1.0), {-1, 1, -1, -1, 4, -1}, 0, 0);
  check_close(a.masked_fill(mask, -INFINITY), {-INFINITY, 1, -INFINITY, -INFINITY, 4, -INFINITY}, 0, 0);
  check_close(a.masked_fill(mask, NAN), {NAN, 1, NAN, NAN, 4, NAN}, 0, 0);
  // a causal attention mask on a non-contiguous input
  Tensor s = kiln::arange(0, 9, 1, DType::F32).view({3, 3}).t();
  Tensor causal = kiln::ones({3, 3}, DType::Bool).triu(1);
  check_close(s.masked_fill(causal, -INFINITY), {0, -INFINITY, -INFINITY, 1, 4, -INFINITY, 2, 5, 8}, 0, 0);
  // a NaN under the mask is replaced; dtype is kept for integers (value converted)
  Tensor n = kiln::tensor(std::vector<double>{NAN, 1.0});
  check_close(n.masked_fill(kiln::tensor(std::vector<int64_t>{1, 0}) == 1.0, 7.0), {7, 1}, 0, 0);
  Tensor i = kiln::tensor(std::vector<int64_t>{5, 6, 7});
  Tensor r = i.masked_fill(i > 5.0, 0.0);
  CHECK(r.dtype() == DType::I64);
  check_close(r, {5, 0, 0}, 0, 0);
}

TEST_CASE("masking: masked_fill gradient is zero under the mask", "[masking][gradcheck]") {
  Tensor x = kiln::randn({3, 5}, f64(true));
  Tensor mask = kiln::rand({3, 5}, DType::F64) > 0.5;
  CHECK(kiln::gradcheck([&](const TL& in) { return kiln::masked_fill(in[0], mask, 2.5); }, {x}));
  Tensor y = kiln::tensor(std::vector<double>{1.0, 2.0, 3.0}).requires_grad_(true);
  Tensor m = kiln::tensor(std::vector<int64_t>{0, 1, 0}) == 1.0;
  (y.masked_fill(m, 0.0) * 2.0).sum().backward();
  check_close(y.grad(), {2, 0, 2}, 0, 0);
}

TEST_CASE("masking: masked_fill_ in place, and errors", "[masking][errors]") {
  Tensor a = kiln::zeros({2, 3}, DType::F64);
  Tensor view = a.t();
  a.masked_fill_(kiln::ones({3, 3}, DType::Bool).tril().select(0, 0).unsqueeze(0), 4.0);  // [1, 3] mask: first column
  check_close(view, {4, 4, 0, 0, 0, 0}, 0, 0);
  Tensor w = kiln::zeros({3}, f64(true));
  CHECK_THROWS_AS(w.masked_fill_(kiln::ones({3}, DType::Bool), 1.0), kiln::Error);
  CHECK_THROWS_WITH(kiln::masked_fill(a, kiln::ones({2, 3}), 1.0), Catch::Contains("mask must be a bool tensor"));
  CHECK_THROWS_WITH(kiln::masked_fill(kiln::zeros({3}), kiln::ones({2, 3}, DType::Bool), 1.0),
                    Catch::Contains("does not broadcast"));
  CHECK_THROWS_AS(kiln::masked_fill(kiln::zeros({3}), kiln::ones({2}, DType::Bool), 1.0), kiln::Error);
}
