// Convolutions: conv2d, conv1d and conv_transpose2d against direct loops in double written here
// (stride, padding, dilation, groups, depthwise, no bias, odd sizes, batch 3), in NCHW and
// channels-last layouts and for non-contiguous inputs; f64 gradchecks of every input; errors.
#include <cmath>

#include "tests/nn/nn_test_util.h"

namespace {

bool is_channels_last(const Tensor& t) {
  return t.stride(1) == 1 && t.stride(3) == t.size(1) && t.stride(2) == t.size(3) * t.size(1);
}

struct Cfg {
  int64_t N, C, H, W, K, kh, kw;
  IntList stride, padding, dilation;
  int64_t groups;
  bool bias;
};

// Direct convolution in double.
std::vector<double> naive_conv2d(const Tensor& xt, const Tensor& wt, const Tensor& bt, const Cfg& c, int64_t& OH,
                                 int64_t& OW) {
  auto x = values(xt), w = values(wt);
  std::vector<double> b = bt.defined() ? values(bt) : std::vector<double>(c.K, 0.0);
  OH = (c.H + 2 * c.padding[0] - c.dilation[0] * (c.kh - 1) - 1) / c.stride[0] + 1;
  OW = (c.W + 2 * c.padding[1] - c.dilation[1] * (c.kw - 1) - 1) / c.stride[1] + 1;
  const int64_t Cg = c.C / c.groups, Kg = c.K / c.groups;
  std::vector<double> out(c.N * c.K * OH * OW);
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t k = 0; k < c.K; ++k)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double s = b[k];
          const int64_t grp = k / Kg;
          for (int64_t ci = 0; ci < Cg; ++ci)
            for (int64_t i = 0; i < c.kh; ++i)
              for (int64_t j = 0; j < c.kw; ++j) {
                int64_t ih = oh * c.stride[0] - c.padding[0] + i * c.dilation[0];
                int64_t iw = ow * c.stride[1] - c.padding[1] + j * c.dilation[1];
                if (ih < 0 || ih >= c.H || iw < 0 || iw >= c.W) continue;
                s += x[((n * c.C + grp * Cg + ci) * c.H + ih) * c.W + iw] * w[((k * Cg + ci) * c.kh + i) * c.kw + j];
              }
          out[((n * c.K + k) * OH + oh) * OW + ow] = s;
        }
  return out;
}

F::Conv2dParams params_of(const Cfg& c) { return {c.stride, c.padding, c.dilation, c.groups}; }

const std::vector<Cfg> kConfigs = {
    {2, 3, 7, 5, 4, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true},     // pad 1, odd sizes
    {3, 3, 7, 5, 4, 3, 3, {2, 2}, {1, 1}, {1, 1}, 1, false},    // stride 2, batch 3, no bias
    {2, 2, 9, 8, 3, 3, 2, {1, 2}, {2, 0}, {2, 2}, 1, true},     // dilation 2, non-square kernel
    {2, 4, 6, 7, 6, 3, 3, {1, 1}, {1, 1}, {1, 1}, 2, true},     // groups 2
    {3, 3, 7, 5, 6, 3, 3, {2, 1}, {1, 1}, {1, 1}, 3, false},    // depthwise (multiplier 2)
    {2, 4, 5, 6, 6, 1, 1, {1, 1}, {0, 0}, {1, 1}, 2, true},     // 1x1 pointwise, groups 2
    {2, 5, 4, 4, 3, 4, 4, {1, 1}, {0, 0}, {1, 1}, 1, true},     // kernel == input
    {1, 1, 28, 28, 8, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, false},  // the CNN's first layer shape
    {2, 3, 3, 1, 2, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true},     // W = 1: side taps never read the image
    {1, 2, 2, 3, 2, 5, 5, {1, 1}, {2, 2}, {1, 1}, 1, false},    // 5x5 "same" on a 2x3 plane
    // batches of 5-7 small planes: the NCHW kernels put several samples into one GEMM (blocks of
    // 2-3 samples and a last single one), also with groups, stride 2 and pointwise
    {7, 4, 5, 4, 6, 3, 3, {1, 1}, {1, 1}, {1, 1}, 2, true},
    {5, 3, 7, 5, 4, 3, 3, {2, 2}, {1, 1}, {1, 1}, 1, true},
    {7, 3, 3, 3, 4, 1, 1, {1, 1}, {0, 0}, {1, 1}, 1, false},
};

}  // namespace

