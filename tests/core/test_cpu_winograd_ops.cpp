// Winograd on the CPU at the op level (kiln/kernels/cpu/winograd.h): Inf, NaN and overflowing
// operands refused by the kernels and bitwise the direct kernel's result through conv2d; conv2d
// with the switch (kiln::set_cpu_conv_winograd) on equal to it off within f32 rounding (forward,
// input and weight gradients, strided inputs, the fused conv block's backward); errors on
// geometries the kernels do not compute; which geometries, dtypes and tiles Winograd takes.
#include <catch2/catch.hpp>

#include <kiln/nn/fused/conv_block.h>
#include "tests/core/winograd_test_util.h"

using namespace winograd_test;

TEST_CASE("winograd kernels refuse Inf, NaN and overflowing inputs and weights", "[winograd]") {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  std::mt19937 rng(31);
  auto check_dtype = [&](auto tag) {
    using T = decltype(tag);
    INFO((sizeof(T) == 8 ? "f64" : "f32"));
    const T big = std::numeric_limits<T>::max() * T(0.75);
    for (const ConvGeometry& g :
         {geometry(2, 4, 3, 6, 7, 1, 1), geometry(13, 16, 16, 9, 7, 1, 2), geometry(2, 3, 2, 321, 319, 1, 2)}) {
      INFO(describe(g));
      const auto x = cast<T>(normals(g.N * g.C * g.H * g.W, rng)), w = cast<T>(normals(g.K * g.C * 9, rng));
      const auto b = cast<T>(normals(g.K, rng)), gy = cast<T>(normals(g.N * g.K * g.OH * g.OW, rng));
      std::vector<T> out(g.N * g.K * g.OH * g.OW), gx(x.size()), gw(w.size());
      auto fwd = [&](const std::vector<T>& xs, const std::vector<T>& ws) {
        return winograd_forward<T>(xs.data(), ws.data(), b.data(), out.data(), g);
      };
      auto bwd = [&](const std::vector<T>& gys, const std::vector<T>& ws) {
        return winograd_backward_input<T>(gys.data(), ws.data(), gx.data(), g);
      };
      auto bww = [&](const std::vector<T>& xs, const std::vector<T>& gys) {
        return winograd_backward_weight<T>(xs.data(), gys.data(), gw.data(), g);
      };
      CHECK(fwd(x, w));
      CHECK(bwd(gy, w));
      CHECK(bww(x, gy));
      // one bad value: first element, an interior one of the last sample, the last element (only
      // +Inf beyond the first, small geometry: each value that is not refused early costs a
      // whole convolution)
      const bool small = g.N * g.C * g.H * g.W < 1000;
      const std::vector<double> bad = small ? std::vector<double>{inf, -inf, nan} : std::vector<double>{inf};
      const int64_t last_plane = ((g.N - 1) * g.C + g.C / 2) * g.H * g.W;
      for (const int64_t at : {int64_t(0), last_plane + (g.H / 2) * g.W + g.W / 2, g.N * g.C * g.H * g.W - 1})
        for (const double v : bad) {
          INFO("x[" << at << "] = " << v);
          auto xs = x;
          xs[at] = static_cast<T>(v);
          CHECK_FALSE(fwd(xs, w));
          CHECK_FALSE(bww(xs, gy));
        }
      for (const int64_t at : {int64_t(0), g.K * g.C * 9 / 2 + 4, g.K * g.C * 9 - 1})
        for (const double v : bad.size() > 1 ? std::vector<double>{inf, nan} : bad) {
          INFO("w[" << at << "] = " << v);
          auto ws = w;
          ws[at] = static_cast<T>(v);
          CHECK_FALSE(fwd(x, ws));
          CHECK_FALSE(bwd(gy, ws));
        }
      {
        auto gys = gy;
        gys[gy.size() - 1] = static_cast<T>(inf);
        CHECK_FALSE(bwd(gys, w));
        CHECK_FALSE(bww(x, gys));
        gys[gy.size() - 1] = static_cast<T>(nan);
        CHECK_FALSE(bwd(gys, w));
        CHECK_FALSE(bww(x, gys));
        gys[gy.size() - 1] = gy[gy.size() - 1];
        gys[gy.size() / 2] = static_cast<T>(-inf);
        CHECK_FALSE(bwd(gys, w));
        CHECK_FALSE(bww(x, gys));
      }
      {  // finite, but the input transform overflows: three neighbours in a row of 0.75 * max, so
         // that some tile's d1 + d2 adds two of them whatever the padding's parity
        auto xs = x;
        const int64_t at = last_plane + (g.H / 2) * g.W + g.W / 2 - 1;
        xs[at] = xs[at + 1] = xs[at + 2] = big;
        CHECK_FALSE(fwd(xs, w));
      }
      CHECK(fwd(x, w));  // and finite again after all that
      CHECK(bwd(gy, w));
      CHECK(bww(x, gy));
    }
  };
  check_dtype(float{});
  check_dtype(double{});
}

