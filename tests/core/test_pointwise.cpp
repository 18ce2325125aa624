// Pointwise ops: forward against std:: formulas computed here, gradients by f64 gradcheck, pow,
// clamp, where and comparisons, and special values (dtype promotion, 16-bit dtypes, in-place ops,
// broadcasting, non-contiguous and empty inputs: test_pointwise_dtypes.cpp).
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include <kiln/kiln.h>
#include "tests/core/pointwise_test_util.h"
#include "tests/test_util.h"

using namespace kiln_test;
using namespace pointwise_test;
using kiln::DType;
using kiln::Tensor;
using kiln::TensorOptions;

// ---------------------------------------------------------------- binary arithmetic

TEST_CASE("pointwise: add/sub/mul/div tensor-tensor match the formulas", "[pointwise]") {
  kiln::manual_seed(11);
  for (DType dt : {DType::F32, DType::F64}) {
    INFO("dtype " << kiln::dtype_name(dt));
    Tensor a = kiln::randn({3, 5}, dt);
    Tensor b = kiln::rand({3, 5}, dt) + 0.5;
    auto av = values(a), bv = values(b);
    const double tol = dt == DType::F32 ? 1e-6 : 1e-14;
    Tensor s = a + b, d = a - b, m = a * b, q = a / b;
    CHECK(s.dtype() == dt);
    CHECK(q.dtype() == dt);
    CHECK(s.sizes() == kiln::IntList{3, 5});
    check_close(s, map2(av, bv, [](double x, double y) { return x + y; }), tol, tol, "add");
    check_close(d, map2(av, bv, [](double x, double y) { return x - y; }), tol, tol, "sub");
    check_close(m, map2(av, bv, [](double x, double y) { return x * y; }), tol, tol, "mul");
    check_close(q, map2(av, bv, [](double x, double y) { return x / y; }), tol, tol, "div");
    check_close(kiln::add(a, b, 2.5), map2(av, bv, [](double x, double y) { return x + 2.5 * y; }), tol, tol,
                "add alpha");
    check_close(kiln::sub(a, b, 0.5), map2(av, bv, [](double x, double y) { return x - 0.5 * y; }), tol, tol,
                "sub alpha");
    check_close(a.add(b), values(s), 0, 0, "method add");
    check_close(a.sub(b), values(d), 0, 0, "method sub");
    check_close(a.mul(b), values(m), 0, 0, "method mul");
    check_close(a.div(b), values(q), 0, 0, "method div");
  }
}

TEST_CASE("pointwise: scalar forms, including scalar-on-the-left", "[pointwise]") {
  kiln::manual_seed(12);
  Tensor x = positive({4, 3}, false);
  auto xv = values(x);
  check_close(x + 2.0, map1(xv, [](double v) { return v + 2.0; }), 1e-14, 1e-14, "x + 2");
  check_close(x - 2.0, map1(xv, [](double v) { return v - 2.0; }), 1e-14, 1e-14, "x - 2");
  check_close(x * 3.0, map1(xv, [](double v) { return v * 3.0; }), 1e-14, 1e-14, "x * 3");
  check_close(x / 4.0, map1(xv, [](double v) { return v / 4.0; }), 1e-14, 1e-14, "x / 4");
  check_close(2.0 + x, map1(xv, [](double v) { return 2.0 + v; }), 1e-14, 1e-14, "2 + x");
  check_close(1.0 - x, map1(xv, [](double v) { return 1.0 - v; }), 1e-14, 1e-14, "1 - x");
  check_close(3.0 * x, map1(xv, [](double v) { return 3.0 * v; }), 1e-14, 1e-14, "3 * x");
  check_close(2.0 / x, map1(xv, [](double v) { return 2.0 / v; }), 1e-14, 1e-14, "2 / x");
  check_close(-x, map1(xv, [](double v) { return -v; }), 0, 0, "-x");
  check_close(kiln::neg(x), map1(xv, [](double v) { return -v; }), 0, 0, "neg");
  CHECK((1.0 - x).dtype() == DType::F64);
  CHECK((2.0 / x).dtype() == DType::F64);

  // f32 stays f32 with a double scalar (a Python-style scalar does not promote)
  Tensor y = kiln::randn({5});
  CHECK((y * 2.5).dtype() == DType::F32);
  CHECK((2.5 - y).dtype() == DType::F32);
  CHECK((1.0 / (y + 10.0)).dtype() == DType::F32);
}

