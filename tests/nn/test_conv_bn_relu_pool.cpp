// conv2d_batch_norm_relu_max_pool2d (a CNN's first block fused; the conv output is never
// written): output, running statistics and the gradients of the conv weight and the BatchNorm
// parameters equal conv2d -> batch_norm -> relu -> max_pool2d op by op, in training and eval
// mode, for odd sizes, 1-3 input channels, padding 0-2, dilation, with and without affine
// parameters; f64 gradchecks; which calls take the fused path and which the composite one;
// nn::ConvBatchNormReLU2d; errors.
#include <cmath>

#include <kiln/kernels/conv_block.h>
#include <kiln/kernels/conv.h>
#include <kiln/kernels/norm.h>
#include <kiln/nn/fused/conv_block.h>
#include "tests/conv_geometry.h"
#include "tests/nn/nn_test_util.h"

namespace {

struct Case {
  IntList x;     // N, C, H, W
  int64_t K, k;  // output channels, square kernel size
  int64_t pad, dil;
};

F::Conv2dParams params_of(const Case& c) { return {{1, 1}, {c.pad, c.pad}, {c.dil, c.dil}}; }

struct Run : BatchNormRun {
  Tensor y, dcw, dx;
  std::string node;
};

// One forward + backward with a fixed upstream gradient.
Run run(bool fused, const Case& c, const Tensor& x0, const Tensor& cw0, const Tensor& w0, const Tensor& b0,
        const Tensor& g, bool training, bool affine, bool x_grad = false) {
  Run r;
  Tensor x = x_grad ? x0.clone().requires_grad_() : x0;
  Tensor cw = cw0.clone().requires_grad_();
  const BatchNormArgs bn(affine, w0, b0, c.K, x0.dtype());
  const Tensor &w = bn.weight, &b = bn.bias;
  r.rm = bn.running_mean;
  r.rv = bn.running_var;
  const F::Conv2dParams p = params_of(c);
  r.y = fused ? F::conv2d_batch_norm_relu_max_pool2d(x, cw, Tensor(), p, r.rm, r.rv, w, b, training)
              : F::max_pool2d(kiln::relu(F::batch_norm(F::conv2d(x, cw, Tensor(), p), r.rm, r.rv, w, b, training)), 2);
  r.node = r.y.grad_fn() ? r.y.grad_fn()->name() : "";
  r.y.backward(g);
  r.dcw = cw.grad();
  if (x_grad) r.dx = x.grad();
  bn.take_grads(r.dw, r.db);
  return r;
}

const auto same = check_same_tensor;

}  // namespace

TEST_CASE("conv2d_batch_norm_relu_max_pool2d: equals conv2d -> batch_norm -> relu -> max_pool2d",
          "[norm][pool][conv]") {
  kiln::manual_seed(31);
  const std::vector<Case> cases = {
      {{4, 1, 8, 10}, 5, 3, 1, 1},    // the Fashion-MNIST block's shape, small
      {{3, 3, 7, 9}, 6, 3, 1, 1},     // RGB: a 27-tap patch; odd output (a row/column outside every window)
      {{2, 2, 6, 6}, 3, 1, 0, 1},     // 1x1 conv
      {{2, 1, 9, 8}, 4, 3, 0, 1},     // no padding
      {{2, 1, 10, 11}, 3, 3, 2, 2},   // dilation 2, padding 2
      {{3, 1, 28, 28}, 32, 3, 1, 1},  // the Fashion-MNIST block itself
      {{2, 2, 5, 37}, 7, 2, 1, 1},    // even kernel, output wider than two 16-lane chunks
  };
  for (const Case& c : cases)
    for (DType dt : {DType::F32, DType::F64})
      for (int training = 0; training < 2; ++training)
        for (int affine = 0; affine < 2; ++affine) {
          INFO("x " << c.x[0] << "x" << c.x[1] << "x" << c.x[2] << "x" << c.x[3] << " K " << c.K << " k " << c.k
                    << " pad " << c.pad << " dil " << c.dil << " dtype " << dt << " training " << training << " affine "
                    << affine);
          Tensor x = kiln::randn(c.x, dt) * 1.5 + 0.4;
          Tensor cw = kiln::randn({c.K, c.x[1], c.k, c.k}, dt) * 0.5;
          Tensor w = kiln::rand({c.K}, dt) + 0.5;
          Tensor b = kiln::randn({c.K}, dt) * 0.5;
          const int64_t OH = c.x[2] + 2 * c.pad - c.dil * (c.k - 1), OW = c.x[3] + 2 * c.pad - c.dil * (c.k - 1);
          Tensor g = kiln::randn({c.x[0], c.K, OH / 2, OW / 2}, dt);
          Run f = run(true, c, x, cw, w, b, g, training, affine);
          Run r = run(false, c, x, cw, w, b, g, training, affine);
          CHECK(f.node == "ConvBatchNormReluMaxPoolBackward");
          // f32: the fused path's statistics come from patch moments in f64, the composite's from
          // the f32 conv output: outputs agree to a few ulps of their scale, gradients a little less
          const double tol = dt == DType::F32 ? 1e-4 : 1e-10;
          same(f.y, r.y, tol, "output");
          same(f.dcw, r.dcw, tol, "conv weight gradient");
          check_same_batch_norm(f, r, affine, tol, dt == DType::F32 ? 1e-6 : 1e-12);
        }
}