TEST_CASE("conv2d: forward matches direct loops (NCHW, channels-last, f32, f64)", "[conv]") {
  kiln::manual_seed(1);
  for (size_t ci = 0; ci < kConfigs.size(); ++ci) {
    const Cfg& c = kConfigs[ci];
    for (DType dt : {DType::F32, DType::F64}) {
      Tensor x = kiln::randn({c.N, c.C, c.H, c.W}, dt);
      Tensor w = kiln::randn({c.K, c.C / c.groups, c.kh, c.kw}, dt);
      Tensor b = c.bias ? kiln::randn({c.K}, dt) : Tensor();
      int64_t OH, OW;
      auto want = naive_conv2d(x, w, b, c, OH, OW);
      const double tol = dt == DType::F32 ? 1e-5 : 1e-12;
      Tensor y = F::conv2d(x, w, b, params_of(c));
      REQUIRE(y.sizes() == IntList{c.N, c.K, OH, OW});
      CHECK(y.is_contiguous());
      check_close_rel(y, want, tol, "config " + std::to_string(ci) + " NCHW");
      Tensor ycl = F::conv2d(channels_last(x), w, b, params_of(c));
      REQUIRE(ycl.sizes() == IntList{c.N, c.K, OH, OW});
      if (c.C > 1) CHECK(is_channels_last(ycl));
      check_close_rel(ycl, want, tol, "config " + std::to_string(ci) + " channels-last");
    }
  }
}

TEST_CASE("conv2d: non-contiguous inputs and weights", "[conv]") {
  kiln::manual_seed(2);
  Cfg c{2, 3, 6, 5, 4, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true};
  Tensor xt = kiln::randn({2, 3, 5, 6}).transpose(2, 3);    // [2, 3, 6, 5], strided
  Tensor xs = kiln::randn({2, 6, 6, 5}).slice(1, 0, 6, 2);  // every other channel
  Tensor wt = kiln::randn({4, 3, 3, 3}).transpose(2, 3);    // transposed kernel
  Tensor b = kiln::randn({4});
  for (const Tensor& x : {xt, xs}) {
    REQUIRE_FALSE(x.is_contiguous());
    int64_t OH, OW;
    auto want = naive_conv2d(x, wt, b, c, OH, OW);
    check_close_rel(F::conv2d(x, wt, b, params_of(c)), want, 1e-5, "strided input");
  }
  // 3-D (unbatched) input
  Tensor x3 = kiln::randn({3, 6, 5});
  int64_t OH, OW;
  c.N = 1;
  auto want = naive_conv2d(x3.unsqueeze(0), wt, b, c, OH, OW);
  Tensor y3 = F::conv2d(x3, wt, b, params_of(c));
  CHECK(y3.sizes() == IntList{4, OH, OW});
  check_close_rel(y3, want, 1e-5, "unbatched");
}

TEST_CASE("conv2d: gradcheck (f64)", "[conv][gradcheck]") {
  kiln::manual_seed(3);
  auto r = [](IntList s) { return kiln::randn(s, f64(true)); };
  const std::vector<Cfg> cfgs = {
      {2, 2, 5, 4, 3, 3, 3, {2, 1}, {1, 1}, {1, 1}, 1, true},
      {1, 4, 5, 5, 2, 2, 2, {1, 1}, {1, 0}, {2, 2}, 2, true},
      {2, 3, 4, 3, 3, 3, 2, {1, 1}, {1, 1}, {1, 1}, 3, false},  // depthwise
      {2, 4, 3, 3, 2, 1, 1, {1, 1}, {0, 0}, {1, 1}, 2, true},   // 1x1
      // "same"-width unit stride (one span per tap in im2col/col2im), incl. taps outside the image
      {2, 2, 4, 5, 3, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, false},
      {1, 2, 2, 3, 2, 5, 5, {1, 1}, {2, 2}, {1, 1}, 1, true},
      {2, 1, 3, 1, 2, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, false},
      // several samples per NCHW GEMM block (see the forward test's configs)
      {5, 2, 3, 3, 4, 3, 3, {1, 1}, {1, 1}, {1, 1}, 2, true},
      {5, 3, 2, 2, 2, 1, 1, {1, 1}, {0, 0}, {1, 1}, 1, false},
  };
  for (size_t i = 0; i < cfgs.size(); ++i) {
    const Cfg& c = cfgs[i];
    INFO("config " << i);
    auto p = params_of(c);
    TL in = {r({c.N, c.C, c.H, c.W}), r({c.K, c.C / c.groups, c.kh, c.kw})};
    if (c.bias) in.push_back(r({c.K}));
    CHECK(kiln::gradcheck([&](const TL& t) { return F::conv2d(t[0], t[1], t.size() > 2 ? t[2] : Tensor(), p); }, in));
    // the same through the channels-last kernels
    CHECK(kiln::gradcheck(
        [&](const TL& t) { return F::conv2d(channels_last(t[0]), t[1], t.size() > 2 ? t[2] : Tensor(), p); }, in));
  }
  // only some inputs need a gradient: bias alone, input alone
  Tensor x = r({1, 2, 4, 4}), w = kiln::randn({3, 2, 3, 3}, f64()), b = r({3});
  CHECK(kiln::gradcheck([&](const TL& t) { return F::conv2d(t[0], w, t[1]); }, {x, b}));
  Tensor xn = kiln::randn({1, 2, 4, 4}, f64()), w2 = r({3, 2, 3, 3});
  CHECK(kiln::gradcheck([&](const TL& t) { return F::conv2d(xn, t[0]); }, {w2}));
}