TEST_CASE("conv2d with Inf or NaN in its operands is bitwise the direct kernel's result", "[winograd]") {
  kiln::manual_seed(41);
  F::Conv2dParams p;
  p.padding = {1, 1};
  const ConvGeometry g = geometry(2, 16, 16, 6, 7, 1, 1);
  {
    WinogradSwitch on(true);
    REQUIRE(winograd_applies(g, DType::F32));
  }
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor x0 = kiln::randn({g.N, g.C, g.H, g.W}), b = kiln::randn({g.K}),
               gy0 = kiln::randn({g.N, g.K, g.OH, g.OW});
  Tensor w = kiln::randn({g.K, g.C, 3, 3});
  {
    // weights that make output (0, k, 2, 4) of the Inf inputs below NaN (k = 0: Inf - Inf), +Inf
    // (k = 1) and -Inf (k = 2): its centre tap reads x[0, 3 or 5, 2, 4]
    float* wp = w.data_ptr<float>();
    auto centre = [&](int64_t k, int64_t c) -> float& { return wp[((k * g.C + c) * 3 + 1) * 3 + 1]; };
    centre(0, 3) = 1, centre(0, 5) = -1;
    centre(1, 3) = 1, centre(1, 5) = 2;
    centre(2, 3) = -1, centre(2, 5) = -2;
  }
  auto at = [&](Tensor& t, int64_t n, int64_t c, int64_t y, int64_t xx) -> float& {
    return t.data_ptr<float>()[((n * t.size(1) + c) * t.size(2) + y) * t.size(3) + xx];
  };
  auto forward_both = [&](const Tensor& x, const Tensor& wt) {
    Tensor on, off;
    {
      WinogradSwitch s(true);
      on = F::conv2d(x, wt, b, p);
    }
    {
      WinogradSwitch s(false);
      off = F::conv2d(x, wt, b, p);
    }
    return std::make_pair(on, off);
  };

  SECTION("Inf in the input") {
    Tensor x = x0.clone();
    at(x, 0, 3, 2, 4) = inf;
    at(x, 0, 5, 2, 4) = inf;
    auto [on, off] = forward_both(x, w);
    CHECK(std::isnan(at(off, 0, 0, 2, 4)));
    CHECK(at(off, 0, 1, 2, 4) == inf);
    CHECK(at(off, 0, 2, 2, 4) == -inf);
    CHECK(bitwise_equal(on, off));
    CHECK(at(on, 0, 1, 2, 4) == inf);
  }
  SECTION("NaN in the input") {
    Tensor x = x0.clone();
    at(x, 1, 7, 0, 0) = std::numeric_limits<float>::quiet_NaN();
    auto [on, off] = forward_both(x, w);
    for (int64_t k = 0; k < g.K; ++k) CHECK(std::isnan(at(off, 1, k, 0, 0)));
    CHECK_FALSE(std::isnan(at(off, 0, 0, 0, 0)));
    CHECK(bitwise_equal(on, off));
  }
  SECTION("Inf in the weight") {
    Tensor wi = w.clone();
    wi.data_ptr<float>()[5 * g.C * 9 + 4] = inf;  // w[5, 0, 1, 1]
    auto [on, off] = forward_both(x0, wi);
    CHECK(any_of_values(off, [](double v) { return std::isinf(v); }));
    CHECK(bitwise_equal(on, off));
  }
  SECTION("Inf in the output gradient: the input gradient") {
    Tensor gy = gy0.clone();
    at(gy, 1, 4, 3, 3) = inf;
    at(gy, 0, 9, 0, 6) = -inf;
    auto grad = [&](bool winograd) {
      WinogradSwitch s(winograd);
      Tensor x = x0.clone().requires_grad_();
      F::conv2d(x, w, b, p).backward(gy);
      return x.grad();
    };
    const Tensor on = grad(true), off = grad(false);
    CHECK(any_of_values(off, [](double v) { return std::isinf(v); }));
    CHECK(bitwise_equal(on, off));
  }
  SECTION("finite operands whose products overflow: +Inf as the direct kernel gives, not NaN") {
    // every transformed value is finite, but products of 1e19 by 1e19 are not: only the result
    // check catches it (forward and weight gradient)
    const Tensor x = kiln::full({1, 16, 6, 6}, 1e19), wt = kiln::full({16, 16, 3, 3}, 1e19);
    auto [on, off] = forward_both(x, wt);
    CHECK(at(off, 0, 0, 2, 2) == inf);
    CHECK_FALSE(any_of_values(off, [](double v) { return std::isnan(v); }));
    CHECK(bitwise_equal(on, off));
    auto wgrad = [&](bool winograd) {
      WinogradSwitch s(winograd);
      Tensor wr = wt.clone().requires_grad_();
      F::conv2d(x, wr, Tensor(), p).backward(kiln::full({1, 16, 6, 6}, 1e19));
      return wr.grad();
    };
    const Tensor gw_on = wgrad(true), gw_off = wgrad(false);
    CHECK(any_of_values(gw_off, [](double v) { return std::isinf(v); }));
    CHECK(bitwise_equal(gw_on, gw_off));
  }
  SECTION("Inf in a late sample of the batch statistics' conv (fallback after samples_done)") {
    // several whole samples per chunk on two threads: Winograd reports some samples, then fails
    Threads th(2);
    const ConvGeometry gs = geometry(13, 16, 16, 9, 7, 1, 2);
    Tensor x = kiln::randn({gs.N, gs.C, gs.H, gs.W}), ws = kiln::randn({gs.K, gs.C, 3, 3});
    at(x, 12, 0, 4, 4) = inf;
    auto run = [&](bool winograd) {
      WinogradSwitch s(winograd);
      Tensor out = kiln::empty({gs.N, gs.K, gs.OH, gs.OW}), mean = kiln::empty({gs.K}), var = kiln::empty({gs.K});
      kiln::kernels::conv2d_forward_batch_stats(out, mean, var, x, ws, Tensor(), gs);
      return std::vector<Tensor>{out, mean, var};
    };
    const auto on = run(true), off = run(false);
    CHECK(any_of_values(off[0], [](double v) { return std::isinf(v); }));
    for (size_t i = 0; i < 3; ++i) {
      INFO("result " << i);
      CHECK(bitwise_equal(on[i], off[i]));
    }
  }
}