TEST_CASE("pointwise: gradcheck of binary arithmetic and scalar forms", "[pointwise][gradcheck]") {
  kiln::manual_seed(13);
  Tensor a = kiln::randn({3, 4}, f64(true));
  Tensor b = positive({3, 4}, true);
  CHECK(kiln::gradcheck([](const TL& in) { return in[0] + in[1]; }, {a, b}));
  CHECK(kiln::gradcheck([](const TL& in) { return in[0] - in[1]; }, {a, b}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::add(in[0], in[1], -1.5); }, {a, b}));
  CHECK(kiln::gradcheck([](const TL& in) { return in[0] * in[1]; }, {a, b}));
  CHECK(kiln::gradcheck([](const TL& in) { return in[0] / in[1]; }, {a, b}));
  CHECK(kiln::gradcheck([](const TL& in) { return in[0] * in[0]; }, {a}));  // same tensor twice
  CHECK(kiln::gradcheck([](const TL& in) { return in[0] / in[0]; }, {b}));
  CHECK(kiln::gradcheck([](const TL& in) { return in[0] + 2.0; }, {a}));
  CHECK(kiln::gradcheck([](const TL& in) { return in[0] - 2.0; }, {a}));
  CHECK(kiln::gradcheck([](const TL& in) { return in[0] * -3.0; }, {a}));
  CHECK(kiln::gradcheck([](const TL& in) { return in[0] / 4.0; }, {a}));
  CHECK(kiln::gradcheck([](const TL& in) { return 1.0 - in[0]; }, {a}));
  CHECK(kiln::gradcheck([](const TL& in) { return 2.0 / in[0]; }, {b}));
  CHECK(kiln::gradcheck([](const TL& in) { return 3.0 * in[0]; }, {a}));
  CHECK(kiln::gradcheck([](const TL& in) { return -in[0]; }, {a}));
}

TEST_CASE("pointwise: 2 / x backward value is -2 / x^2", "[pointwise]") {
  Tensor x = kiln::tensor({0.5, 2.0, -4.0}, f64(true));
  (2.0 / x).sum().backward();
  check_close(x.grad(), {-8.0, -0.5, -0.125}, 1e-14, 1e-14);
}

// ---------------------------------------------------------------- unary

TEST_CASE("pointwise: unary forward against std:: formulas (f32 and f64)", "[pointwise]") {
  kiln::manual_seed(14);
  for (DType dt : {DType::F64, DType::F32}) {
    INFO("dtype " << kiln::dtype_name(dt));
    const double tol = dt == DType::F64 ? 1e-12 : 2e-6;
    Tensor x = (kiln::randn({4, 7}, dt) * 2.0);
    Tensor p = kiln::rand({4, 7}, dt) + 0.1;
    auto xv = values(x), pv = values(p);
    check_close(kiln::exp(x), map1(xv, [](double v) { return std::exp(v); }), tol, tol, "exp");
    check_close(kiln::log(p), map1(pv, [](double v) { return std::log(v); }), tol, tol, "log");
    check_close(kiln::sqrt(p), map1(pv, [](double v) { return std::sqrt(v); }), tol, tol, "sqrt");
    check_close(kiln::rsqrt(p), map1(pv, [](double v) { return 1.0 / std::sqrt(v); }), tol, tol, "rsqrt");
    check_close(kiln::abs(x), map1(xv, [](double v) { return std::abs(v); }), tol, tol, "abs");
    check_close(kiln::tanh(x), map1(xv, [](double v) { return std::tanh(v); }), tol, tol, "tanh");
    check_close(kiln::sigmoid(x), map1(xv, ref_sigmoid), tol, tol, "sigmoid");
    check_close(kiln::relu(x), map1(xv, [](double v) { return v > 0 ? v : 0.0; }), tol, tol, "relu");
    check_close(kiln::gelu(x), map1(xv, ref_gelu), tol, tol, "gelu none");
    check_close(kiln::gelu(x, "none"), map1(xv, ref_gelu), tol, tol, "gelu none explicit");
    check_close(kiln::gelu(x, "tanh"), map1(xv, ref_gelu_tanh), tol, tol, "gelu tanh");
    check_close(kiln::silu(x), map1(xv, [](double v) { return v * ref_sigmoid(v); }), tol, tol, "silu");
    check_close(kiln::erf(x), map1(xv, [](double v) { return std::erf(v); }), tol, tol, "erf");
    check_close(x.square(), map1(xv, [](double v) { return v * v; }), tol, tol, "square");
    // method forms agree with the free functions
    check_close(x.exp(), values(kiln::exp(x)), 0, 0, "x.exp()");
    check_close(p.log(), values(kiln::log(p)), 0, 0, "p.log()");
    check_close(x.gelu("tanh"), values(kiln::gelu(x, "tanh")), 0, 0, "x.gelu(tanh)");
    check_close(x.silu(), values(kiln::silu(x)), 0, 0, "x.silu()");
    check_close(x.sigmoid(), values(kiln::sigmoid(x)), 0, 0, "x.sigmoid()");
    check_close(x.relu(), values(kiln::relu(x)), 0, 0, "x.relu()");
    check_close(x.tanh(), values(kiln::tanh(x)), 0, 0, "x.tanh()");
    check_close(x.abs(), values(kiln::abs(x)), 0, 0, "x.abs()");
    check_close(p.sqrt(), values(kiln::sqrt(p)), 0, 0, "p.sqrt()");
    check_close(p.rsqrt(), values(kiln::rsqrt(p)), 0, 0, "p.rsqrt()");
  }
}