TEST_CASE("conv2d: CNN-sized gradients match a double-precision run", "[conv]") {
  // f32 forward+backward on a batch through both layouts against the same in f64.
  kiln::manual_seed(4);
  F::Conv2dParams p;
  p.padding = {1, 1};
  Tensor x64 = kiln::randn({4, 8, 14, 14}, f64()), w64 = kiln::randn({16, 8, 3, 3}, f64());
  Tensor gy = kiln::randn({4, 16, 14, 14}, f64());
  // and a ResNet stage-4 sized one, 4x4 planes: 9 samples, batched into multi-sample GEMM blocks
  Tensor xs64 = kiln::randn({9, 40, 4, 4}, f64()), ws64 = kiln::randn({24, 40, 3, 3}, f64());
  Tensor gys = kiln::randn({9, 24, 4, 4}, f64());
  Tensor xr = x64.detach().requires_grad_(), wr = w64.detach().requires_grad_();
  F::conv2d(xr, wr, Tensor(), p).backward(gy);
  for (bool cl : {false, true}) {
    INFO("channels_last " << cl);
    Tensor x = x64.to(DType::F32);
    if (cl) x = channels_last(x);
    x.requires_grad_();
    Tensor w = w64.to(DType::F32).requires_grad_();
    F::conv2d(x, w, Tensor(), p).backward(gy.to(DType::F32));
    check_close_rel(x.grad(), values(xr.grad()), 1e-4, "dx");
    check_close_rel(w.grad(), values(wr.grad()), 1e-4, "dw");
  }
  Tensor xsr = xs64.detach().requires_grad_(), wsr = ws64.detach().requires_grad_();
  Tensor ys = F::conv2d(xsr, wsr, Tensor(), p);
  ys.backward(gys);
  Tensor xs = xs64.to(DType::F32).requires_grad_(), ws = ws64.to(DType::F32).requires_grad_();
  Tensor ys32 = F::conv2d(xs, ws, Tensor(), p);
  ys32.backward(gys.to(DType::F32));
  check_close_rel(ys32, values(ys), 1e-4, "small planes: y");
  check_close_rel(xs.grad(), values(xsr.grad()), 1e-4, "small planes: dx");
  check_close_rel(ws.grad(), values(wsr.grad()), 1e-4, "small planes: dw");
}

TEST_CASE("conv1d: forward and gradcheck", "[conv]") {
  kiln::manual_seed(5);
  Tensor x = kiln::randn({3, 4, 11}, f64()), w = kiln::randn({6, 2, 3}, f64()), b = kiln::randn({6}, f64());
  Tensor y = F::conv1d(x, w, b, /*stride=*/2, /*padding=*/1, /*dilation=*/2, /*groups=*/2);
  Cfg c{3, 4, 1, 11, 6, 1, 3, {1, 2}, {0, 1}, {1, 2}, 2, true};
  int64_t OH, OW;
  auto want = naive_conv2d(x.unsqueeze(2), w.unsqueeze(2), b, c, OH, OW);
  REQUIRE(y.sizes() == IntList{3, 6, OW});
  check_close_rel(y, want, 1e-12, "conv1d");
  auto r = [](IntList s) { return kiln::randn(s, f64(true)); };
  CHECK(kiln::gradcheck([](const TL& t) { return F::conv1d(t[0], t[1], t[2], 2, 1, 1, 1); },
                        {r({2, 2, 7}), r({3, 2, 3}), r({3})}));
  REQUIRE_THROWS_AS(F::conv1d(x, w.unsqueeze(0), b), kiln::Error);
  REQUIRE_THROWS_AS(F::conv1d(x, kiln::randn({6, 3, 3}, f64()), b), kiln::Error);
}

