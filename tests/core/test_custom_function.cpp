// Custom autograd functions written as in libtorch: kiln::autograd::Function<T> with
// AutogradContext (save_for_backward, saved_data, needs_input_grad, mark_dirty,
// mark_non_differentiable) and the checks on what backward returns.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include <kiln/kiln.h>
#include "tests/test_util.h"

using kiln::Tensor;
using kiln::autograd::AutogradContext;
using kiln::autograd::Function;
using kiln::autograd::variable_list;

using namespace kiln_test;

namespace {

// y = scale * x * exp(x), dy/dx = scale * (x + 1) * exp(x); scale is a non-tensor argument.
struct MulExp : Function<MulExp> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, double scale) {
    REQUIRE_FALSE(kiln::GradMode::is_enabled());  // forward runs under no-grad
    ctx->saved_data["scale"] = scale;
    ctx->save_for_backward({x});
    return x * x.exp() * scale;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto x = ctx->get_saved_variables()[0];
    double scale = ctx->saved_data["scale"].toDouble();
    return {grad_outputs[0] * (x + 1.0) * x.exp() * scale};
  }
};

// exp(x), saving its own output.
struct Exp : Function<Exp> {
  static Tensor forward(AutogradContext* ctx, Tensor x) {
    auto y = x.exp();
    ctx->save_for_backward({y});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {g[0] * ctx->get_saved_variables()[0]};
  }
};

// Clamp with a straight-through gradient: the gradient passes unchanged.
struct StraightThroughClamp : Function<StraightThroughClamp> {
  static Tensor forward(AutogradContext*, const Tensor& x, double lo, double hi) { return x.clamp(lo, hi); }
  static variable_list backward(AutogradContext*, variable_list g) {
    return {g[0], Tensor(), Tensor()};  // one per argument: the trailing undefined are allowed
  }
};

// Two tensor inputs (one in a vector), two outputs: (a * b, a + b).
struct MulAdd : Function<MulAdd> {
  static variable_list forward(AutogradContext* ctx, const Tensor& a, std::vector<Tensor> bs) {
    ctx->save_for_backward({a, bs[0]});
    ctx->saved_data["needs"] = std::to_string(ctx->needs_input_grad(0)) + std::to_string(ctx->needs_input_grad(1));
    return {a * bs[0], a + bs[0]};
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    auto s = ctx->get_saved_variables();
    Tensor ga, gb;
    if (ctx->needs_input_grad(0)) ga = g[0] * s[1] + g[1];
    if (ctx->needs_input_grad(1)) gb = g[0] * s[0] + g[1];
    return {ga, gb};
  }
};

struct TooManyGrads : Function<TooManyGrads> {
  static Tensor forward(AutogradContext*, const Tensor& x) { return x * 2.0; }
  static variable_list backward(AutogradContext*, variable_list g) { return {g[0], g[0]}; }
};

struct TooFewGrads : Function<TooFewGrads> {
  static Tensor forward(AutogradContext*, const Tensor& x, const Tensor& y) { return x * y; }
  static variable_list backward(AutogradContext*, variable_list g) { return {g[0]}; }
};

struct WrongSize : Function<WrongSize> {
  static Tensor forward(AutogradContext*, const Tensor& x) { return x.sum(); }
  static variable_list backward(AutogradContext*, variable_list g) { return {g[0]}; }
};

struct SaveInput : Function<SaveInput> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x) {
    ctx->save_for_backward({x});
    return x * x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {g[0] * 2.0 * ctx->get_saved_variables()[0]};
  }
};

// In place: x += 1 on an input, returned (mark_dirty); plus an integer argmax output.
struct AddOneInPlace : Function<AddOneInPlace> {
  static variable_list forward(AutogradContext* ctx, Tensor x) {
    x.add_(1.0);
    ctx->mark_dirty({x});
    auto idx = x.argmax();
    auto mask = x.gt(0.0).to(DType::F64);
    ctx->mark_non_differentiable({idx, mask});
    return {x, idx, mask};
  }
  static variable_list backward(AutogradContext*, variable_list g) { return {g[0]}; }
};