TEST_CASE("pointwise: gelu forms differ and tanh form is the approximation", "[pointwise]") {
  // At x = 1: exact 0.8413447460685429, tanh approx 0.8411919906082768.
  Tensor x = kiln::tensor({1.0, -1.0, 3.0}, f64());
  check_close(kiln::gelu(x, "none"), {0.8413447460685429, -0.15865525393145707, 2.99595030590511}, 1e-12, 1e-12);
  check_close(kiln::gelu(x, "tanh"), {0.8411919906082768, -0.15880800939172324, 2.996362607918227}, 1e-12, 1e-12);
  REQUIRE_THROWS_AS(kiln::gelu(x, "erf"), kiln::Error);
  REQUIRE_THROWS_AS(x.gelu("Tanh"), kiln::Error);
}

TEST_CASE("pointwise: sigmoid and silu stay finite for large |x|", "[pointwise]") {
  Tensor x = kiln::tensor({-1000.0, -50.0, 50.0, 1000.0});
  check_close(kiln::sigmoid(x), {0.0, ref_sigmoid(-50.0), 1.0, 1.0}, 1e-6, 1e-30);
  check_close(kiln::silu(x), {0.0, -50.0 * ref_sigmoid(-50.0), 50.0, 1000.0}, 1e-6, 1e-20);
  check_close(kiln::tanh(x), {-1.0, -1.0, 1.0, 1.0}, 0, 0);
  check_close(kiln::gelu(x), {0.0, 0.0, 50.0, 1000.0}, 1e-6, 1e-20);
  check_close(kiln::gelu(x, "tanh"), {0.0, 0.0, 50.0, 1000.0}, 1e-6, 1e-20);
}

TEST_CASE("pointwise: special values of log/sqrt/rsqrt/exp", "[pointwise]") {
  Tensor x = kiln::tensor({0.0, -1.0, INFINITY}, f64());
  auto l = values(kiln::log(x));
  CHECK(l[0] == -INFINITY);
  CHECK(std::isnan(l[1]));
  CHECK(l[2] == INFINITY);
  auto s = values(kiln::sqrt(x));
  CHECK(s[0] == 0.0);
  CHECK(std::isnan(s[1]));
  auto r = values(kiln::rsqrt(x));
  CHECK(r[0] == INFINITY);
  CHECK(r[2] == 0.0);
  auto e = values(kiln::exp(kiln::tensor({-INFINITY, 1000.0}, f64())));
  CHECK(e[0] == 0.0);
  CHECK(e[1] == INFINITY);
}

