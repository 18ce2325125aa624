// The autograd engine: graph shapes, retain_graph, no-grad, hooks, anomaly mode, saved-tensor
// release, the version counter and autograd::grad.
#include <catch2/catch.hpp>

#include <cmath>
#include <thread>

#include <kiln/kiln.h>
#include "tests/test_util.h"

using kiln::Tensor;
using kiln::TensorOptions;

using namespace kiln_test;

namespace {
double at(const Tensor& t, int64_t i) { return t.contiguous().reshape({-1})[i].item<double>(); }
}  // namespace

TEST_CASE("diamond graph accumulates both paths", "[autograd]") {
  auto x = kiln::tensor({2.0, -1.5}, f64(true));
  auto a = x * 3.0;  // da/dx = 3
  auto b = a * a;    // path 1: 2a * 3 = 18x
  auto c = a.exp();  // path 2: e^a * 3
  (b + c).sum().backward();
  for (int i = 0; i < 2; ++i) {
    double xv = at(x.detach(), i);
    REQUIRE(at(x.grad(), i) == Approx(18 * xv + 3 * std::exp(3 * xv)));
  }
}

TEST_CASE("fan-out of one tensor into the same op", "[autograd]") {
  auto x = kiln::tensor({1.5, 2.0, -3.0}, f64(true));
  (x * x * x).sum().backward();  // 3x^2
  REQUIRE(at(x.grad(), 0) == Approx(3 * 1.5 * 1.5));
  REQUIRE(at(x.grad(), 2) == Approx(27.0));
}

TEST_CASE("gradients accumulate into leaves across backward calls", "[autograd]") {
  auto x = kiln::tensor({1.0, 2.0}, f64(true));
  (x * 2.0).sum().backward();
  (x * 5.0).sum().backward();
  REQUIRE(at(x.grad(), 0) == Approx(7.0));
  REQUIRE(at(x.grad(), 1) == Approx(7.0));
}

TEST_CASE("backward twice needs retain_graph", "[autograd]") {
  auto x = kiln::tensor({1.0, 2.0}, f64(true));
  auto y = (x * x).sum();
  y.backward(Tensor(), /*retain_graph=*/true);
  y.backward();
  REQUIRE(at(x.grad(), 1) == Approx(8.0));  // 2 * 2x
  REQUIRE_THROWS_AS(y.backward(), kiln::Error);
  try {
    y.backward();
  } catch (const kiln::Error& e) {
    REQUIRE(std::string(e.what()).find("retain_graph") != std::string::npos);
  }
}

TEST_CASE("saved tensors are released after backward", "[autograd]") {
  auto x = kiln::randn({64, 64}, f64(true));
  auto h = x.exp();                                  // saves its output
  std::weak_ptr<kiln::Storage> saved = h.storage();  // the data the graph keeps
  auto loss = h.sum();
  h = Tensor();  // only the graph holds the exp output now
  REQUIRE_FALSE(saved.expired());
  loss.backward();
  REQUIRE(saved.expired());
}

TEST_CASE("retain_graph keeps saved tensors alive", "[autograd]") {
  auto x = kiln::randn({8}, f64(true));
  auto h = x.exp();
  std::weak_ptr<kiln::Storage> saved = h.storage();  // the data the graph keeps
  auto loss = h.sum();
  h = Tensor();
  loss.backward(Tensor(), true);
  REQUIRE_FALSE(saved.expired());
}

TEST_CASE("backward with an explicit gradient; non-scalar needs one", "[autograd]") {
  auto x = kiln::tensor({1.0, 2.0, 3.0}, f64(true));
  auto y = x * 2.0;
  REQUIRE_THROWS_AS(y.backward(), kiln::Error);
  y.backward(kiln::tensor({1.0, 10.0, 100.0}, TensorOptions().dtype(kiln::DType::F64)));
  REQUIRE(at(x.grad(), 2) == Approx(200.0));
  REQUIRE_THROWS_AS(y.backward(kiln::ones({2}, kiln::DType::F64)), kiln::Error);  // wrong shape
}

TEST_CASE("no-grad guard records nothing; enable-grad re-enables", "[autograd]") {
  auto x = kiln::randn({3}, TensorOptions().requires_grad(true));
  {
    kiln::NoGradGuard ng;
    auto y = x * 2.0;
    REQUIRE_FALSE(y.requires_grad());
    REQUIRE(y.grad_fn() == nullptr);
    {
      kiln::EnableGradGuard eg;
      auto z = x * 2.0;
      REQUIRE(z.requires_grad());
    }
    REQUIRE_FALSE(kiln::GradMode::is_enabled());
  }
  REQUIRE(kiln::GradMode::is_enabled());
  REQUIRE_THROWS_AS((x.detach() * 2.0).sum().backward(), kiln::Error);
}

