// Fused ops (kiln/nn/functional/fused.cpp) on the CPU: each forward against the unfused chain of
// kiln ops, each backward against the chain's gradients and by f64 gradcheck, the dropout mask
// against dropout() for the same seed, the fused bias gradient's determinism, and error paths.
// The per-element math is the functors the CUDA kernels use, so this checks their math too.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include <kiln/kiln.h>
#include <kiln/kernels/fused.h>
#include <kiln/nn/functional.h>
#include "tests/test_util.h"

using namespace kiln_test;

namespace {

namespace F = kiln::nn::functional;
using kiln::DType;
using kiln::Tensor;
using kiln::TensorOptions;

// The input's gradients of sum(out * w) for a fixed random weight w (so every element matters).
std::vector<Tensor> grads_of(const Tensor& out, const std::vector<Tensor>& inputs, const Tensor& w) {
  return kiln::autograd::grad({(out * w).sum()}, inputs);
}

}  // namespace

TEST_CASE("bias_gelu: forward equals gelu(x + b), both forms, every float dtype", "[fused]") {
  kiln::manual_seed(1);
  for (const char* approx : {"none", "tanh"}) {
    for (auto sizes : std::vector<kiln::IntList>{{7}, {3, 5}, {2, 3, 33}, {300, 129}}) {
      Tensor x = kiln::randn(sizes) * 2.0, b = kiln::randn({sizes.back()});
      INFO(approx << " sizes " << kiln::detail::concat(sizes));
      check_close(F::bias_gelu(x, b, approx), values(kiln::gelu(x + b, approx)), 1e-6, 1e-6, "f32");
      Tensor xd = x.to(DType::F64), bd = b.to(DType::F64);
      check_close(F::bias_gelu(xd, bd, approx), values(kiln::gelu(xd + bd, approx)), 1e-14, 1e-14, "f64");
      for (DType dt : {DType::F16, DType::BF16}) {
        // fused: one rounding of gelu(x + b); chain: x + b rounded, then gelu rounded.
        const double tol = dt == DType::BF16 ? 2e-2 : 2e-3;
        check_close(F::bias_gelu(x.to(dt), b.to(dt), approx), values(kiln::gelu(x.to(dt) + b.to(dt), approx)), 2 * tol,
                    2 * tol, "half");
      }
    }
  }
  // no bias, non-contiguous input
  Tensor xt = kiln::randn({9, 6}).t();
  check_close(F::bias_gelu(xt, Tensor()), values(kiln::gelu(xt)), 1e-6, 1e-7, "no bias, transposed");
  // mixed dtypes promote like the chain
  Tensor y = F::bias_gelu(kiln::randn({4, 3}).to(DType::BF16), kiln::randn({3}));
  CHECK(y.dtype() == DType::F32);
}

TEST_CASE("bias_gelu: backward equals the chain's and passes gradcheck", "[fused]") {
  kiln::manual_seed(2);
  for (const char* approx : {"none", "tanh"}) {
    INFO(approx);
    Tensor x = (kiln::randn({37, 19}) * 2.0).requires_grad_(true), b = kiln::randn({19}).requires_grad_(true);
    Tensor w = kiln::randn({37, 19});
    auto fused = grads_of(F::bias_gelu(x, b, approx), {x, b}, w);
    auto chain = grads_of(kiln::gelu(x + b, approx), {x, b}, w);
    check_close(fused[0], values(chain[0]), 1e-5, 1e-6, "dx");
    check_close(fused[1], values(chain[1]), 1e-5, 1e-5, "dbias");

    Tensor xd = (kiln::randn({4, 3, 5}, f64()) * 1.5).requires_grad_(true), bd = kiln::randn({5}, f64(true));
    CHECK(kiln::gradcheck([&](const TL& in) { return F::bias_gelu(in[0], in[1], approx); }, {xd, bd}));
    CHECK(kiln::gradcheck([&](const TL& in) { return F::bias_gelu(in[0].transpose(0, 1), in[1], approx); }, {xd, bd}));
    // double backward through the composite formula
    CHECK(kiln::gradcheck(
        [&](const TL& in) {
          Tensor y = F::bias_gelu(in[0], in[1], approx);
          return kiln::autograd::grad({(y * y).sum()}, {in[0]}, {}, true, true)[0];
        },
        {xd, bd}, 1e-6, 1e-5, 1e-3));
  }
}