TEST_CASE("pointwise: expm1 forward, near zero, special values and dtypes", "[pointwise]") {
  // e - 1, 1/e - 1, ln 2 -> 1, and near 0 where exp(x) - 1 cancels: expm1(x) = x + x^2/2 + x^3/6 + ...
  Tensor x = kiln::tensor({1.0, -1.0, 0.0, 0.69314718055994530942, 1e-10, -1e-10, 1e-300}, f64());
  check_close(kiln::expm1(x),
              {1.7182818284590452354, -0.63212055882855767840, 0.0, 1.0, 1.00000000005e-10, -0.99999999995e-10, 1e-300},
              4e-16, 0, "expm1 f64");
  check_close(x.expm1(), values(kiln::expm1(x)), 0, 0, "x.expm1()");
  // f32 keeps the relative accuracy near 0 that exp(x) - 1 loses entirely (exp(1e-10f) == 1.0f)
  Tensor xf = kiln::tensor({1e-10, -3e-8, 1.0, -1.0});
  Tensor yf = kiln::expm1(xf);
  CHECK(yf.dtype() == DType::F32);
  check_close(yf, {1.00000000005e-10, -2.99999995e-8, 1.7182818284590452354, -0.63212055882855767840}, 2e-7, 0,
              "expm1 f32");
  // PyTorch: expm1(inf) = inf, expm1(-inf) = -1, NaN stays NaN, expm1(-0) = -0
  Tensor special = kiln::tensor({INFINITY, -INFINITY, NAN, -0.0}, f64());
  auto s = values(kiln::expm1(special));
  CHECK(s[0] == INFINITY);
  CHECK(s[1] == -1.0);
  CHECK(std::isnan(s[2]));
  CHECK(s[3] == 0.0);
  CHECK(std::signbit(s[3]));
  // integer input computes in float32, as torch.expm1; 16-bit inputs compute in f32 and round once
  Tensor xi = kiln::tensor({0.0, 1.0, -2.0}, TensorOptions().dtype(DType::I64));
  Tensor yi = kiln::expm1(xi);
  CHECK(yi.dtype() == DType::F32);
  check_close(yi, {0.0, 1.7182818284590452354, -0.86466471676338730811}, 2e-7, 0, "expm1 int64");
  for (DType dt : {DType::F16, DType::BF16}) {
    Tensor yh = kiln::expm1(kiln::tensor({0.5, -0.5, 2.0}).to(dt));
    CHECK(yh.dtype() == dt);
    check_close(yh, {0.64872127070012814685, -0.39346934028736657640, 6.3890560989306502272},
                dt == DType::F16 ? 1e-3 : 8e-3, 0, "expm1 16-bit");
  }
}

TEST_CASE("pointwise: expm1 gradient is g * (y + 1), at special values too", "[pointwise]") {
  // d/dx (e^x - 1) = e^x = y + 1 (PyTorch's derivatives.yaml: grad * (result + 1)):
  // 1 at 0, e at 1, 0 at -inf, inf at inf, NaN at NaN
  Tensor x = kiln::tensor({0.0, 1.0, -INFINITY, INFINITY, NAN}, f64(true));
  kiln::expm1(x).sum().backward();
  check_close(x.grad(), {1.0, 2.7182818284590452354, 0.0, INFINITY, NAN}, 4e-16, 0, "expm1 grad");
  CHECK(kiln::expm1(x).grad_fn()->name() == "Expm1Backward");
}

TEST_CASE("pointwise: gradcheck of unary ops", "[pointwise][gradcheck]") {
  kiln::manual_seed(15);
  Tensor x = kiln::randn({3, 4}, f64(true));
  Tensor nz = away_from_zero({3, 4}, true);
  Tensor p = positive({3, 4}, true);
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::neg(in[0]); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::exp(in[0]); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::log(in[0]); }, {p}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::sqrt(in[0]); }, {p}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::rsqrt(in[0]); }, {p}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::abs(in[0]); }, {nz}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::tanh(in[0]); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::sigmoid(in[0]); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::relu(in[0]); }, {nz}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::gelu(in[0]); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::gelu(in[0], "tanh"); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::silu(in[0]); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::erf(in[0]); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::expm1(in[0]); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return in[0].expm1(); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return in[0].square(); }, {x}));
}

TEST_CASE("pointwise: relu/abs gradients on each side of the kink", "[pointwise]") {
  Tensor x = kiln::tensor({-2.0, -0.5, 0.5, 2.0}, f64(true));
  kiln::relu(x).sum().backward();
  check_close(x.grad(), {0.0, 0.0, 1.0, 1.0}, 0, 0, "relu");
  Tensor y = kiln::tensor({-2.0, -0.5, 0.5, 2.0}, f64(true));
  kiln::abs(y).sum().backward();
  check_close(y.grad(), {-1.0, -1.0, 1.0, 1.0}, 0, 0, "abs");
}

