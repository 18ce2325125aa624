// NaN and Inf semantics, op by op, as PyTorch gives them (docs/guide.md, "NaN and Inf"). Each row
// is an op, an input holding NaN/±Inf and the exact output (and, where the op has one, the
// gradient for an all-ones output gradient) that PyTorch returns; every row runs in f32 and f64.
// The fused kernels (BatchNorm + ReLU, + max pool, the conv block) are checked against the
// same expectations: a NaN must never come out of a fused ReLU as 0.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <kiln/kiln.h>
#include <kiln/nn/fused/conv_block.h>
#include "tests/test_util.h"

using namespace kiln_test;

namespace {

namespace F = kiln::nn::functional;
using kiln::TensorOptions;

const double nan_ = std::numeric_limits<double>::quiet_NaN();
const double inf = std::numeric_limits<double>::infinity();

struct Row {
  std::string op;
  std::vector<double> in;
  IntList sizes;
  std::function<Tensor(const Tensor&)> f;
  std::vector<double> want;
  std::vector<double> want_grad;  // d sum(f(x) * 1) / dx; empty: not checked
};

Tensor make(const std::vector<double>& v, const IntList& sizes, DType dt, bool grad = false) {
  return kiln::tensor(v, TensorOptions().dtype(DType::F64)).reshape(sizes).to(dt).detach().requires_grad_(grad);
}

// Constant operands of a row, in the input's dtype.
Tensor like(const Tensor& x, const std::vector<double>& v, const IntList& sizes) { return make(v, sizes, x.dtype()); }

Tensor i64(const std::vector<int64_t>& v) { return kiln::tensor(v); }

double ln_(double v, double mean, double var) { return (v - mean) / std::sqrt(var + 1e-5); }

std::vector<Row> rows() {
  const double z3 = ln_(3, 2, 2.0 / 3);  // (x - mean) / sqrt(var + eps) of [1, 2, 3] at 3
  std::vector<Row> r;
  // ---- activations
  r.push_back({"relu",
               {nan_, inf, -inf, -1, 0, 2},
               {6},
               [](const Tensor& x) { return kiln::relu(x); },
               {nan_, inf, 0, 0, 0, 2},
               {1, 1, 0, 0, 0, 1}});  // threshold_backward: y <= 0 ? 0 : g
  r.push_back({"Tensor::relu", {nan_, -inf}, {2}, [](const Tensor& x) { return x.relu(); }, {nan_, 0}, {1, 0}});
  r.push_back({"leaky_relu",
               {nan_, inf, -inf, -2, 3},
               {5},
               [](const Tensor& x) { return F::leaky_relu(x, 0.1); },
               {nan_, inf, -inf, -0.2, 3},
               {0.1, 1, 0.1, 0.1, 1}});
  r.push_back({"gelu",
               {nan_, inf, -inf, 0},
               {4},
               [](const Tensor& x) { return kiln::gelu(x); },
               {nan_, inf, nan_, 0},
               {nan_, nan_, nan_, 0.5}});  // -inf * 0.5 * (1 + erf(-inf)) = -inf * 0
  r.push_back({"gelu tanh",
               {nan_, inf, -inf, 0},
               {4},
               [](const Tensor& x) { return kiln::gelu(x, "tanh"); },
               {nan_, inf, nan_, 0},
               {}});
  r.push_back({"bias_gelu",
               {nan_, -inf, 1},
               {1, 3},
               [](const Tensor& x) { return F::bias_gelu(x, kiln::zeros({3}, x.options().requires_grad(false))); },
               {nan_, nan_, 0.5 * (1 + std::erf(1 / std::sqrt(2.0)))},
               {}});
  r.push_back({"linear_gelu",
               {nan_, 1},
               {1, 2},
               [](const Tensor& x) {
                 return F::linear_gelu(x, like(x, {1, 1, 0, 1}, {2, 2}), like(x, {0, 0}, {2}));
               },
               {nan_, nan_},
               {}});  // nan * 0 is nan in the GEMM too
  r.push_back({"clamp",
               {nan_, inf, -inf, 0.5},
               {4},
               [](const Tensor& x) { return kiln::clamp(x, 0, 1); },
               {nan_, 1, 0, 0.5},
               {0, 0, 0, 1}});
  r.push_back({"clamp_min", {nan_, -inf}, {2}, [](const Tensor& x) { return x.clamp_min(0); }, {nan_, 0}, {}});
  r.push_back({"maximum",
               {nan_, 1, -inf, 2},
               {4},
               [](const Tensor& x) {
                 return kiln::maximum(x, like(x, {1, nan_, inf, 3}, {4}));
               },
               {nan_, nan_, inf, 3},
               {}});
  r.push_back({"minimum",
               {nan_, 1, -inf, 2},
               {4},
               [](const Tensor& x) {
                 return kiln::minimum(x, like(x, {1, nan_, inf, 3}, {4}));
               },
               {nan_, nan_, -inf, 2},
               {}});
  // ---- reductions: NaN is the extreme value, its first index the arg
  r.push_back({"max", {1, nan_, 3, nan_}, {4}, [](const Tensor& x) { return x.max(); }, {nan_}, {0, 0.5, 0, 0.5}});
  r.push_back({"min", {1, nan_, -inf}, {3}, [](const Tensor& x) { return x.min(); }, {nan_}, {0, 1, 0}});
  r.push_back({"max inf", {1, inf, -inf}, {3}, [](const Tensor& x) { return x.max(); }, {inf}, {0, 1, 0}});
  r.push_back({"argmax", {1, nan_, 3, nan_}, {4}, [](const Tensor& x) { return x.argmax(); }, {1}, {}});
  r.push_back({"argmin", {-inf, 2, nan_}, {3}, [](const Tensor& x) { return x.argmin(0); }, {2}, {}});
  r.push_back({"max(dim) values",
               {1, nan_, 3, 2, 5, 4},
               {2, 3},
               [](const Tensor& x) { return std::get<0>(x.max(1)); },
               {nan_, 5},
               {0, 1, 0, 0, 1, 0}});
  r.push_back({"max(dim) indices",
               {1, nan_, 3, 2, 5, 4},
               {2, 3},
               [](const Tensor& x) { return std::get<1>(x.max(1)); },
               {1, 1},
               {}});
  r.push_back({"min(dim) indices",
               {1, -inf, nan_, 2, 5, -inf},
               {2, 3},
               [](const Tensor& x) { return std::get<1>(x.min(1)); },
               {2, 2},
               {}});
  r.push_back({"amax", {1, nan_, 3, 2, 5, inf}, {2, 3}, [](const Tensor& x) { return x.amax({1}); }, {nan_, inf}, {}});
  r.push_back({"sum", {1, inf, 2}, {3}, [](const Tensor& x) { return x.sum(); }, {inf}, {1, 1, 1}});
  r.push_back({"sum inf - inf", {inf, -inf}, {2}, [](const Tensor& x) { return x.sum(); }, {nan_}, {}});
  r.push_back({"sum(dim) nan", {1, nan_, 2, 3}, {2, 2}, [](const Tensor& x) { return x.sum({1}); }, {nan_, 5}, {}});
  r.push_back({"mean", {1, inf, -2}, {3}, [](const Tensor& x) { return x.mean(); }, {inf}, {}});
  r.push_back({"mean(dim)", {-inf, 1, 4, 2}, {2, 2}, [](const Tensor& x) { return x.mean({1}); }, {-inf, 3}, {}});
  // ---- max pooling: a window holding a NaN gives NaN and its index points at the NaN
  r.push_back({"max_pool2d 2x2",
               {1, nan_, 3, 4, 5, 6, 7, -inf},
               {1, 1, 2, 4},
               [](const Tensor& x) { return F::max_pool2d(x, 2); },
               {nan_, 7},
               {0, 1, 0, 0, 0, 0, 1, 0}});
  r.push_back({"max_pool2d k2 s1",
               {1, 2, 3, 4, nan_, 6, 7, 8, inf},
               {1, 1, 3, 3},
               [](const Tensor& x) {
                 return F::max_pool2d(x, {2, 2}, {1, 1});
               },
               {nan_, nan_, nan_, nan_},
               {0, 0, 0, 0, 4, 0, 0, 0, 0}});
  r.push_back({"max_pool2d -inf",
               {-inf, -inf, -inf, -inf},
               {1, 1, 2, 2},
               [](const Tensor& x) { return F::max_pool2d(x, 2); },
               {-inf},
               {1, 0, 0, 0}});
  // ---- softmax: a NaN anywhere in a row, +inf, or a row of -inf gives a NaN row
  const double l2 = std::log(2.0);
  const std::vector<double> sm_in{nan_, 1, 2, inf, 1, 2, -inf, 0, 0, -inf, -inf, -inf};
  r.push_back({"softmax",
               sm_in,
               {4, 3},
               [](const Tensor& x) { return kiln::softmax(x, 1); },
               {nan_, nan_, nan_, nan_, nan_, nan_, 0, 0.5, 0.5, nan_, nan_, nan_},
               {}});
  r.push_back({"log_softmax",
               sm_in,
               {4, 3},
               [](const Tensor& x) { return kiln::log_softmax(x, 1); },
               {nan_, nan_, nan_, nan_, nan_, nan_, -inf, -l2, -l2, nan_, nan_, nan_},
               {}});
  r.push_back({"softmax dim 0",
               {-inf, nan_, 0, 1},
               {2, 2},
               [](const Tensor& x) { return kiln::softmax(x, 0); },
               {0, nan_, 1, nan_},
               {}});
  // ---- cross-entropy: lse - x_t with inf logits
  r.push_back({"cross_entropy none",
               {-inf, 0, inf, 0, nan_, 0, 0, -inf},
               {4, 2},
               [](const Tensor& x) {
                 return kiln::cross_entropy(x, i64({1, 0, 1, 1}), -100, 0.0, Reduction::None);
               },
               {0, nan_, nan_, inf},
               {}});
  r.push_back({"cross_entropy mean",
               {-inf, 0, 0, -inf},
               {2, 2},
               [](const Tensor& x) {
                 return kiln::cross_entropy(x, i64({1, 1}));
               },
               {inf},
               {}});
  r.push_back({"cross_entropy -inf logit grad",
               {-inf, 0},
               {1, 2},
               [](const Tensor& x) { return kiln::cross_entropy(x, i64({1})); },
               {0},
               {0, 0}});
  // ---- norms: a NaN spoils its own row (layer norm) or channel (batch norm), nothing else
  r.push_back({"layer_norm",
               {nan_, 1, 2, 1, 2, 3},
               {2, 3},
               [](const Tensor& x) { return F::layer_norm(x, {3}); },
               {nan_, nan_, nan_, -z3, 0, z3},
               {}});
  r.push_back({"batch_norm train",
               {nan_, 1, 1, 2, 2, 3},
               {3, 2},
               [](const Tensor& x) { return F::batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true); },
               {nan_, -z3, nan_, 0, nan_, z3},
               {}});
  r.push_back({"batch_norm_relu train",
               {nan_, 1, 1, 2, 2, 3},
               {3, 2},
               [](const Tensor& x) { return F::batch_norm_relu(x, Tensor(), Tensor(), Tensor(), Tensor(), true); },
               {nan_, 0, nan_, 0, nan_, z3},
               {}});
  r.push_back(
      {"batch_norm_relu eval",
       {nan_, -1, inf, -inf},
       {2, 2},
       [](const Tensor& x) {
         return F::batch_norm_relu(x, like(x, {0, 0}, {2}), like(x, {1, 1}, {2}), Tensor(), Tensor(), false, 0.1, 0.0);
       },
       {nan_, 0, inf, 0},
       {}});
  // [1, 2, 2, 2]: channel 0 holds a NaN, channel 1 is [1, 2, 3, 4] -> relu(bn) max = (4 - 2.5) / sqrt(1.25 + eps)
  r.push_back(
      {"batch_norm_relu_max_pool2d train",
       {nan_, 1, 2, 3, 1, 2, 3, 4},
       {1, 2, 2, 2},
       [](const Tensor& x) { return F::batch_norm_relu_max_pool2d(x, Tensor(), Tensor(), Tensor(), Tensor(), true); },
       {nan_, ln_(4, 2.5, 1.25)},
       {}});
  r.push_back({"batch_norm_relu_max_pool2d eval",
               {nan_, -1, -2, -3, -1, -2, -3, -4, -5, 4, -7, -8},
               {1, 1, 2, 6},
               [](const Tensor& x) {
                 return F::batch_norm_relu_max_pool2d(x, like(x, {0}, {1}), like(x, {1}, {1}), Tensor(), Tensor(),
                                                      false, 0.1, 0.0);
               },
               {nan_, 4, 0},
               {}});
  // conv 1x1 (weight 1, no bias) -> BN (eval, identity) -> ReLU -> 2x2 pool: the fused conv block
  r.push_back({"conv2d_batch_norm_relu_max_pool2d eval",
               {nan_, -1, -2, -3, -1, -2, -3, -4, -5, 4, -7, -8},
               {1, 1, 2, 6},
               [](const Tensor& x) {
                 return F::conv2d_batch_norm_relu_max_pool2d(x.detach(), like(x, {1}, {1, 1, 1, 1}), Tensor(), {},
                                                             like(x, {0}, {1}), like(x, {1}, {1}), Tensor(), Tensor(),
                                                             false, 0.1, 0.0);
               },
               {nan_, 4, 0},
               {}});
  r.push_back({"conv2d_batch_norm_relu_max_pool2d train",
               {nan_, -1, -2, -3, -1, -2, -3, 4},
               {1, 1, 2, 4},
               [](const Tensor& x) {
                 return F::conv2d_batch_norm_relu_max_pool2d(x.detach(), like(x, {1}, {1, 1, 1, 1}), Tensor(), {},
                                                             Tensor(), Tensor(), Tensor(), Tensor(), true);
               },
               {nan_, nan_},
               {}});  // the channel's batch statistics are NaN
  return r;
}

}  // namespace