double max_abs_diff(const Tensor& a, const Tensor& b) {
  auto va = values(a), vb = values(b);
  REQUIRE(va.size() == vb.size());
  double m = 0;
  for (size_t i = 0; i < va.size(); ++i) m = std::max(m, std::abs(va[i] - vb[i]));
  return m;
}

}  // namespace

TEST_CASE("custom function: x * exp(x) passes gradcheck", "[custom_function]") {
  auto x = kiln::randn({3, 4}, f64(true));
  REQUIRE(kiln::gradcheck([](const TL& in) { return MulExp::apply(in[0], 1.5); }, {x}));
  REQUIRE(kiln::gradcheck([](const TL& in) { return Exp::apply(in[0]); }, {x}));
  auto y = MulExp::apply(x, 2.0);
  REQUIRE(y.requires_grad());
  REQUIRE(y.grad_fn()->name() == "(anonymous namespace)::MulExpBackward");
  kiln::NoGradGuard ng;
  auto want = x * x.exp() * 2.0;
  REQUIRE(values(y) == values(want));
}

TEST_CASE("custom function: straight-through clamp", "[custom_function]") {
  auto x = kiln::tensor({-3.0, 0.5, 4.0}, f64(true));
  auto y = StraightThroughClamp::apply(x, -1.0, 1.0);
  REQUIRE(values(y) == std::vector<double>{-1.0, 0.5, 1.0});
  (y * kiln::tensor({1.0, 2.0, 3.0}, f64())).sum().backward();
  REQUIRE(values(x.grad()) == std::vector<double>{1.0, 2.0, 3.0});
}

TEST_CASE("custom function: used twice in one graph, and with ops around it", "[custom_function]") {
  auto x = kiln::randn({5}, f64(true));
  REQUIRE(kiln::gradcheck(
      [](const TL& in) {
        auto a = MulExp::apply(in[0] * 0.5, 1.0);
        return MulExp::apply(a, 2.0) + Exp::apply(in[0]) * a;
      },
      {x}));
  // the same tensor through the same function twice: gradients add up
  auto y = (Exp::apply(x) + Exp::apply(x)).sum();
  y.backward();
  kiln::NoGradGuard ng;
  REQUIRE(max_abs_diff(x.grad(), x.exp() * 2.0) < 1e-12);
}

TEST_CASE("custom function: several inputs and outputs, vector args, needs_input_grad", "[custom_function]") {
  auto a = kiln::randn({2, 3}, f64(true));
  auto b = kiln::randn({2, 3}, f64(true));
  REQUIRE(kiln::gradcheck(
      [](const TL& in) {
        auto r = MulAdd::apply(in[0], std::vector<Tensor>{in[1]});
        return r[0] * 3.0 + r[1].exp();
      },
      {a, b}));
  // only the first output used: the second gets zeros
  auto c = kiln::randn({2, 3}, f64(false));
  auto r = MulAdd::apply(a, std::vector<Tensor>{c});
  r[0].sum().backward();
  REQUIRE(max_abs_diff(a.grad(), c) == 0);
  REQUIRE_FALSE(c.grad().defined());
  REQUIRE(r[0].grad_fn() == r[1].grad_fn());
  REQUIRE(r[1].output_nr() == 1);
}

TEST_CASE("custom function: saved_data holds any value", "[custom_function]") {
  AutogradContext ctx;
  ctx.saved_data["i"] = 3;
  ctx.saved_data["d"] = 0.25;
  ctx.saved_data["b"] = true;
  ctx.saved_data["s"] = "mean";
  ctx.saved_data["sizes"] = kiln::IntList{2, 3};
  ctx.saved_data["t"] = kiln::ones({2});
  ctx.saved_data["pair"] = std::make_pair(1, 2.5);
  REQUIRE(ctx.saved_data["i"].isInt());
  REQUIRE(ctx.saved_data["i"].toInt() == 3);
  REQUIRE(ctx.saved_data["i"].toDouble() == 3.0);
  REQUIRE(ctx.saved_data["d"].toDouble() == 0.25);
  REQUIRE(ctx.saved_data["b"].toBool());
  REQUIRE(ctx.saved_data["s"].toStringRef() == "mean");
  REQUIRE(ctx.saved_data["sizes"].toIntVector() == std::vector<int64_t>{2, 3});
  REQUIRE(ctx.saved_data["t"].toTensor().numel() == 2);
  REQUIRE(ctx.saved_data["pair"].to<std::pair<int, double>>().second == 2.5);
  REQUIRE(error_of([&] { ctx.saved_data["d"].toInt(); }).find("expected a value of type int") != std::string::npos);
  REQUIRE(ctx.saved_data["missing"].isNone());
}