TEST_CASE("conv2d with Winograd on equals it off: forward, input and weight gradients, strided inputs", "[winograd]") {
  kiln::manual_seed(51);
  F::Conv2dParams p;
  p.padding = {1, 1};
  struct Input {
    const char* what;
    Tensor leaf;                                // what the gradient lands on
    std::function<Tensor(const Tensor&)> view;  // the conv's input from the leaf
    bool strided;                               // whether that input is not contiguous
  };
  const std::vector<Input> inputs = {
      {"9x9", kiln::randn({3, 32, 9, 9}), [](const Tensor& t) { return t; }, false},
      {"10x10", kiln::randn({3, 32, 10, 10}), [](const Tensor& t) { return t; }, false},
      {"transposed 9x10 view", kiln::randn({3, 32, 10, 9}), [](const Tensor& t) { return t.transpose(2, 3); }, true},
      {"every other channel", kiln::randn({3, 64, 10, 9}), [](const Tensor& t) { return t.slice(1, 0, 64, 2); }, true},
  };
  const Tensor w0 = kiln::randn({32, 32, 3, 3}), b0 = kiln::randn({32});
  for (const Input& in : inputs) {
    INFO(in.what);
    const Tensor xv = in.view(in.leaf);
    REQUIRE(xv.size(1) == 32);
    CHECK(xv.is_contiguous() == !in.strided);
    {
      WinogradSwitch on(true);
      REQUIRE(winograd_applies(geometry(3, 32, 32, xv.size(2), xv.size(3), 1, 1), DType::F32));
    }
    const Tensor gy = kiln::randn({3, 32, xv.size(2), xv.size(3)});
    struct Result {
      std::vector<double> y, gx, gw, gb;
      Tensor ty, tgx, tgw, tgb;
    };
    auto run = [&](const Tensor& leaf, const Tensor& w, const Tensor& b, const Tensor& g) {
      Tensor l = leaf.detach().clone().requires_grad_(), wl = w.detach().clone().requires_grad_(),
             bl = b.detach().clone().requires_grad_();
      Tensor y = F::conv2d(in.view(l), wl, bl, p);
      y.backward(g);
      return Result{values(y),  values(l.grad()), values(wl.grad()), values(bl.grad()),
                    y.detach(), l.grad(),         wl.grad(),         bl.grad()};
    };
    Result on, off;
    {
      WinogradSwitch s(true);
      on = run(in.leaf, w0, b0, gy);
    }
    {
      WinogradSwitch s(false);
      off = run(in.leaf, w0, b0, gy);
    }
    const Result ref = run(in.leaf.to(DType::F64), w0.to(DType::F64), b0.to(DType::F64), gy.to(DType::F64));
    // the same in f64 on |x|, |w|, |b|, |gy|: each result's sum of the magnitudes of its terms
    const Result mag =
        run(in.leaf.to(DType::F64).abs(), w0.to(DType::F64).abs(), b0.to(DType::F64).abs(), gy.to(DType::F64).abs());
    auto check = [](const std::vector<double>& got, const std::vector<double>& want, const std::vector<double>& m,
                    const char* what) {
      INFO(what);
      REQUIRE(got.size() == want.size());
      CHECK(worst_error(got.data(), Ref{want, m}, true) <= tolerance32());
    };
    check(on.y, ref.y, mag.y, "y, Winograd");
    check(off.y, ref.y, mag.y, "y, direct");
    check(on.gx, ref.gx, mag.gx, "gx, Winograd");
    check(off.gx, ref.gx, mag.gx, "gx, direct");
    check(on.gw, ref.gw, mag.gw, "gw, Winograd");
    check(off.gw, ref.gw, mag.gw, "gw, direct");
    check(on.gb, ref.gb, mag.gb, "gb, Winograd");
    // the switch did change the computation (other roundings somewhere) ...
    CHECK_FALSE(bitwise_equal(on.ty, off.ty));
    CHECK_FALSE(bitwise_equal(on.tgx, off.tgx));
    CHECK_FALSE(bitwise_equal(on.tgw, off.tgw));
    // ... but not the bias gradient, a plain sum of gy either way
    CHECK(bitwise_equal(on.tgb, off.tgb));
  }
}