namespace {

// Direct transposed convolution in double (a scatter).
std::vector<double> naive_conv_transpose2d(const Tensor& xt, const Tensor& wt, const Tensor& bt,
                                           const F::ConvTranspose2dParams& p, int64_t OH, int64_t OW) {
  auto x = values(xt), w = values(wt);
  const int64_t N = xt.size(0), Cin = xt.size(1), H = xt.size(2), W = xt.size(3);
  const int64_t Coutg = wt.size(1), kh = wt.size(2), kw = wt.size(3), G = p.groups;
  const int64_t Cout = Coutg * G, Cing = Cin / G;
  std::vector<double> out(N * Cout * OH * OW, 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t ci = 0; ci < Cin; ++ci)
      for (int64_t ih = 0; ih < H; ++ih)
        for (int64_t iw = 0; iw < W; ++iw)
          for (int64_t co = 0; co < Coutg; ++co)
            for (int64_t i = 0; i < kh; ++i)
              for (int64_t j = 0; j < kw; ++j) {
                int64_t oh = ih * p.stride[0] - p.padding[0] + i * p.dilation[0];
                int64_t ow = iw * p.stride[1] - p.padding[1] + j * p.dilation[1];
                if (oh < 0 || oh >= OH || ow < 0 || ow >= OW) continue;
                int64_t oc = (ci / Cing) * Coutg + co;
                out[((n * Cout + oc) * OH + oh) * OW + ow] +=
                    x[((n * Cin + ci) * H + ih) * W + iw] * w[((ci * Coutg + co) * kh + i) * kw + j];
              }
  if (bt.defined()) {
    auto b = values(bt);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t oc = 0; oc < Cout; ++oc)
        for (int64_t s = 0; s < OH * OW; ++s) out[(n * Cout + oc) * OH * OW + s] += b[oc];
  }
  return out;
}

}  // namespace

TEST_CASE("conv_transpose2d: forward matches a direct scatter, gradcheck", "[conv]") {
  kiln::manual_seed(6);
  struct TC {
    int64_t N, Cin, H, W, Coutg, kh, kw;
    F::ConvTranspose2dParams p;
    bool bias;
  };
  auto mk = [](IntList s, IntList pad, IntList op, IntList d, int64_t g) {
    F::ConvTranspose2dParams p;
    p.stride = s;
    p.padding = pad;
    p.output_padding = op;
    p.dilation = d;
    p.groups = g;
    return p;
  };
  const std::vector<TC> cases = {
      {2, 3, 4, 5, 2, 3, 3, mk({2, 2}, {1, 1}, {1, 0}, {1, 1}, 1), true},
      {1, 4, 3, 3, 3, 2, 3, mk({1, 2}, {0, 1}, {0, 1}, {2, 1}, 2), false},
      {3, 2, 5, 4, 1, 1, 1, mk({1, 1}, {0, 0}, {0, 0}, {1, 1}, 1), true},
  };
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const TC& c = cases[ci];
    INFO("case " << ci);
    Tensor x = kiln::randn({c.N, c.Cin, c.H, c.W}, f64()), w = kiln::randn({c.Cin, c.Coutg, c.kh, c.kw}, f64());
    Tensor b = c.bias ? kiln::randn({c.Coutg * c.p.groups}, f64()) : Tensor();
    int64_t OH =
        (c.H - 1) * c.p.stride[0] - 2 * c.p.padding[0] + c.p.dilation[0] * (c.kh - 1) + c.p.output_padding[0] + 1;
    int64_t OW =
        (c.W - 1) * c.p.stride[1] - 2 * c.p.padding[1] + c.p.dilation[1] * (c.kw - 1) + c.p.output_padding[1] + 1;
    auto want = naive_conv_transpose2d(x, w, b, c.p, OH, OW);
    Tensor y = F::conv_transpose2d(x, w, b, c.p);
    REQUIRE(y.sizes() == IntList{c.N, c.Coutg * c.p.groups, OH, OW});
    check_close_rel(y, want, 1e-12, "NCHW");
    check_close_rel(F::conv_transpose2d(channels_last(x), w, b, c.p), want, 1e-12, "channels-last");
    auto p = c.p;
    TL in = {x.detach().requires_grad_(), w.detach().requires_grad_()};
    if (c.bias) in.push_back(b.detach().requires_grad_());
    CHECK(kiln::gradcheck(
        [&](const TL& t) { return F::conv_transpose2d(t[0], t[1], t.size() > 2 ? t[2] : Tensor(), p); }, in));
  }
  Tensor x = kiln::randn({1, 2, 3, 3});
  F::ConvTranspose2dParams bad;
  bad.stride = {2, 2};
  bad.output_padding = {2, 0};  // must be < stride or dilation
  REQUIRE_THROWS_AS(F::conv_transpose2d(x, kiln::randn({2, 2, 3, 3}), Tensor(), bad), kiln::Error);
  REQUIRE_THROWS_AS(F::conv_transpose2d(x, kiln::randn({3, 2, 3, 3})), kiln::Error);  // C_in mismatch
}