TEST_CASE("custom function: backward's gradients are checked", "[custom_function]") {
  auto x = kiln::randn({3}, f64(true));
  auto y = kiln::randn({3}, f64(true));
  auto e = error_of([&] { TooManyGrads::apply(x).sum().backward(); });
  REQUIRE(e.find("backward returned 2 gradients, expected 1") != std::string::npos);
  e = error_of([&] { TooFewGrads::apply(x, y).sum().backward(); });
  REQUIRE(e.find("backward returned 1 gradients, expected 2") != std::string::npos);
  e = error_of([&] { WrongSize::apply(x).backward(); });
  REQUIRE(e.find("gradient of sizes [] for input 0, which has sizes [3]") != std::string::npos);
}

TEST_CASE("custom function: a saved tensor modified in place is refused", "[custom_function]") {
  auto x = kiln::randn({3}, f64(true));
  auto h = x * 1.0;
  auto y = SaveInput::apply(h).sum();
  {
    kiln::NoGradGuard ng;
    h.add_(1.0);
  }
  auto e = error_of([&] { y.backward(); });
  REQUIRE(e.find("modified in place") != std::string::npos);
  REQUIRE(e.find("SaveInput") != std::string::npos);
}

TEST_CASE("custom function: second backward needs retain_graph; no-grad records nothing", "[custom_function]") {
  auto x = kiln::randn({3}, f64(true));
  auto y = Exp::apply(x).sum();
  y.backward(Tensor(), /*retain_graph=*/true);
  y.backward();
  kiln::Tensor want;
  {
    kiln::NoGradGuard ng;
    want = x.exp() * 2.0;
  }
  REQUIRE(max_abs_diff(x.grad(), want) < 1e-12);
  REQUIRE(error_of([&] { y.backward(); }).find("retain_graph") != std::string::npos);
  kiln::NoGradGuard ng;
  auto z = Exp::apply(x);
  REQUIRE_FALSE(z.requires_grad());
}

TEST_CASE("custom function: create_graph differentiates through backward", "[custom_function]") {
  auto x = kiln::tensor({0.3, -0.7}, f64(true));
  auto y = MulExp::apply(x, 1.0).sum();
  auto g = kiln::autograd::grad({y}, {x}, {}, true, true)[0];  // (x + 1) e^x
  g.sum().backward();                                          // (x + 2) e^x
  kiln::NoGradGuard ng;
  REQUIRE(max_abs_diff(x.grad(), (x + 2.0) * x.exp()) < 1e-12);
}

TEST_CASE("custom function: mark_dirty and mark_non_differentiable", "[custom_function]") {
  auto x = kiln::tensor({1.0, -3.0, 2.0}, f64(true));
  auto h = x * 2.0;
  auto r = AddOneInPlace::apply(h);
  REQUIRE(r[0].is_same(h));  // the dirty input is the output, history rebased
  REQUIRE(h.grad_fn() == r[0].grad_fn());
  REQUIRE(values(h) == std::vector<double>{3.0, -5.0, 5.0});
  REQUIRE(r[1].dtype() == DType::I64);
  REQUIRE_FALSE(r[1].requires_grad());
  REQUIRE_FALSE(r[2].requires_grad());
  (r[0] * r[0]).sum().backward();  // d/dx (2x + 1)^2 = 4 (2x + 1)
  REQUIRE(values(x.grad()) == std::vector<double>{12.0, -20.0, 20.0});
  // a leaf that requires grad cannot be dirtied
  auto leaf = kiln::tensor({1.0}, f64(true));
  REQUIRE(error_of([&] { AddOneInPlace::apply(leaf); }).find("leaf") != std::string::npos);
}