TEST_CASE("bias_gelu: the bias gradient is deterministic and exact in f64 across many rows", "[fused]") {
  kiln::manual_seed(3);
  // > 1 chunk of rows and more than one OpenMP work item
  Tensor x = kiln::randn({5000, 70}, f64()), b = kiln::randn({70}, f64()), g = kiln::randn({5000, 70}, f64());
  Tensor dx = kiln::empty({5000, 70}, f64()), db = kiln::empty({70}, f64());
  Tensor dx2 = kiln::empty({5000, 70}, f64()), db2 = kiln::empty({70}, f64());
  kiln::kernels::bias_gelu_backward(dx, db, g, x, b, kiln::kernels::GeluApprox::None);
  kiln::kernels::bias_gelu_backward(dx2, db2, g, x, b, kiln::kernels::GeluApprox::None);
  CHECK(values(db) == values(db2));
  check_close(db, values(dx.sum({0})), 1e-12, 1e-10, "dbias = column sum of dx");
  // dx may alias g
  Tensor ga = g.clone();
  kiln::kernels::bias_gelu_backward(ga, Tensor(), ga, x, b, kiln::kernels::GeluApprox::None);
  CHECK(values(ga) == values(dx));
}

TEST_CASE("bias_dropout_add: same mask as dropout for the same seed, forward and backward", "[fused]") {
  for (DType dt : {DType::F32, DType::F64, DType::BF16}) {
    INFO(kiln::dtype_name(dt));
    kiln::manual_seed(4);
    Tensor x = kiln::randn({33, 65}).to(dt).requires_grad_(true);
    Tensor b = kiln::randn({65}).to(dt).requires_grad_(true);
    Tensor r = kiln::randn({33, 65}).to(dt).requires_grad_(true);
    Tensor w = kiln::randn({33, 65}).to(dt);
    kiln::manual_seed(77);
    Tensor fused = F::bias_dropout_add(x, b, r, 0.3, true);
    kiln::manual_seed(77);
    Tensor chain = r + F::dropout(x + b, 0.3, true);
    const double tol = dt == DType::BF16 ? 2e-2 : dt == DType::F64 ? 1e-14 : 1e-6;
    check_close(fused, values(chain), tol, tol, "forward");
    if (dt != DType::BF16) {  // (in bf16 a small kept value can vanish in r + v)
      // the masks are identical: dropped exactly where the chain dropped
      std::vector<double> fv = values(fused - r), cv = values(chain - r);
      for (size_t i = 0; i < fv.size(); ++i) REQUIRE((fv[i] == 0.0) == (cv[i] == 0.0));
      double dropped = 0;
      for (double v : fv) dropped += v == 0.0;
      CHECK(std::abs(dropped / fv.size() - 0.3) < 0.05);  // about 30% dropped
    }

    auto gf = grads_of(fused, {x, b, r}, w);
    auto gc = grads_of(chain, {x, b, r}, w);
    check_close(gf[0], values(gc[0]), tol, tol, "dx");
    check_close(gf[1], values(gc[1]), dt == DType::BF16 ? 5e-2 : tol * 10, dt == DType::BF16 ? 0.2 : tol * 10, "dbias");
    check_close(gf[2], values(gc[2]), 0, 0, "dresidual");
  }
}

TEST_CASE("bias_dropout_add: eval mode, p = 0 and p = 1, no bias, 3-D input", "[fused]") {
  kiln::manual_seed(5);
  Tensor x = kiln::randn({2, 5, 8}), b = kiln::randn({8}), r = kiln::randn({2, 5, 8});
  check_close(F::bias_dropout_add(x, b, r, 0.5, false), values(r + (x + b)), 1e-6, 1e-6, "eval");
  check_close(F::bias_dropout_add(x, b, r, 0.0, true), values(r + (x + b)), 1e-6, 1e-6, "p = 0");
  check_close(F::bias_dropout_add(x, b, r, 1.0, true), values(r), 0, 0, "p = 1");
  kiln::manual_seed(9);
  Tensor fused = F::bias_dropout_add(x, Tensor(), r, 0.5, true);
  kiln::manual_seed(9);
  check_close(fused, values(r + F::dropout(x, 0.5, true)), 1e-6, 1e-6, "no bias");
  // eval mode draws nothing: the generator is where it was
  kiln::manual_seed(9);
  F::bias_dropout_add(x, b, r, 0.5, false);
  Tensor after_eval = kiln::rand({4});
  kiln::manual_seed(9);
  CHECK(values(after_eval) == values(kiln::rand({4})));
}