TEST_CASE("conv2d: errors name the op and the shapes", "[conv]") {
  Tensor x = kiln::randn({2, 4, 6, 6});
  F::Conv2dParams p;
  // wrong weight rank
  REQUIRE_THROWS_AS(F::conv2d(x, kiln::randn({4, 4, 3})), kiln::Error);
  REQUIRE_THROWS_WITH(F::conv2d(x, kiln::randn({4, 4, 3})), Catch::Contains("conv2d") && Catch::Contains("[4, 4, 3]"));
  // channel mismatch: C_in != weight.size(1) * groups
  REQUIRE_THROWS_AS(F::conv2d(x, kiln::randn({8, 3, 3, 3})), kiln::Error);
  REQUIRE_THROWS_WITH(F::conv2d(x, kiln::randn({8, 3, 3, 3})),
                      Catch::Contains("conv2d") && Catch::Contains("[2, 4, 6, 6]") && Catch::Contains("[8, 3, 3, 3]"));
  p.groups = 2;
  REQUIRE_THROWS_AS(F::conv2d(x, kiln::randn({8, 4, 3, 3}), Tensor(), p), kiln::Error);
  // groups not dividing the channels
  p.groups = 3;
  REQUIRE_THROWS_AS(F::conv2d(x, kiln::randn({6, 1, 3, 3}), Tensor(), p), kiln::Error);
  p.groups = 2;
  REQUIRE_THROWS_AS(F::conv2d(x, kiln::randn({5, 2, 3, 3}), Tensor(), p), kiln::Error);
  p.groups = 0;
  REQUIRE_THROWS_AS(F::conv2d(x, kiln::randn({4, 4, 3, 3}), Tensor(), p), kiln::Error);
  // kernel larger than the padded input
  p = {};
  REQUIRE_THROWS_AS(F::conv2d(x, kiln::randn({4, 4, 7, 3})), kiln::Error);
  p.dilation = {3, 3};  // dilated 7x7
  REQUIRE_THROWS_AS(F::conv2d(x, kiln::randn({4, 4, 3, 3}), Tensor(), p), kiln::Error);
  p = {};
  p.padding = {1, 1};
  CHECK_NOTHROW(F::conv2d(x, kiln::randn({4, 4, 8, 8}), Tensor(), p));  // 8 <= 6 + 2
  // bad stride / padding / dilation
  p = {};
  p.stride = {0, 1};
  REQUIRE_THROWS_AS(F::conv2d(x, kiln::randn({4, 4, 3, 3}), Tensor(), p), kiln::Error);
  REQUIRE_THROWS_WITH(F::conv2d(x, kiln::randn({4, 4, 3, 3}), Tensor(), p),
                      Catch::Contains("conv2d") && Catch::Contains("stride"));
  p = {};
  p.padding = {-1, 0};
  REQUIRE_THROWS_AS(F::conv2d(x, kiln::randn({4, 4, 3, 3}), Tensor(), p), kiln::Error);
  p = {};
  p.stride = {1, 1, 1};
  REQUIRE_THROWS_AS(F::conv2d(x, kiln::randn({4, 4, 3, 3}), Tensor(), p), kiln::Error);
  // wrong input rank, bias size, dtype mismatch
  REQUIRE_THROWS_AS(F::conv2d(kiln::randn({4, 6}), kiln::randn({4, 4, 3, 3})), kiln::Error);
  REQUIRE_THROWS_AS(F::conv2d(x, kiln::randn({4, 4, 3, 3}), kiln::randn({5})), kiln::Error);
  REQUIRE_THROWS_AS(F::conv2d(x, kiln::randn({4, 4, 3, 3}, f64())), kiln::Error);
  REQUIRE_THROWS_AS(F::conv2d(x.to(DType::I64), kiln::randn({4, 4, 3, 3}).to(DType::I64)), kiln::Error);
}