TEST_CASE("NaN and Inf: every op as PyTorch", "[nan]") {
  for (DType dt : {DType::F32, DType::F64}) {
    for (const Row& row : rows()) {
      INFO(row.op << " in " << dt);
      const double tol = dt == DType::F32 ? 1e-5 : 1e-12;
      Tensor x = make(row.in, row.sizes, dt, !row.want_grad.empty());
      Tensor y = row.f(x);
      check_close(values(y), row.want, tol, tol, row.op);
      if (!row.want_grad.empty()) {
        y.backward(kiln::ones_like(y));
        REQUIRE(x.grad().defined());
        check_close(values(x.grad()), row.want_grad, tol, tol, row.op + " gradient");
      }
    }
  }
}

TEST_CASE("NaN and Inf: relu's double-backward formula lets a NaN output's gradient through", "[nan]") {
  Tensor x = kiln::tensor({nan_, -1.0, 2.0}, f64(true));
  Tensor y = kiln::relu(x);
  auto g = kiln::autograd::grad({y}, {x}, {kiln::ones_like(y)}, /*retain_graph=*/true, /*create_graph=*/true);
  check_close(values(g[0]), {1, 0, 1}, 0, 0);
}

TEST_CASE("NaN and Inf: the fused BatchNorm + ReLU backward passes a NaN pre-activation's gradient", "[nan]") {
  // eval mode, channel 0's bias NaN: its pre-activations are NaN, and PyTorch's relu backward
  // (threshold_backward on the output) lets g through them; BN's eval backward is g * w * invstd.
  Tensor x = kiln::tensor({1.0, -1.0, 2.0, -3.0}, f64()).reshape({2, 2}).requires_grad_(true);
  Tensor rm = kiln::zeros({2}, f64()), rv = kiln::ones({2}, f64());
  Tensor w = kiln::ones({2}, f64()), b = kiln::tensor({nan_, 0.0}, f64());
  Tensor y = F::batch_norm_relu(x, rm, rv, w, b, false, 0.1, 0.0);
  check_close(values(y), {nan_, 0, nan_, 0}, 0, 0);
  y.backward(kiln::ones_like(y));
  check_close(values(x.grad()), {1, 0, 1, 0}, 0, 0);
}