TEST_CASE("conv2d_batch_norm_relu_max_pool2d: calls the small-patch kernel cannot take run conv2d + the fused BN",
          "[norm][pool][conv]") {
  kiln::manual_seed(32);
  const Case c{{2, 2, 6, 7}, 3, 3, 1, 1};
  Tensor x = kiln::randn(c.x), cw = kiln::randn({3, 2, 3, 3}), w = kiln::rand({3}) + 0.5, b = kiln::randn({3});
  Tensor g = kiln::randn({2, 3, 3, 3});
  // an input that needs its gradient: the fused backward has none
  Run f = run(true, c, x, cw, w, b, g, true, true, /*x_grad=*/true);
  Run r = run(false, c, x, cw, w, b, g, true, true, /*x_grad=*/true);
  // conv2d with BN's statistics in its epilogue, one node whose backward feeds the conv output's
  // gradient sample by sample to the conv's GEMMs
  CHECK(f.node == "ConvBatchNormReluMaxPoolGemmBackward");
  same(f.y, r.y, 1e-5, "output");
  same(f.dx, r.dx, 1e-5, "input gradient");
  same(f.dcw, r.dcw, 1e-5, "conv weight gradient");
  check_same_batch_norm(f, r, /*affine=*/true, 1e-5, 1e-6);
  kiln::NoGradGuard ng;
  auto both = [&](const Tensor& xx, const Tensor& ww, const Tensor& bias, const F::Conv2dParams& p, const char* what) {
    INFO(what);
    same(F::conv2d_batch_norm_relu_max_pool2d(xx, ww, bias, p, Tensor(), Tensor(), w, b, true),
         F::max_pool2d(kiln::relu(F::batch_norm(F::conv2d(xx, ww, bias, p), Tensor(), Tensor(), w, b, true)), 2), 1e-5,
         what);
  };
  F::Conv2dParams p = params_of(c);
  both(x, cw, kiln::randn({3}), p, "conv bias");
  F::Conv2dParams strided = p;
  strided.stride = {2, 2};
  both(kiln::randn({2, 2, 9, 9}), cw, Tensor(), strided, "stride 2");
  both(kiln::randn({2, 2, 7, 6}).transpose(2, 3), cw, Tensor(), p, "non-contiguous input");
  both(kiln::randn({2, 4, 6, 7}), kiln::randn({3, 4, 3, 3}), Tensor(), p, "a 36-tap patch");
}