TEST_CASE("conv2d: double backward is refused with a clear error", "[conv]") {
  Tensor x = kiln::randn({1, 2, 4, 4}, f64(true)), w = kiln::randn({2, 2, 3, 3}, f64(true));
  Tensor y = F::conv2d(x, w).sum();
  REQUIRE_THROWS_AS(kiln::autograd::grad({y}, {x}, {}, false, /*create_graph=*/true), kiln::Error);
}

TEST_CASE("conv2d: f16/bf16 inputs compute in f32", "[conv]") {
  kiln::manual_seed(7);
  Tensor x = kiln::randn({2, 3, 5, 5}), w = kiln::randn({4, 3, 3, 3});
  Cfg c{2, 3, 5, 5, 4, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, false};
  for (DType dt : {DType::F16, DType::BF16}) {
    Tensor xh = x.to(dt), wh = w.to(dt);
    Tensor y = F::conv2d(xh, wh, Tensor(), params_of(c));
    CHECK(y.dtype() == dt);
    int64_t OH, OW;
    auto want = naive_conv2d(xh, wh, Tensor(), c, OH, OW);
    check_close_rel(y, want, dt == DType::F16 ? 1e-2 : 5e-2, "half");  // output rounding only
  }
}

TEST_CASE("conv2d: CPU layout autotuning keeps results, layouts and gradients", "[conv][autotune]") {
  // With kiln::set_cpu_conv_autotune(true) the CPU kernels may run the other layout's kernel on
  // converted copies; whichever wins, the results must not change (beyond rounding) and the
  // output keeps the input's memory format.
  kiln::manual_seed(11);
  kiln::clear_cpu_conv_autotune_cache();
  const size_t cache_before = kiln::cpu_conv_autotune_cache_size();
  for (size_t ci = 0; ci < kConfigs.size(); ++ci) {
    const Cfg& c = kConfigs[ci];
    Tensor x0 = kiln::randn({c.N, c.C, c.H, c.W}, DType::F64);
    Tensor w0 = kiln::randn({c.K, c.C / c.groups, c.kh, c.kw}, DType::F64);
    for (bool cl : {false, true}) {
      auto run = [&](bool tune, Tensor* gx, Tensor* gw) {
        kiln::set_cpu_conv_autotune(tune);
        Tensor x = (cl ? channels_last(x0) : x0.clone()).requires_grad_();
        Tensor w = w0.clone().requires_grad_();
        Tensor y = F::conv2d(x, w, Tensor(), params_of(c));
        (y * y).sum().backward();
        *gx = x.grad();
        *gw = w.grad();
        return y;
      };
      Tensor gx_ref, gw_ref, gx, gw;
      Tensor ref = run(false, &gx_ref, &gw_ref);
      Tensor tuned = run(true, &gx, &gw);   // times both layouts, caches the choice
      Tensor cached = run(true, &gx, &gw);  // uses the cached choice
      kiln::set_cpu_conv_autotune(false);
      const std::string what = "config " + std::to_string(ci) + (cl ? " channels-last" : " NCHW");
      check_close_rel(tuned, values(ref), 1e-12, what + " forward (tuning run)");
      check_close_rel(cached, values(ref), 1e-12, what + " forward (cached)");
      check_close_rel(gx, values(gx_ref), 1e-12, what + " grad input");
      check_close_rel(gw, values(gw_ref), 1e-12, what + " grad weight");
      if (cl && c.C > 1 && c.K > 1) CHECK(is_channels_last(cached));
      if (!cl) CHECK(cached.is_contiguous());
    }
  }
  // forward, backward-input and backward-weight per (config, layout) were tuned and cached
  CHECK(kiln::cpu_conv_autotune_cache_size() > cache_before);
  kiln::clear_cpu_conv_autotune_cache();
  CHECK(kiln::cpu_conv_autotune_cache_size() == 0);
  // cuDNN's benchmark flag is cuDNN's only: the CPU kernels do not tune under it
  kiln::cudnn::set_benchmark(true);
  F::conv2d(kiln::randn({2, 3, 8, 8}, DType::F64), kiln::randn({4, 3, 3, 3}, DType::F64));
  kiln::cudnn::set_benchmark(false);
  CHECK(kiln::cpu_conv_autotune_cache_size() == 0);
  CHECK_FALSE(kiln::cpu_conv_autotune());
}