TEST_CASE("winograd kernels called on a geometry they do not compute raise kiln::Error", "[winograd]") {
  ConvGeometry g = geometry(1, 4, 4, 6, 6, 1, 1);
  g.sh = g.sw = 2;  // stride 2
  g.OH = g.OW = 3;
  std::vector<float> x(4 * 36, 1.0f), w(4 * 4 * 9, 1.0f), y(4 * 9), gy(4 * 9, 1.0f), gx(x.size()), gw(w.size());
  CHECK_THROWS_AS(winograd_forward<float>(x.data(), w.data(), nullptr, y.data(), g), kiln::Error);
  CHECK_THROWS_AS(winograd_backward_input<float>(gy.data(), w.data(), gx.data(), g), kiln::Error);
  CHECK_THROWS_AS(winograd_backward_weight<float>(x.data(), gy.data(), gw.data(), g), kiln::Error);
  CHECK_THROWS_AS(winograd_backward_generated<float>(x.data(), w.data(), gx.data(), gw.data(), g, {}), kiln::Error);
  CHECK_THROWS_AS(winograd_backward_both<float>(x.data(), gy.data(), w.data(), gx.data(), gw.data(), g), kiln::Error);
  CHECK_THROWS_WITH(winograd_forward<float>(x.data(), w.data(), nullptr, y.data(), g),
                    Catch::Contains("not a 3x3 stride-1 NCHW convolution"));
}