TEST_CASE("grad mode is thread-local", "[autograd]") {
  kiln::NoGradGuard ng;
  bool other = false;
  std::thread t([&] { other = kiln::GradMode::is_enabled(); });
  t.join();
  REQUIRE(other);
  REQUIRE_FALSE(kiln::GradMode::is_enabled());
}

TEST_CASE("tensor hooks run in registration order and can replace the gradient", "[autograd]") {
  auto x = kiln::tensor({1.0, 2.0}, f64(true));
  auto y = x * 3.0;
  std::vector<int> order;
  y.register_hook([&](const Tensor& g) {
    order.push_back(1);
    return g * 2.0;  // replaces dL/dy
  });
  y.register_hook([&](const Tensor& g) {
    order.push_back(2);
    REQUIRE(at(g, 0) == Approx(2.0));  // sees the first hook's result
    return Tensor();
  });
  y.sum().backward();
  REQUIRE(order == std::vector<int>{1, 2});
  REQUIRE(at(x.grad(), 0) == Approx(6.0));
}

TEST_CASE("leaf hooks and post-accumulate-grad hooks", "[autograd]") {
  auto w = kiln::tensor({1.0, 2.0}, f64(true));
  std::vector<std::string> events;
  w.register_hook([&](const Tensor& g) {
    events.push_back("hook");
    return g * 10.0;
  });
  w.register_post_accumulate_grad_hook([&](Tensor& p) {
    events.push_back("post");
    REQUIRE(p.grad().defined());
    REQUIRE(at(p.grad(), 0) == Approx(30.0));
  });
  (w * 3.0).sum().backward();
  REQUIRE(events == std::vector<std::string>{"hook", "post"});
  auto nonleaf = w * 2.0;
  REQUIRE_THROWS_AS(nonleaf.register_post_accumulate_grad_hook([](Tensor&) {}), kiln::Error);
}

TEST_CASE("queue_callback runs after the whole backward pass, in order, and may queue more", "[autograd]") {
  auto a = kiln::tensor({1.0, 2.0}, f64(true));
  auto b = kiln::tensor({3.0}, f64(true));
  std::vector<std::string> events;
  // Queued from a's hook: b's gradient (accumulated later in the pass) must exist by then.
  a.register_post_accumulate_grad_hook([&](Tensor&) {
    events.push_back("a");
    kiln::autograd::queue_callback([&] {
      events.push_back("first");
      REQUIRE(b.grad().defined());
      REQUIRE(at(b.grad(), 0) == Approx(3.0));
      kiln::autograd::queue_callback([&] { events.push_back("nested"); });
    });
    kiln::autograd::queue_callback([&] { events.push_back("second"); });
  });
  b.register_post_accumulate_grad_hook([&](Tensor&) { events.push_back("b"); });
  ((a * 2.0).sum() + (b * b).sum() * 0.5).backward();
  REQUIRE(events.size() == 5);
  REQUIRE(events[2] == "first");
  REQUIRE(events[3] == "second");
  REQUIRE(events[4] == "nested");
  // Outside backward it is an error; a failed backward drops what was queued.
  REQUIRE_THROWS_WITH(kiln::autograd::queue_callback([] {}), Catch::Contains("while backward runs"));
  bool ran = false;
  auto c = kiln::tensor({1.0}, f64(true));
  c.register_post_accumulate_grad_hook([&](Tensor&) { kiln::autograd::queue_callback([&] { ran = true; }); });
  auto d = kiln::tensor({1.0}, f64(true));
  d.register_hook([](const Tensor& g) -> Tensor { throw kiln::Error("hook failed"); });
  REQUIRE_THROWS_WITH((c * 1.0 + d * 1.0).sum().backward(), Catch::Contains("hook failed"));
  REQUIRE_FALSE(ran);
  (c * 1.0).sum().backward();  // the engine is usable afterwards
  REQUIRE(ran);
}

TEST_CASE("retain_grad keeps a non-leaf's gradient", "[autograd]") {
  auto x = kiln::tensor({1.0, -2.0}, f64(true));
  auto y = x * 4.0;
  y.retain_grad();
  (y * y).sum().backward();
  REQUIRE(at(y.grad(), 1) == Approx(2 * -8.0));
}