// Patches too big for the small-patch kernel, in training: conv2d (BN statistics in its
// epilogue) + the fused BN + ReLU + pool, recorded as one node whose backward builds the conv
// output's gradient one sample at a time for the conv's GEMMs.
TEST_CASE("conv2d_batch_norm_relu_max_pool2d: the GEMM-backward path equals the op-by-op block", "[norm][pool][conv]") {
  kiln::manual_seed(36);
  struct G {
    IntList x;
    int64_t K, k, stride, pad, groups;
  };
  const std::vector<G> cases = {
      {{4, 8, 9, 11}, 6, 3, 1, 1, 1},   // 72-tap patch, odd output
      {{3, 6, 8, 8}, 4, 3, 1, 1, 2},    // groups
      {{2, 40, 6, 7}, 5, 1, 1, 0, 1},   // 1x1 (pointwise: the input is its own column matrix)
      {{2, 9, 11, 10}, 7, 3, 2, 1, 1},  // stride 2
      {{3, 16, 7, 7}, 8, 3, 1, 0, 1},   // no padding
  };
  for (const G& c : cases)
    for (DType dt : {DType::F32, DType::F64})
      for (int x_grad = 0; x_grad < 2; ++x_grad)
        for (int affine = 0; affine < 2; ++affine) {
          INFO("x " << c.x[0] << "x" << c.x[1] << "x" << c.x[2] << "x" << c.x[3] << " K " << c.K << " k " << c.k
                    << " stride " << c.stride << " groups " << c.groups << " dtype " << dt << " x_grad " << x_grad
                    << " affine " << affine);
          F::Conv2dParams p;
          p.stride = {c.stride, c.stride};
          p.padding = {c.pad, c.pad};
          p.groups = c.groups;
          Tensor x0 = kiln::randn(c.x, dt) + 0.3;
          Tensor cw0 = kiln::randn({c.K, c.x[1] / c.groups, c.k, c.k}, dt) * 0.3;
          Tensor w0 = kiln::rand({c.K}, dt) + 0.5, b0 = kiln::randn({c.K}, dt) * 0.5;
          const int64_t OH = (c.x[2] + 2 * c.pad - c.k) / c.stride + 1, OW = (c.x[3] + 2 * c.pad - c.k) / c.stride + 1;
          Tensor g = kiln::randn({c.x[0], c.K, OH / 2, OW / 2}, dt);
          Tensor r[2][7];
          std::string node;
          for (int fused = 0; fused < 2; ++fused) {
            Tensor x = x_grad ? x0.clone().requires_grad_() : x0;
            Tensor cw = cw0.clone().requires_grad_();
            Tensor w = affine ? w0.clone().requires_grad_() : Tensor(),
                   b = affine ? b0.clone().requires_grad_() : Tensor();
            Tensor rm = kiln::zeros({c.K}, dt), rv = kiln::ones({c.K}, dt);
            Tensor y =
                fused ? F::conv2d_batch_norm_relu_max_pool2d(x, cw, Tensor(), p, rm, rv, w, b, true)
                      : F::max_pool2d(kiln::relu(F::batch_norm(F::conv2d(x, cw, Tensor(), p), rm, rv, w, b, true)), 2);
            if (fused) node = y.grad_fn()->name();
            y.backward(g);
            Tensor got[7] = {
                y,  cw.grad(), x_grad ? x.grad() : Tensor(), affine ? w.grad() : Tensor(), affine ? b.grad() : Tensor(),
                rm, rv};
            for (int i = 0; i < 7; ++i) r[fused][i] = got[i];
          }
          CHECK(node == "ConvBatchNormReluMaxPoolGemmBackward");
          const double tol = dt == DType::F32 ? 2e-5 : 1e-10;
          const char* what[7] = {"output",           "conv weight gradient", "input gradient", "BN weight gradient",
                                 "BN bias gradient", "running_mean",         "running_var"};
          for (int i = 0; i < 7; ++i)
            if (r[0][i].defined()) same(r[1][i], r[0][i], tol, what[i]);
        }
  // f64 gradcheck through every input, the conv input included
  auto rn = [](IntList s) { return kiln::randn(s, f64(true)); };
  F::Conv2dParams p;
  p.padding = {1, 1};
  CHECK(kiln::gradcheck(
      [&](const TL& in) {
        return F::conv2d_batch_norm_relu_max_pool2d(in[0], in[1], Tensor(), p, Tensor(), Tensor(), in[2], in[3], true);
      },
      {rn({3, 5, 4, 6}), rn({3, 5, 3, 3}), rn({3}), rn({3})}));
}

TEST_CASE("conv2d_batch_norm_relu_max_pool2d: gradcheck (f64)", "[norm][pool][conv][gradcheck]") {
  kiln::manual_seed(33);
  auto r = [](IntList s) { return kiln::randn(s, f64(true)); };
  const Tensor x = kiln::randn({3, 2, 5, 6}, f64());
  F::Conv2dParams p;
  p.padding = {1, 1};
  // training: through the batch statistics into the conv weight, BN weight and bias
  CHECK(kiln::gradcheck(
      [&](const TL& in) {
        return F::conv2d_batch_norm_relu_max_pool2d(x, in[0], Tensor(), p, Tensor(), Tensor(), in[1], in[2], true);
      },
      {r({3, 2, 3, 3}), r({3}), r({3})}));
  // eval with running statistics, no affine parameters
  Tensor rm = kiln::tensor({0.1, -0.2, 0.3}, f64()), rv = kiln::tensor({0.7, 1.3, 0.9}, f64());
  CHECK(kiln::gradcheck(
      [&](const TL& in) {
        return F::conv2d_batch_norm_relu_max_pool2d(x, in[0], Tensor(), p, rm, rv, Tensor(), Tensor(), false);
      },
      {r({3, 2, 3, 3})}));
}