TEST_CASE("conv2d_backward (both gradients in one call) rejects a missing or misshapen grad_weight", "[winograd]") {
  const ConvGeometry g = geometry(2, 16, 16, 6, 6, 1, 1);
  const Tensor x = kiln::randn({2, 16, 6, 6}), w = kiln::randn({16, 16, 3, 3}), gy = kiln::randn({2, 16, 6, 6});
  Tensor gx = kiln::empty({2, 16, 6, 6});
  CHECK_THROWS_WITH(kiln::kernels::conv2d_backward(gx, Tensor(), Tensor(), gy, x, w, g),
                    Catch::Contains("grad_weight must be contiguous like the weight"));
  CHECK_THROWS_AS(kiln::kernels::conv2d_backward(gx, kiln::empty({16, 16, 3, 2}), Tensor(), gy, x, w, g), kiln::Error);
  CHECK_THROWS_AS(
      kiln::kernels::conv2d_backward(gx, kiln::empty({16, 16, 3, 3}).transpose(0, 1), Tensor(), gy, x, w, g),
      kiln::Error);
  // and with a good one it writes both gradients as the two single kernels do, bias included
  Tensor gw = kiln::empty({16, 16, 3, 3}), gb = kiln::empty({16});
  kiln::kernels::conv2d_backward(gx, gw, gb, gy, x, w, g);
  Tensor gx2 = kiln::empty_like(gx), gw2 = kiln::empty_like(gw), gb2 = kiln::empty_like(gb);
  kiln::kernels::conv2d_backward_input(gx2, gy, w, g);
  kiln::kernels::conv2d_backward_weight(gw2, gb2, gy, x, g);
  CHECK(bitwise_equal(gx, gx2));
  CHECK(bitwise_equal(gw, gw2));
  CHECK(bitwise_equal(gb, gb2));
}

TEST_CASE("winograd_applies: f32 NCHW 3x3 stride-1 convolutions of 16+ channels, switch on", "[winograd]") {
  WinogradSwitch on(true);
  CHECK(kiln::cpu_conv_winograd());
  const ConvGeometry base = geometry(3, 32, 32, 9, 9, 1, 1);
  CHECK(winograd_applies(base, DType::F32));
  CHECK(winograd_applies(geometry(3, 16, 16, 10, 10, 1, 1), DType::F32));
  CHECK(winograd_applies(geometry(1, 32, 32, 9, 9, 0, 2), DType::F32));  // padding 0 and 2 are Winograd's too
  CHECK_FALSE(winograd_applies(base, DType::F64));
  CHECK_FALSE(winograd_applies(base, DType::F16));
  ConvGeometry g = base;
  g.sh = g.sw = 2, g.OH = g.OW = 5;
  CHECK_FALSE(winograd_applies(g, DType::F32));  // stride 2
  g = base;
  g.sh = 2, g.OH = 5;
  CHECK_FALSE(winograd_applies(g, DType::F32));  // stride 2 along one axis
  g = base;
  g.kh = g.kw = 5, g.ph = g.pw = 2;
  CHECK_FALSE(winograd_applies(g, DType::F32));  // 5x5 (same 9x9 output)
  g = base;
  g.groups = 2;
  CHECK_FALSE(winograd_applies(g, DType::F32));  // groups 2
  g = base;
  g.channels_last = true;
  CHECK_FALSE(winograd_applies(g, DType::F32));  // channels-last
  g = base;
  g.dh = g.dw = 2, g.ph = g.pw = 2;
  CHECK_FALSE(winograd_applies(g, DType::F32));                                // dilation 2 (same 9x9 output)
  CHECK_FALSE(winograd_applies(geometry(3, 32, 32, 9, 9, 3, 3), DType::F32));  // padding 3
  CHECK_FALSE(winograd_applies(geometry(3, 32, 32, 9, 9, 1, 3), DType::F32));  // padding 3 on one axis
  CHECK_FALSE(winograd_applies(geometry(3, 3, 32, 9, 9, 1, 1), DType::F32));   // C = 3
  CHECK_FALSE(winograd_applies(geometry(3, 32, 8, 9, 9, 1, 1), DType::F32));   // K = 8
  {
    WinogradSwitch off(false);
    CHECK_FALSE(kiln::cpu_conv_winograd());
    CHECK_FALSE(winograd_applies(base, DType::F32));
    CHECK(winograd_geometry(base));  // the geometry is still one the kernels compute
  }
  CHECK(kiln::cpu_conv_winograd());  // the guard restored it
  CHECK(winograd_applies(base, DType::F32));
}