TEST_CASE("pointwise: second derivatives (create_graph) of activations", "[pointwise][gradcheck]") {
  kiln::manual_seed(16);
  Tensor x = kiln::randn({2, 3}, f64(true));
  using Fn = std::function<Tensor(const Tensor&)>;
  std::vector<std::pair<std::string, Fn>> fns = {
      {"tanh", [](const Tensor& t) { return kiln::tanh(t); }},
      {"sigmoid", [](const Tensor& t) { return kiln::sigmoid(t); }},
      {"gelu", [](const Tensor& t) { return kiln::gelu(t); }},
      {"gelu tanh", [](const Tensor& t) { return kiln::gelu(t, "tanh"); }},
      {"silu", [](const Tensor& t) { return kiln::silu(t); }},
      {"exp", [](const Tensor& t) { return kiln::exp(t); }},
      {"erf", [](const Tensor& t) { return kiln::erf(t); }},
      {"expm1", [](const Tensor& t) { return kiln::expm1(t); }},
      {"pow 3", [](const Tensor& t) { return kiln::pow(t, 3.0); }},
  };
  for (auto& [name, f] : fns) {
    INFO(name);
    // The create_graph backward formula gives the same first derivative as the fused kernel...
    Tensor g_fused = kiln::autograd::grad({f(x).sum()}, {x})[0];
    Tensor g_graph = kiln::autograd::grad({f(x).sum()}, {x}, {}, false, true)[0];
    REQUIRE(g_graph.requires_grad());
    check_close(g_graph, values(g_fused), 1e-12, 1e-12, "first derivative");
    // ...and it is itself differentiable correctly.
    CHECK(kiln::gradcheck(
        [f](const TL& in) {
          kiln::EnableGradGuard eg;  // gradcheck evaluates fn under NoGradGuard too
          return kiln::autograd::grad({f(in[0]).sum()}, {in[0]}, {}, true, true)[0];
        },
        {x}));
  }
}

// ---------------------------------------------------------------- pow

TEST_CASE("pointwise: pow with scalar exponent, tensor exponent and scalar base", "[pointwise]") {
  kiln::manual_seed(17);
  Tensor x = positive({3, 4}, false);
  Tensor e = kiln::randn({3, 4}, f64());
  auto xv = values(x), ev = values(e);
  for (double k : {2.0, 3.0, 0.5, -1.5, 1.0, 0.0}) {
    INFO("exponent " << k);
    check_close(kiln::pow(x, k), map1(xv, [k](double v) { return std::pow(v, k); }), 1e-12, 1e-12);
    check_close(x.pow(k), map1(xv, [k](double v) { return std::pow(v, k); }), 1e-12, 1e-12);
  }
  check_close(kiln::pow(x, e), map2(xv, ev, [](double a, double b) { return std::pow(a, b); }), 1e-12, 1e-12);
  check_close(x.pow(e), map2(xv, ev, [](double a, double b) { return std::pow(a, b); }), 1e-12, 1e-12);
  check_close(kiln::pow(2.0, e), map1(ev, [](double b) { return std::pow(2.0, b); }), 1e-12, 1e-12);
  check_close(kiln::pow(0.3, e), map1(ev, [](double b) { return std::pow(0.3, b); }), 1e-12, 1e-12);
  // negative base with an integral exponent
  check_close(kiln::pow(kiln::tensor({-2.0, -3.0}, f64()), 3.0), {-8.0, -27.0}, 1e-14, 0);
  check_close(kiln::pow(kiln::tensor({-2.0, -3.0}, f64()), 2.0), {4.0, 9.0}, 1e-14, 0);
}

TEST_CASE("pointwise: gradcheck of pow", "[pointwise][gradcheck]") {
  kiln::manual_seed(18);
  Tensor x = positive({3, 4}, true);
  Tensor e = kiln::randn({3, 4}, f64(true));
  for (double k : {2.0, 3.0, 0.5, -1.5, 1.0}) {
    INFO("exponent " << k);
    CHECK(kiln::gradcheck([k](const TL& in) { return kiln::pow(in[0], k); }, {x}));
  }
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::pow(in[0], in[1]); }, {x, e}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::pow(2.0, in[0]); }, {e}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::pow(0.7, in[0]); }, {e}));
  // broadcast exponent [4] against base [3,4]
  Tensor e4 = kiln::randn({4}, f64(true));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::pow(in[0], in[1]); }, {x, e4}));
}