// With nothing dropped the backward passes g through (x's and the residual's gradients are g, the
// bias's its column sums) without a pass over memory; the leaves still get gradients of their own.
TEST_CASE("bias_dropout_add: the backward with nothing dropped passes the gradient through", "[fused]") {
  kiln::manual_seed(10);
  for (const bool training : {true, false}) {
    Tensor x = kiln::randn({3, 4, 6}).requires_grad_(true), b = kiln::randn({6}).requires_grad_(true);
    Tensor r = kiln::randn({3, 4, 6}).requires_grad_(true), w = kiln::randn({3, 4, 6});
    F::bias_dropout_add(x, b, r, training ? 0.0 : 0.5, training).backward(w);
    INFO("training " << training);
    check_close(x.grad(), values(w), 0, 0, "dx");
    check_close(r.grad(), values(w), 0, 0, "dresidual");
    check_close(b.grad(), values(w.sum({0, 1})), 1e-6, 1e-6, "dbias");
    REQUIRE(x.grad().data_ptr() != r.grad().data_ptr());  // each leaf owns its gradient
  }
}

TEST_CASE("bias_dropout_add: gradcheck with the mask fixed by the seed (and double backward)", "[fused]") {
  kiln::manual_seed(6);
  Tensor x = kiln::randn({6, 7}, f64(true)), b = kiln::randn({7}, f64(true)), r = kiln::randn({6, 7}, f64(true));
  auto fn = [](const TL& in) {
    kiln::manual_seed(1234);  // every evaluation draws the same mask
    return F::bias_dropout_add(in[0], in[1], in[2], 0.4, true);
  };
  CHECK(kiln::gradcheck(fn, {x, b, r}));
  CHECK(kiln::gradcheck(
      [&](const TL& in) {
        Tensor y = fn(in);
        return kiln::autograd::grad({(y * y).sum()}, {in[0]}, {}, true, true)[0];
      },
      {x, b, r}));
}

TEST_CASE("fused_gelu: equals the guide's 5-op chain, gradcheck", "[fused]") {
  kiln::manual_seed(7);
  Tensor x = kiln::randn({1000}) * 3.0;
  Tensor chain = x * 0.5 * (1.0 + kiln::erf(x / 1.41421));
  check_close(F::fused_gelu(x), values(chain), 1e-5, 2e-6, "f32 vs chain");
  Tensor xd = kiln::randn({3, 4}, f64(true));
  CHECK(kiln::gradcheck([](const TL& in) { return F::fused_gelu(in[0]); }, {xd}));
  CHECK_THROWS_WITH(F::fused_gelu(kiln::randint(0, 3, {4})), Catch::Contains("floating-point"));
}

TEST_CASE("linear_gelu: forward equals gelu(linear(x, w, b)), gradients match, gradcheck", "[fused]") {
  kiln::manual_seed(8);
  for (const char* approx : {"tanh", "none"}) {
    INFO(approx);
    Tensor x = kiln::randn({2, 9, 13}).requires_grad_(true), wt = (kiln::randn({11, 13}) * 0.3).requires_grad_(true);
    Tensor b = kiln::randn({11}).requires_grad_(true);
    Tensor fused = F::linear_gelu(x, wt, b, approx);
    Tensor chain = kiln::gelu(F::linear(x, wt, b), approx);
    REQUIRE(fused.sizes() == chain.sizes());
    check_close(fused, values(chain), 1e-5, 1e-6, "forward");
    Tensor w = kiln::randn(chain.sizes());
    auto gf = grads_of(fused, {x, wt, b}, w);
    auto gc = grads_of(chain, {x, wt, b}, w);
    check_close(gf[0], values(gc[0]), 1e-4, 1e-5, "dx");
    check_close(gf[1], values(gc[1]), 1e-4, 1e-4, "dweight");
    check_close(gf[2], values(gc[2]), 1e-4, 1e-4, "dbias");

    Tensor xd = kiln::randn({5, 4}, f64(true)), wd = kiln::randn({3, 4}, f64(true)), bd = kiln::randn({3}, f64(true));
    CHECK(kiln::gradcheck([&](const TL& in) { return F::linear_gelu(in[0], in[1], in[2], approx); }, {xd, wd, bd}));
    // a transposed input and a 3-D input
    Tensor xt = kiln::randn({4, 5}, f64(true));
    CHECK(kiln::gradcheck([&](const TL& in) { return F::linear_gelu(in[0].t(), in[1], in[2], approx); }, {xt, wd, bd}));
    // double backward
    CHECK(kiln::gradcheck(
        [&](const TL& in) {
          Tensor y = F::linear_gelu(in[0], in[1], in[2], approx);
          return kiln::autograd::grad({(y * y).sum()}, {in[1]}, {}, true, true)[0];
        },
        {xd, wd, bd}));
  }
  // no bias: the plain composition
  Tensor x = kiln::randn({3, 4}), wt = kiln::randn({2, 4});
  check_close(F::linear_gelu(x, wt, Tensor()), values(kiln::gelu(F::linear(x, wt), "tanh")), 1e-6, 1e-6, "no bias");
}