TEST_CASE("conv2d_batch_norm_relu_max_pool2d's generated backward with Winograd on equals it off", "[winograd]") {
  // the fused conv-block path whose conv backward gets its output gradient one sample at a time
  // (kiln/kernels/conv_block.h); its 3x3 stride-1 conv of 16 channels runs Winograd when on
  kiln::manual_seed(43);
  const Tensor x0 = kiln::randn({5, 16, 10, 10}), cw0 = kiln::randn({24, 16, 3, 3}) * 0.1;
  const Tensor bw = kiln::rand({24}) + 0.5, bb = kiln::randn({24});
  F::Conv2dParams p;
  p.padding = {1, 1};
  auto run = [&](bool winograd) {
    WinogradSwitch s(winograd);
    Tensor x = x0.clone().requires_grad_(), cw = cw0.clone().requires_grad_();
    Tensor rm = kiln::zeros({24}), rv = kiln::ones({24});
    Tensor y = F::conv2d_batch_norm_relu_max_pool2d(x, cw, Tensor(), p, rm, rv, bw, bb, true);
    (y * y).sum().backward();
    return std::vector<Tensor>{y.detach(), x.grad(), cw.grad()};
  };
  const auto on = run(true), off = run(false);
  const char* names[] = {"output", "input gradient", "conv weight gradient"};
  for (size_t i = 0; i < 3; ++i) {
    INFO(names[i]);
    const double scale = kiln::abs(off[i]).max().item<double>() + 1;
    CHECK(kiln::abs(on[i] - off[i]).max().item<double>() <= 1e-4 * scale);
  }
  // the switch made a difference: Winograd ran
  CHECK_FALSE(bitwise_equal(on[2], off[2]));
}

TEST_CASE("winograd_tile: F(4x4, 3x3) where its products dominate; set_cpu_conv_winograd_tile forces one",
          "[winograd]") {
  REQUIRE(kiln::cpu_conv_winograd_tile() == 0);
  // ResNet-18's 3x3 stride-1 layers (padding 1) and the CNN's conv2
  CHECK(kiln::kernels::cpu::winograd_tile(geometry(2, 64, 64, 28, 28, 1, 1)) == 4);    // 0.56x the products
  CHECK(kiln::kernels::cpu::winograd_tile(geometry(2, 128, 128, 14, 14, 1, 1)) == 2);  // 0.73x
  CHECK(kiln::kernels::cpu::winograd_tile(geometry(2, 256, 256, 7, 7, 1, 1)) == 4);    // 0.56x
  CHECK(kiln::kernels::cpu::winograd_tile(geometry(2, 512, 512, 4, 4, 1, 1)) == 2);    // one tile per sample
  CHECK(kiln::kernels::cpu::winograd_tile(geometry(2, 32, 64, 14, 14, 1, 1)) == 2);    // 32 channels in
  CHECK(kiln::kernels::cpu::winograd_tile(geometry(2, 64, 64, 6, 6, 1, 1)) == 2);      // as many products
  {
    Tile four(4);
    CHECK(kiln::kernels::cpu::winograd_tile(geometry(2, 32, 64, 14, 14, 1, 1)) == 4);
    Tile two(2);
    CHECK(kiln::kernels::cpu::winograd_tile(geometry(2, 64, 64, 28, 28, 1, 1)) == 2);
  }
  CHECK(kiln::cpu_conv_winograd_tile() == 0);  // the guards restored it
  for (int bad : {-1, 1, 3, 6}) {
    INFO("tile " << bad);
    CHECK_THROWS_AS(kiln::set_cpu_conv_winograd_tile(bad), kiln::Error);
  }
  CHECK(kiln::cpu_conv_winograd_tile() == 0);
}