TEST_CASE("nn::ConvBatchNormReLU2d equals its layers run one by one", "[norm][pool][conv][module]") {
  kiln::manual_seed(34);
  namespace nn = kiln::nn;
  auto conv = std::make_shared<nn::Conv2d>(nn::Conv2dOptions(1, 8, 3).padding(1).bias(false));
  auto a = std::make_shared<nn::BatchNorm2d>(8), b = std::make_shared<nn::BatchNorm2d>(8);
  nn::MaxPool2d pool(nn::Pool2dOptions(2));
  nn::ConvBatchNormReLU2d block(conv, a, std::make_shared<nn::MaxPool2d>(nn::Pool2dOptions(2)));
  Tensor x = kiln::randn({4, 1, 12, 12});
  for (int step = 0; step < 2; ++step) same(block(x), pool(kiln::relu((*b)((*conv)(x)))), 1e-5, "output");
  same(a->running_mean, b->running_mean, 1e-6, "running_mean");
  same(a->running_var, b->running_var, 1e-6, "running_var");
  CHECK(a->num_batches_tracked.item<double>() == 2);
  block.eval();
  b->eval();
  same(block(x), pool(kiln::relu((*b)((*conv)(x)))), 1e-5, "eval output");
  CHECK(a->num_batches_tracked.item<double>() == 2);
  // registered as a layer of its own: the held layers' tensors under "conv", "bn"
  CHECK(block.state_dict().keys() == std::vector<std::string>{"conv.weight", "bn.weight", "bn.bias", "bn.running_mean",
                                                              "bn.running_var", "bn.num_batches_tracked"});
  REQUIRE_THROWS_AS(nn::ConvBatchNormReLU2d(conv, std::make_shared<nn::BatchNorm2d>(4)), kiln::Error);  // 8 channels
  REQUIRE_THROWS_AS(nn::ConvBatchNormReLU2d(conv, a, std::make_shared<nn::MaxPool2d>(nn::Pool2dOptions(3))),
                    kiln::Error);  // not the fused op's 2x2 pool
}

TEST_CASE("conv2d_batch_norm_relu_max_pool2d: errors name the op", "[norm][pool][conv]") {
  Tensor x = kiln::randn({2, 1, 6, 6}), cw = kiln::randn({3, 1, 3, 3}, kiln::TensorOptions().requires_grad(true));
  F::Conv2dParams p;
  p.padding = {1, 1};
  auto expect_error = [](auto&& f, const char* what) {
    INFO(what);
    try {
      f();
      FAIL("no error");
    } catch (const kiln::Error& e) {
      CHECK(std::string(e.what()).find("conv2d_batch_norm_relu_max_pool2d") != std::string::npos);
    }
  };
  expect_error(
      [&] {
        F::conv2d_batch_norm_relu_max_pool2d(x, cw, Tensor(), p, Tensor(), Tensor(), kiln::ones({4}), Tensor(), true);
      },
      "BatchNorm weight of the wrong size");
  expect_error(
      [&] { F::conv2d_batch_norm_relu_max_pool2d(x, cw, Tensor(), p, Tensor(), Tensor(), Tensor(), Tensor(), false); },
      "eval mode without running statistics");
  expect_error(
      [&] {
        F::conv2d_batch_norm_relu_max_pool2d(x, cw, Tensor(), p, kiln::zeros({3}), Tensor(), Tensor(), Tensor(), true);
      },
      "running_mean without running_var");
  // double backward through the fused path
  Tensor y = F::conv2d_batch_norm_relu_max_pool2d(x, cw, Tensor(), p, Tensor(), Tensor(), Tensor(), Tensor(), true);
  expect_error([&] { kiln::autograd::grad({y.sum()}, {cw}, {}, /*retain_graph=*/true, /*create_graph=*/true); },
               "double backward");
  // errors of the composite path still name conv2d
  REQUIRE_THROWS_AS(F::conv2d_batch_norm_relu_max_pool2d(x, kiln::randn({3, 2, 3, 3}), Tensor(), p, Tensor(), Tensor(),
                                                         Tensor(), Tensor(), true),
                    kiln::Error);
}