TEST_CASE("pointwise: pow(0, e) gradient w.r.t. the exponent is 0, not NaN", "[pointwise]") {
  Tensor base = kiln::tensor({0.0, 2.0}, f64());
  Tensor e = kiln::tensor({2.0, 3.0}, f64(true));
  kiln::pow(base, e).sum().backward();
  check_close(e.grad(), {0.0, 8.0 * std::log(2.0)}, 1e-12, 1e-12);
}

// ---------------------------------------------------------------- clamp, maximum, minimum, where

TEST_CASE("pointwise: clamp, clamp_min, clamp_max forward and gradients", "[pointwise]") {
  kiln::manual_seed(19);
  Tensor x = kiln::randn({5, 6}, f64()) * 2.0;
  auto xv = values(x);
  check_close(kiln::clamp(x, -0.5, 0.7), map1(xv, [](double v) { return std::min(std::max(v, -0.5), 0.7); }), 0, 0);
  check_close(x.clamp(-0.5, 0.7), map1(xv, [](double v) { return std::min(std::max(v, -0.5), 0.7); }), 0, 0);
  check_close(x.clamp_min(0.3), map1(xv, [](double v) { return std::max(v, 0.3); }), 0, 0);
  check_close(x.clamp_max(0.3), map1(xv, [](double v) { return std::min(v, 0.3); }), 0, 0);
  // NaN passes through clamp (PyTorch)
  CHECK(std::isnan(values(kiln::clamp(kiln::tensor({NAN}), 0.0, 1.0))[0]));
  REQUIRE_THROWS_AS(kiln::clamp(x, 1.0, -1.0), kiln::Error);

  Tensor g = kiln::tensor({-2.0, -0.3, 0.2, 0.9, 3.0}, f64(true));
  g.clamp(-0.5, 0.5).sum().backward();
  check_close(g.grad(), {0.0, 1.0, 1.0, 0.0, 0.0}, 0, 0, "clamp grad");
  Tensor h = kiln::tensor({-2.0, -0.3, 0.2, 0.9, 3.0}, f64(true));
  (h.clamp_min(0.0) * 2.0).sum().backward();
  check_close(h.grad(), {0.0, 0.0, 2.0, 2.0, 2.0}, 0, 0, "clamp_min grad");

  Tensor xs = away_from_zero({3, 4}, true);  // |x| in [0.2, 1.2]; bounds 0.1/0.15 stay clear of them
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::clamp(in[0] * 0.5 + 0.0, -0.15, 0.1 + 0.0); }, {xs}));
  CHECK(kiln::gradcheck([](const TL& in) { return in[0].clamp_min(-0.1); }, {xs}));
  CHECK(kiln::gradcheck([](const TL& in) { return in[0].clamp_max(0.1); }, {xs}));
}

TEST_CASE("pointwise: maximum/minimum forward, broadcast and gradients (ties split)", "[pointwise]") {
  kiln::manual_seed(20);
  Tensor a = kiln::randn({3, 4}, f64());
  Tensor b = kiln::randn({3, 4}, f64());
  auto av = values(a), bv = values(b);
  check_close(kiln::maximum(a, b), map2(av, bv, [](double x, double y) { return std::max(x, y); }), 0, 0);
  check_close(kiln::minimum(a, b), map2(av, bv, [](double x, double y) { return std::min(x, y); }), 0, 0);
  // NaN propagates (PyTorch)
  auto mn = values(kiln::maximum(kiln::tensor({NAN, 1.0}), kiln::tensor({0.0, NAN})));
  CHECK(std::isnan(mn[0]));
  CHECK(std::isnan(mn[1]));
  auto mm = values(kiln::minimum(kiln::tensor({NAN, 1.0}), kiln::tensor({0.0, NAN})));
  CHECK(std::isnan(mm[0]));
  CHECK(std::isnan(mm[1]));

  Tensor x = kiln::tensor({1.0, 2.0, 3.0}, f64(true));
  Tensor y = kiln::tensor({3.0, 2.0, 1.0}, f64(true));
  kiln::maximum(x, y).sum().backward();
  check_close(x.grad(), {0.0, 0.5, 1.0}, 0, 0, "maximum grad x");
  check_close(y.grad(), {1.0, 0.5, 0.0}, 0, 0, "maximum grad y");
  Tensor x2 = kiln::tensor({1.0, 2.0, 3.0}, f64(true));
  Tensor y2 = kiln::tensor({3.0, 2.0, 1.0}, f64(true));
  kiln::minimum(x2, y2).sum().backward();
  check_close(x2.grad(), {1.0, 0.5, 0.0}, 0, 0, "minimum grad x");
  check_close(y2.grad(), {0.0, 0.5, 1.0}, 0, 0, "minimum grad y");

  Tensor ga = kiln::randn({3, 4}, f64(true));
  Tensor gb = kiln::randn({4}, f64(true));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::maximum(in[0], in[1]); }, {ga, gb}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::minimum(in[0], in[1]); }, {ga, gb}));
  CHECK(kiln::maximum(ga, gb).sizes() == kiln::IntList{3, 4});
}