TEST_CASE("anomaly mode names the op whose backward produced NaN", "[autograd]") {
  auto x = kiln::tensor({0.0, 1.0}, f64(true));
  auto y = x.sqrt();  // d/dx sqrt at 0 is inf; times 0 -> NaN downstream
  auto loss = (y * 0.0).sum();
  {
    kiln::autograd::DetectAnomalyGuard guard;
    try {
      loss.backward(Tensor(), true);
      FAIL("expected anomaly detection to throw");
    } catch (const kiln::Error& e) {
      REQUIRE(std::string(e.what()).find("SqrtBackward") != std::string::npos);
    }
  }
  REQUIRE_FALSE(kiln::autograd::is_anomaly_enabled());
  REQUIRE_NOTHROW(loss.backward());  // off by default: NaN passes silently
  REQUIRE(std::isnan(at(x.grad(), 0)));
}

TEST_CASE("modifying a saved tensor in place is rejected", "[autograd]") {
  auto w = kiln::tensor({1.0, 2.0}, f64(true));
  auto x = kiln::tensor({3.0, 4.0}, TensorOptions().dtype(kiln::DType::F64));
  auto loss = (w * x).sum();  // saves x for dL/dw
  x.add_(1.0);
  try {
    loss.backward();
    FAIL("expected a version-counter error");
  } catch (const kiln::Error& e) {
    std::string msg = e.what();
    REQUIRE(msg.find("modified in place") != std::string::npos);
    REQUIRE(msg.find("MulBackward") != std::string::npos);
  }
}

TEST_CASE("in-place on a leaf that requires grad is refused in grad mode", "[autograd]") {
  auto w = kiln::ones({2}, TensorOptions().requires_grad(true));
  REQUIRE_THROWS_AS(w.add_(1.0), kiln::Error);
  {
    kiln::NoGradGuard ng;
    w.add_(1.0);  // an optimizer step
  }
  REQUIRE(at(w, 0) == Approx(2.0));
}

TEST_CASE("views share the version counter", "[autograd]") {
  auto base = kiln::zeros({4});
  auto v = base.slice(0, 1, 3);
  auto before = base.version();
  v.fill_(5.0);
  REQUIRE(base.version() == before + 1);
  REQUIRE(at(base, 1) == 5.0);
  REQUIRE(at(base, 0) == 0.0);
}

TEST_CASE("autograd::grad returns gradients without touching .grad()", "[autograd]") {
  auto x = kiln::tensor({1.0, 2.0}, f64(true));
  auto y = kiln::tensor({3.0, 5.0}, f64(true));
  auto z = (x * y + x * x).sum();
  auto grads = kiln::autograd::grad({z}, {x, y});
  REQUIRE(at(grads[0], 0) == Approx(3.0 + 2.0));
  REQUIRE(at(grads[1], 1) == Approx(2.0));
  REQUIRE_FALSE(x.grad().defined());
  REQUIRE_FALSE(y.grad().defined());
  auto unused = kiln::tensor({1.0}, f64(true));
  auto z2 = (x * 2.0).sum();
  REQUIRE_THROWS_AS(kiln::autograd::grad({z2}, {unused}), kiln::Error);
}

TEST_CASE("create_graph gives second derivatives", "[autograd]") {
  auto x = kiln::tensor({0.3, -0.7, 1.1}, f64(true));
  auto y = (x * x * x).sum();  // dy/dx = 3x^2, d2y/dx2 = 6x
  auto g = kiln::autograd::grad({y}, {x}, {}, true, true)[0];
  REQUIRE(g.requires_grad());
  auto gg = kiln::autograd::grad({g.sum()}, {x})[0];
  REQUIRE(at(gg, 1) == Approx(6 * -0.7));
  // through the fused activations' composite double-backward formulas
  for (const char* op : {"tanh", "sigmoid", "gelu", "silu"}) {
    auto f = [op](const std::vector<Tensor>& in) {
      std::string o = op;
      Tensor a = o == "tanh"      ? in[0].tanh()
                 : o == "sigmoid" ? in[0].sigmoid()
                 : o == "gelu"    ? in[0].gelu()
                                  : in[0].silu();
      return kiln::autograd::grad({a.sum()}, {in[0]}, {}, true, true)[0];
    };
    INFO(op);
    REQUIRE(kiln::gradcheck(f, {kiln::randn({5}, f64(true))}));
  }
}

TEST_CASE("views are differentiable", "[autograd]") {
  auto f = [](const std::vector<Tensor>& in) {
    const Tensor& x = in[0];
    return x.transpose(0, 1).reshape({-1}).slice(0, 1, 11, 3) * 2.0 +
           x.select(1, 2).unsqueeze(0).expand({4, 3}).flatten().narrow(0, 2, 4) + x.permute({1, 0})[3].squeeze().sum();
  };
  REQUIRE(kiln::gradcheck(f, {kiln::randn({3, 4}, f64(true))}));
}