TEST_CASE("conv2d_forward_batch_stats: the conv output and its per-channel batch mean and variance", "[conv][norm]") {
  kiln::manual_seed(35);
  for (DType dt : {DType::F32, DType::F64})
    for (int64_t groups : {1, 2})
      for (bool with_bias : {false, true}) {
        INFO("dtype " << dt << " groups " << groups << " bias " << with_bias);
        const kiln::kernels::ConvGeometry g = conv_geometry({5, 4, 7, 9}, 6, {3, 3}, {1, 1}, groups);
        Tensor x = kiln::randn({5, 4, 7, 9}, dt) * 2.0 + 1.5;
        Tensor w = kiln::randn({6, 4 / groups, 3, 3}, dt);
        Tensor b = with_bias ? kiln::randn({6}, dt) : Tensor();
        const DType st = dt == DType::F64 ? DType::F64 : DType::F32;
        Tensor out = kiln::empty({5, 6, 7, 9}, kiln::TensorOptions().dtype(dt));
        Tensor mean = kiln::empty({6}, kiln::TensorOptions().dtype(st)),
               var = kiln::empty({6}, kiln::TensorOptions().dtype(st));
        kiln::kernels::conv2d_forward_batch_stats(out, mean, var, x, w, b, g);
        F::Conv2dParams p;
        p.padding = {1, 1};
        p.groups = groups;
        Tensor want = F::conv2d(x, w, b, p);
        const double tol = dt == DType::F32 ? 1e-5 : 1e-12;
        same(out, want, tol, "output");
        Tensor wd = want.to(DType::F64);
        same(mean, wd.mean({0, 2, 3}), tol, "mean");
        same(var, wd.var({0, 2, 3}, 0), tol, "biased variance");
      }
  // channels-last is not what the epilogue kernel reads
  kiln::kernels::ConvGeometry g = conv_geometry({1, 1, 4, 4}, 1, {1, 1}, {0, 0});
  g.channels_last = true;
  Tensor m = kiln::empty({1}), v = kiln::empty({1});
  REQUIRE_THROWS_AS(
      kiln::kernels::conv2d_forward_batch_stats(kiln::empty({1, 1, 4, 4}), m, v, kiln::randn({1, 1, 4, 4}),
                                                kiln::randn({1, 1, 1, 1}), Tensor(), g),
      kiln::Error);
}

TEST_CASE("conv2d_batch_norm_relu_max_pool2d: inputs the moments cannot serve", "[norm][pool][conv]") {
  kiln::manual_seed(37);
  auto composite = [](const Tensor& x, const Tensor& cw, const F::Conv2dParams& p, const Tensor& rm, const Tensor& rv) {
    return F::max_pool2d(kiln::relu(F::batch_norm(F::conv2d(x, cw, Tensor(), p), rm, rv, Tensor(), Tensor(), true)), 2);
  };
  SECTION("a NaN in an input column no patch reads (dilation 3) stays out of the statistics") {
    Tensor x = kiln::randn({1, 1, 4, 5});
    {
      kiln::NoGradGuard ng;
      x.select(3, 2).fill_(std::nan(""));  // columns 0,3 and 1,4 make the two output columns
    }
    Tensor cw = kiln::randn({3, 1, 1, 2});
    F::Conv2dParams p;
    p.dilation = {1, 3};
    Tensor rm = kiln::zeros({3}), rv = kiln::ones({3}), rm2 = kiln::zeros({3}), rv2 = kiln::ones({3});
    kiln::NoGradGuard ng;
    Tensor got = F::conv2d_batch_norm_relu_max_pool2d(x, cw, Tensor(), p, rm, rv, Tensor(), Tensor(), true);
    Tensor want = composite(x, cw, p, rm2, rv2);
    same(got, want, 1e-5, "output");
    same(rm, rm2, 1e-6, "running_mean");
    same(rv, rv2, 1e-6, "running_var");
  }
  SECTION("an f32 input whose mean dwarfs its spread takes the conv2d path") {
    Tensor x = kiln::randn({4, 1, 8, 8}) * 0.01 + 100.0;
    Tensor cw = kiln::randn({3, 1, 3, 3}).requires_grad_();
    F::Conv2dParams p;  // no padding: with it, the border patches' zeros would give y a large spread
    Tensor rm = kiln::zeros({3}), rv = kiln::ones({3}), rm2 = kiln::zeros({3}), rv2 = kiln::ones({3});
    Tensor got = F::conv2d_batch_norm_relu_max_pool2d(x, cw, Tensor(), p, rm, rv, Tensor(), Tensor(), true);
    CHECK(got.grad_fn()->name() != "ConvBatchNormReluMaxPoolBackward");
    Tensor want = composite(x, cw, p, rm2, rv2);
    // f32 conv outputs of ~100 carry only ~3 digits of their spread: both paths agree that far
    same(got, want, 3e-3, "output");
    same(rv, rv2, 1e-4, "running_var");
  }
}