TEST_CASE("pointwise: where forward, scalar forms, broadcasting and gradients", "[pointwise]") {
  kiln::manual_seed(21);
  Tensor a = kiln::randn({3, 4}, f64(true));
  Tensor b = kiln::randn({3, 4}, f64(true));
  Tensor cond = kiln::rand({3, 4}, f64()) > 0.5;
  REQUIRE(cond.dtype() == DType::Bool);
  auto av = values(a), bv = values(b), cv = values(cond);
  std::vector<double> want(av.size()), want_s(av.size()), want_s2(av.size());
  for (size_t i = 0; i < av.size(); ++i) {
    want[i] = cv[i] != 0 ? av[i] : bv[i];
    want_s[i] = cv[i] != 0 ? av[i] : -7.0;
    want_s2[i] = cv[i] != 0 ? 2.5 : bv[i];
  }
  check_close(kiln::where(cond, a, b), want, 0, 0);
  check_close(kiln::where(cond, a, -7.0), want_s, 0, 0);
  check_close(kiln::where(cond, 2.5, b), want_s2, 0, 0);

  kiln::where(cond, a, b).sum().backward();
  check_close(a.grad(), cv, 0, 0, "grad a = cond");
  check_close(b.grad(), map1(cv, [](double c) { return 1.0 - c; }), 0, 0, "grad b = !cond");

  // condition [3,1], a [4], b [] broadcast to [3,4]
  Tensor c31 = kiln::tensor({1.0, 0.0, 1.0}).view({3, 1}) > 0.5;
  Tensor a4 = kiln::randn({4}, f64(true));
  Tensor b0 = kiln::scalar_tensor(0.25, f64(true));
  Tensor w = kiln::where(c31, a4, b0);
  REQUIRE(w.sizes() == kiln::IntList{3, 4});
  w.sum().backward();
  check_close(a4.grad(), {2.0, 2.0, 2.0, 2.0}, 0, 0, "a4 grad summed over 2 true rows");
  check_close(b0.grad(), {4.0}, 0, 0, "b0 grad summed over the false row");
  CHECK(kiln::gradcheck([c31](const TL& in) { return kiln::where(c31, in[0], in[1]); }, {a4, b0}));

  REQUIRE_THROWS_AS(kiln::where(kiln::ones({3, 4}), a, b), kiln::Error);          // non-bool condition
  REQUIRE_THROWS_AS(kiln::where(cond, a, kiln::randn({5}, f64())), kiln::Error);  // bad broadcast
}

// ---------------------------------------------------------------- comparisons and predicates