TEST_CASE("backward errors on tensors that do not require grad", "[autograd]") {
  auto x = kiln::randn({2});
  REQUIRE_THROWS_AS(x.sum().backward(), kiln::Error);
  REQUIRE_THROWS_AS(kiln::arange(3, kiln::DType::I64).requires_grad_(true), kiln::Error);
}

TEST_CASE("gradcheck catches a wrong gradient", "[autograd]") {
  // A deliberately wrong backward: the hook doubles the true gradient.
  auto f = [](const std::vector<Tensor>& in) {
    Tensor y = in[0] * 1.0;
    y.register_hook([](const Tensor& g) { return g * 2.0; });
    return y;
  };
  REQUIRE_THROWS_AS(kiln::gradcheck(f, {kiln::randn({3}, f64(true))}), kiln::Error);
}

TEST_CASE("detach shares storage but not history", "[autograd]") {
  auto x = kiln::randn({3}, TensorOptions().requires_grad(true));
  auto y = x * 2.0;
  auto d = y.detach();
  REQUIRE_FALSE(d.requires_grad());
  REQUIRE(d.data_ptr() == y.data_ptr());
}

TEST_CASE("a graph that is never backpropagated is freed (no output <-> grad_fn cycle)", "[autograd]") {
  std::weak_ptr<kiln::Storage> data;
  std::weak_ptr<kiln::autograd::Node> node;
  {
    auto x = kiln::randn({16}, kiln::TensorOptions().requires_grad(true));
    auto y = x.exp();  // ExpBackward saves its own output
    data = y.storage();
    node = y.grad_fn();
    auto z = y.sigmoid().softmax(0).sum();  // more ops that save outputs
  }
  REQUIRE(data.expired());
  REQUIRE(node.expired());
}

TEST_CASE("create_graph differentiates through a saved output the caller dropped", "[autograd]") {
  auto x = kiln::tensor({0.5, -1.0}, kiln_test::f64(true));
  // exp's output is a temporary: only the graph remembers it, weakly plus its data
  auto g = kiln::autograd::grad({x.exp().sum()}, {x}, {}, true, true)[0];  // = exp(x)
  REQUIRE(g.requires_grad());
  auto gg = kiln::autograd::grad({g.sum()}, {x})[0];  // d/dx exp(x) = exp(x)
  REQUIRE(gg[0].item<double>() == Approx(std::exp(0.5)));
  REQUIRE(gg[1].item<double>() == Approx(std::exp(-1.0)));
}

TEST_CASE("a gradient takes the dtype of the tensor it flows into (an autocast bf16 branch added to f32)",
          "[autograd][amp]") {
  // h = x + linear(linear(x, w1), w2) under bf16 autocast: the add's backward returns f32 for its
  // bf16 operand; the second linear's backward multiplies that gradient with its bf16 weight.
  namespace F = kiln::nn::functional;
  kiln::manual_seed(3);
  const kiln::Tensor x0 = kiln::randn({5, 8}), w10 = kiln::randn({8, 8}) * 0.3, w20 = kiln::randn({8, 8}) * 0.3;
  auto run = [&](bool amp) {
    kiln::Tensor x = x0.clone().requires_grad_(true), w1 = w10.clone().requires_grad_(true),
                 w2 = w20.clone().requires_grad_(true);
    kiln::Tensor loss;
    {
      std::optional<kiln::amp::Autocast> ac;
      if (amp) ac.emplace(kiln::DType::BF16);
      kiln::Tensor inner = F::linear(x, w1, {});
      CHECK(inner.dtype() == (amp ? kiln::DType::BF16 : kiln::DType::F32));
      kiln::Tensor h = x + F::linear(inner, w2, {});
      CHECK(h.dtype() == kiln::DType::F32);
      loss = (h * h).sum();
    }
    REQUIRE_NOTHROW(loss.backward());
    CHECK(w1.grad().dtype() == kiln::DType::F32);
    CHECK(w2.grad().dtype() == kiln::DType::F32);
    return std::vector<kiln::Tensor>{x.grad(), w1.grad(), w2.grad()};
  };
  auto ref = run(false), low = run(true);
  for (size_t i = 0; i < ref.size(); ++i) {
    double err = (low[i] - ref[i]).abs().max().item<double>() / ref[i].abs().max().item<double>();
    CHECK(err < 3e-2);  // bf16 operands: 8 mantissa bits
  }
}