TEST_CASE("conv block kernels reject inconsistent operands with an error", "[norm][pool][conv]") {
  const kiln::kernels::ConvGeometry g = conv_geometry({2, 1, 6, 6}, 3, {3, 3}, {1, 1});
  Tensor x = kiln::randn({2, 1, 6, 6}), cw = kiln::randn({3, 1, 3, 3});
  Tensor out = kiln::empty({2, 3, 3, 3}), codes = kiln::empty({2, 3, 3, 3}, kiln::TensorOptions().dtype(DType::U8));
  Tensor mean = kiln::zeros({3}), invstd = kiln::ones({3});
  REQUIRE_NOTHROW(
      kiln::kernels::conv_batch_norm_relu_max_pool2x2_forward(out, codes, x, cw, g, Tensor(), Tensor(), mean, invstd));
  REQUIRE_THROWS_AS(kiln::kernels::conv_batch_norm_relu_max_pool2x2_forward(out, codes, x, cw, g, Tensor(), Tensor(),
                                                                            kiln::zeros({2}), invstd),
                    kiln::Error);  // statistics of the wrong size
  REQUIRE_THROWS_AS(kiln::kernels::conv_batch_norm_relu_max_pool2x2_forward(out, codes, x, cw, g, kiln::ones({4}),
                                                                            Tensor(), mean, invstd),
                    kiln::Error);  // BatchNorm weight of the wrong size
  kiln::kernels::ConvGeometry bad = g;
  bad.OW = 5;  // not what 6 + 2 - 2 gives
  REQUIRE_THROWS_AS(kiln::kernels::conv_batch_norm_relu_max_pool2x2_forward(
                        kiln::empty({2, 3, 3, 2}), kiln::empty({2, 3, 3, 2}, kiln::TensorOptions().dtype(DType::U8)), x,
                        cw, bad, Tensor(), Tensor(), mean, invstd),
                    kiln::Error);
}

TEST_CASE("conv2d_backward_generated: NCHW only, gradients shaped like their operands", "[conv]") {
  const kiln::kernels::ConvGeometry g = conv_geometry({2, 2, 5, 5}, 3, {3, 3}, {1, 1});
  Tensor x = kiln::randn({2, 2, 5, 5}), w = kiln::randn({3, 2, 3, 3});
  Tensor gy = kiln::randn({2, 3, 5, 5});
  auto make_dy = [&](int64_t n, void* dy) {
    std::copy(gy.data_ptr<float>() + n * 75, gy.data_ptr<float>() + (n + 1) * 75, static_cast<float*>(dy));
  };
  // the generated gradient gives what conv2d's own backward gives
  Tensor gx = kiln::empty({2, 2, 5, 5}), gw = kiln::empty({3, 2, 3, 3});
  kiln::kernels::cpu::conv2d_backward_generated(gx, gw, x, w, g, make_dy);
  Tensor xr = x.clone().requires_grad_(), wr = w.clone().requires_grad_();
  F::Conv2dParams p;
  p.padding = {1, 1};
  F::conv2d(xr, wr, Tensor(), p).backward(gy);
  same(gx, xr.grad(), 1e-5, "input gradient");
  same(gw, wr.grad(), 1e-5, "weight gradient");
  REQUIRE_THROWS_AS(kiln::kernels::cpu::conv2d_backward_generated(gx, kiln::empty({3, 2, 3, 2}), x, w, g, make_dy),
                    kiln::Error);  // weight gradient of the wrong shape
  kiln::kernels::ConvGeometry cl = g;
  cl.channels_last = true;
  REQUIRE_THROWS_AS(kiln::kernels::cpu::conv2d_backward_generated(gx, gw, x, w, cl, make_dy), kiln::Error);
}