TEST_CASE("linear_epilogue and matmul_dgelu_bgrad kernels on the CPU", "[fused]") {
  namespace K = kiln::kernels;
  kiln::manual_seed(10);
  Tensor x = kiln::randn({17, 8}, f64()), w = kiln::randn({24, 8}, f64()), b = kiln::randn({24}, f64());
  Tensor out = kiln::empty({17, 24}, f64()), aux = kiln::empty({17, 24}, f64());
  Tensor pre = kiln::matmul(x, w.t()) + b;
  K::linear_epilogue(out, x, w, b, K::Epilogue::Bias);
  check_close(out, values(pre), 1e-12, 1e-12, "bias epilogue");
  K::linear_epilogue(out, x, w, b, K::Epilogue::BiasGelu, aux, K::GeluApprox::Tanh);
  check_close(out, values(kiln::gelu(pre, "tanh")), 1e-12, 1e-12, "bias+gelu epilogue");
  check_close(aux, values(pre), 1e-12, 1e-12, "aux = pre-activation");
  K::linear_epilogue(out, x, w, b, K::Epilogue::BiasGelu, Tensor(), K::GeluApprox::None);
  check_close(out, values(kiln::gelu(pre)), 1e-12, 1e-12, "bias+gelu(erf), no aux");

  // dpre = (a @ bm) * gelu'(pre), dbias = column sum
  Tensor a = kiln::randn({17, 5}, f64()), bm = kiln::randn({24, 5}, f64()).t();
  Tensor dpre = kiln::empty({17, 24}, f64()), db = kiln::empty({24}, f64());
  K::matmul_dgelu_bgrad(dpre, db, a, bm, pre, K::GeluApprox::Tanh);
  Tensor pv = pre.clone().requires_grad_(true);
  Tensor want = kiln::autograd::grad({kiln::gelu(pv, "tanh")}, {pv}, {kiln::matmul(a, bm)})[0];
  check_close(dpre, values(want), 1e-12, 1e-12, "dgelu");
  check_close(db, values(want.sum({0})), 1e-12, 1e-12, "bgrad");

  CHECK_THROWS_WITH(K::linear_epilogue(out, x, kiln::randn({24, 7}, f64()), b, K::Epilogue::Bias),
                    Catch::Contains("linear_epilogue"));
}

TEST_CASE("fused ops: clear errors on bad input", "[fused]") {
  Tensor x = kiln::randn({3, 4});
  CHECK_THROWS_WITH(F::bias_gelu(x, kiln::randn({3})), Catch::Contains("bias must be [4]"));
  CHECK_THROWS_WITH(F::bias_gelu(x, kiln::randn({4}), "fast"), Catch::Contains("approximate"));
  CHECK_THROWS_WITH(F::bias_dropout_add(x, kiln::randn({4}), kiln::randn({4, 3}), 0.1),
                    Catch::Contains("residual sizes"));
  CHECK_THROWS_WITH(F::bias_dropout_add(x, kiln::randn({4}), x, 1.5), Catch::Contains("[0, 1]"));
  CHECK_THROWS_WITH(F::linear_gelu(x, kiln::randn({5, 3}), kiln::randn({5})), Catch::Contains("linear_gelu"));
}