TEST_CASE("NaN and Inf: eval-mode batch norm's input gradient at a NaN or inf input is g * w * invstd", "[nan]") {
  // PyTorch's eval backward has no x term; kiln's dx = g k1 + x k2 + k3 has k2 = k3 = 0 there and
  // must not turn NaN * 0 into a NaN gradient. Plain, with the fused ReLU, and with the pool.
  Tensor rm = kiln::zeros({2}, f64()), rv = kiln::ones({2}, f64()), w = kiln::tensor({2.0, 3.0}, f64());
  for (bool relu : {false, true}) {
    INFO("relu " << relu);
    Tensor x = kiln::tensor({nan_, -1.0, inf, 2.0}, f64()).reshape({2, 2}).requires_grad_(true);
    Tensor y = relu ? F::batch_norm_relu(x, rm, rv, w, Tensor(), false, 0.1, 0.0)
                    : F::batch_norm(x, rm, rv, w, Tensor(), false, 0.1, 0.0);
    check_close(values(y), relu ? std::vector<double>{nan_, 0, inf, 6} : std::vector<double>{nan_, -3, inf, 6}, 0, 0);
    y.backward(kiln::ones_like(y));
    check_close(values(x.grad()), relu ? std::vector<double>{2, 0, 2, 3} : std::vector<double>{2, 3, 2, 3}, 0, 0);
  }
  // [1, 1, 2, 2] through BN + ReLU + 2x2 pool: the window's max is the NaN, which gets g * w
  Tensor x = kiln::tensor({1.0, nan_, -2.0, 3.0}, f64()).reshape({1, 1, 2, 2}).requires_grad_(true);
  Tensor y = F::batch_norm_relu_max_pool2d(x, kiln::zeros({1}, f64()), kiln::ones({1}, f64()),
                                           kiln::tensor({2.0}, f64()), Tensor(), false, 0.1, 0.0);
  check_close(values(y), {nan_}, 0, 0);
  y.backward(kiln::ones_like(y));
  check_close(values(x.grad()), {0, 2, 0, 0}, 0, 0);
}