TEST_CASE("pointwise: comparisons return bool tensors with the right values", "[pointwise]") {
  Tensor a = kiln::tensor({1.0, 2.0, 3.0, 4.0});
  Tensor b = kiln::tensor({4.0, 2.0, 1.0, 4.0});
  struct Case {
    const char* name;
    Tensor got;
    std::vector<double> want;
  };
  std::vector<Case> cases = {
      {"==", a == b, {0, 1, 0, 1}},       {"!=", a != b, {1, 0, 1, 0}},         {"<", a < b, {1, 0, 0, 0}},
      {"<=", a <= b, {1, 1, 0, 1}},       {">", a > b, {0, 0, 1, 0}},           {">=", a >= b, {0, 1, 1, 1}},
      {"eq", a.eq(b), {0, 1, 0, 1}},      {"ne", a.ne(b), {1, 0, 1, 0}},        {"lt", a.lt(b), {1, 0, 0, 0}},
      {"le", a.le(b), {1, 1, 0, 1}},      {"gt", a.gt(b), {0, 0, 1, 0}},        {"ge", a.ge(b), {0, 1, 1, 1}},
      {"== 2", a == 2.0, {0, 1, 0, 0}},   {"!= 2", a != 2.0, {1, 0, 1, 1}},     {"< 2.5", a < 2.5, {1, 1, 0, 0}},
      {"<= 2", a <= 2.0, {1, 1, 0, 0}},   {"> 2", a > 2.0, {0, 0, 1, 1}},       {">= 3", a >= 3.0, {0, 0, 1, 1}},
      {"ge(3)", a.ge(3.0), {0, 0, 1, 1}}, {"lt(2.5)", a.lt(2.5), {1, 1, 0, 0}},
  };
  for (auto& c : cases) {
    INFO(c.name);
    CHECK(c.got.dtype() == DType::Bool);
    CHECK(c.got.requires_grad() == false);
    check_close(c.got, c.want, 0, 0, c.name);
  }
  // NaN compares unequal to everything
  Tensor n = kiln::tensor({NAN});
  check_close(n == n, {0}, 0, 0, "nan == nan");
  check_close(n != n, {1}, 0, 0, "nan != nan");
  // broadcasting and mixed dtypes: int64 [3,1] vs f32 [2] compares numerically
  Tensor i = kiln::arange(3, DType::I64).view({3, 1});
  Tensor f = kiln::tensor({0.5, 1.0});
  Tensor r = i > f;
  REQUIRE(r.sizes() == kiln::IntList{3, 2});
  check_close(r, {0, 0, 1, 0, 1, 1}, 0, 0, "int > float broadcast");
  // an integer tensor against a fractional scalar is not truncated
  check_close(kiln::arange(4, DType::I64) < 1.5, {1, 1, 0, 0}, 0, 0, "int < 1.5");
  check_close(kiln::arange(4, DType::I64) == 1.5, {0, 0, 0, 0}, 0, 0, "int == 1.5");
  // bool arithmetic follows PyTorch: + is logical or, * is logical and, result stays bool
  Tensor p = kiln::tensor({1.0, 1.0, 0.0, 0.0}) > 0.5;
  Tensor q = kiln::tensor({1.0, 0.0, 1.0, 0.0}) > 0.5;
  CHECK((p + q).dtype() == DType::Bool);
  check_close(p + q, {1, 1, 1, 0}, 0, 0, "bool + bool");
  check_close(p * q, {1, 0, 0, 0}, 0, 0, "bool * bool");
  check_close(kiln::logical_and(p, q), {1, 0, 0, 0}, 0, 0, "logical_and");
  check_close(kiln::logical_or(p, q), {1, 1, 1, 0}, 0, 0, "logical_or");
  check_close(kiln::logical_not(p), {0, 0, 1, 1}, 0, 0, "logical_not");
  // comparisons of a grad-requiring tensor produce no graph
  Tensor g = kiln::randn({3}, f64(true));
  CHECK_FALSE((g > 0.0).requires_grad());
}

TEST_CASE("pointwise: isnan / isinf / isfinite", "[pointwise]") {
  for (DType dt : {DType::F32, DType::F64, DType::F16, DType::BF16}) {
    INFO("dtype " << kiln::dtype_name(dt));
    Tensor x = kiln::tensor({1.0, NAN, INFINITY, -INFINITY, 0.0, -2.5}).to(dt);
    CHECK(kiln::isnan(x).dtype() == DType::Bool);
    check_close(kiln::isnan(x), {0, 1, 0, 0, 0, 0}, 0, 0, "isnan");
    check_close(kiln::isinf(x), {0, 0, 1, 1, 0, 0}, 0, 0, "isinf");
    check_close(kiln::isfinite(x), {1, 0, 0, 0, 1, 1}, 0, 0, "isfinite");
  }
  Tensor i = kiln::arange(4, DType::I64);
  check_close(kiln::isnan(i), {0, 0, 0, 0}, 0, 0, "isnan int");
  check_close(kiln::isinf(i), {0, 0, 0, 0}, 0, 0, "isinf int");
  check_close(kiln::isfinite(i), {1, 1, 1, 1}, 0, 0, "isfinite int");
}