TEST_CASE("NaN and Inf: nn::ConvBatchNormReLU2d keeps a NaN where the unfused chain does", "[nan]") {
  // eval: the running statistics are finite, so only the windows touching the NaN's conv outputs
  // are NaN; both the pooled block and the block without a pool against the layers one by one.
  namespace nn = kiln::nn;
  kiln::manual_seed(5);
  auto conv = std::make_shared<nn::Conv2d>(nn::Conv2dOptions(1, 4, 3).padding(1).bias(false));
  auto bn = std::make_shared<nn::BatchNorm2d>(4);
  nn::MaxPool2d pool(nn::Pool2dOptions(2));
  nn::ConvBatchNormReLU2d pooled(conv, bn, std::make_shared<nn::MaxPool2d>(nn::Pool2dOptions(2)));
  nn::ConvBatchNormReLU2d plain(conv, bn);
  pooled.eval();
  Tensor x = kiln::randn({2, 1, 8, 8});
  x.data_ptr<float>()[3 * 8 + 4] = NAN;  // sample 0, row 3, column 4
  kiln::NoGradGuard ng;
  Tensor chain = kiln::relu((*bn)((*conv)(x)));
  std::vector<double> want_plain = values(chain), want_pooled = values(pool(chain));
  int nans = 0;
  for (double v : want_pooled) nans += std::isnan(v);
  CHECK(nans == 4 * 4);  // the 3x3 conv spreads the NaN over rows 2-4, columns 3-5: 4 windows per channel
  check_close(values(pooled(x)), want_pooled, 1e-5, 1e-5, "pooled");
  check_close(values(plain(x)), want_plain, 1e-5, 1e-5, "plain");
  // training: the NaN reaches every channel's batch statistics, so everything is NaN, never 0
  pooled.train();
  for (double v : values(pooled(x))) CHECK(std::isnan(v));
}

TEST_CASE("NaN and Inf: allclose and equal as torch.allclose / torch.equal", "[nan]") {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  for (kiln::DType dt : {kiln::DType::F32, kiln::DType::F64}) {
    auto t = [&](const std::vector<double>& v) { return kiln::tensor(v).to(dt); };
    CHECK(kiln::allclose(t({1.0, inf, -inf}), t({1.0, inf, -inf}), 0.0, 0.0));  // equal infinities are close
    CHECK_FALSE(kiln::allclose(t({inf}), t({-inf}), 1.0, 1.0));
    CHECK_FALSE(kiln::allclose(t({inf}), t({1e30}), 1.0, 1.0));  // finite in f32 too
    CHECK_FALSE(kiln::allclose(t({nan}), t({nan}), 1.0, 1.0));   // NaN is never close
    CHECK(kiln::allclose(t({1.0}), t({1.0 + 1e-9}), 0.0, 1e-8));
    CHECK_FALSE(kiln::allclose(t({1.0}), t({1.0 + 1e-7}), 0.0, 1e-8));
    CHECK(kiln::equal(t({inf, -inf}), t({inf, -inf})));
    CHECK_FALSE(kiln::equal(t({nan}), t({nan})));
  }
}
