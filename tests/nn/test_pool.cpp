// Pooling: max_pool2d, avg_pool2d (count_include_pad both ways) and adaptive_avg_pool2d against
// direct loops in double written here, for NCHW, channels-last and non-contiguous inputs; ties in
// max_pool2d send the gradient to the first maximum (as PyTorch does); f64 gradchecks; errors.
#include <algorithm>
#include <cmath>
#include <limits>

#include "tests/nn/nn_test_util.h"

namespace {

void pcheck(const Tensor& got, const std::vector<double>& want, double tol, const std::string& what) {
  INFO(what);
  auto g = values(got);
  REQUIRE(g.size() == want.size());
  for (size_t i = 0; i < g.size(); ++i) {
    INFO("element " << i << ": got " << g[i] << " want " << want[i]);
    REQUIRE(std::abs(g[i] - want[i]) <= tol * (1 + std::abs(want[i])));
  }
}

enum class Kind { Max, AvgPad, AvgNoPad };

// Direct pooling in double: window (kh, kw), stride, padding; floor mode.
std::vector<double> naive_pool(const Tensor& xt, Kind kind, IntList k, IntList s, IntList p, int64_t& OH, int64_t& OW) {
  auto x = values(xt);
  const int64_t N = xt.size(0), C = xt.size(1), H = xt.size(2), W = xt.size(3);
  OH = (H + 2 * p[0] - k[0]) / s[0] + 1;
  OW = (W + 2 * p[1] - k[1]) / s[1] + 1;
  std::vector<double> out;
  for (int64_t nc = 0; nc < N * C; ++nc)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        double best = -std::numeric_limits<double>::infinity(), sum = 0;
        int64_t cnt = 0;
        for (int64_t i = 0; i < k[0]; ++i)
          for (int64_t j = 0; j < k[1]; ++j) {
            int64_t h = oh * s[0] - p[0] + i, w = ow * s[1] - p[1] + j;
            if (h < 0 || h >= H || w < 0 || w >= W) continue;
            double v = x[(nc * H + h) * W + w];
            best = std::max(best, v);
            sum += v;
            ++cnt;
          }
        if (kind == Kind::Max) out.push_back(best);
        else if (kind == Kind::AvgPad) out.push_back(sum / double(k[0] * k[1]));
        else out.push_back(sum / double(cnt));
      }
  return out;
}

}  // namespace

TEST_CASE("max_pool2d / avg_pool2d: forward matches direct loops", "[pool]") {
  kiln::manual_seed(11);
  struct PC {
    IntList shape, k, s, p;
  };
  const std::vector<PC> cases = {
      {{2, 3, 8, 8}, {2, 2}, {}, {0, 0}},      // the CNN's pool
      {{3, 2, 7, 5}, {3, 3}, {2, 2}, {1, 1}},  // odd sizes, padding
      {{1, 4, 9, 6}, {3, 2}, {1, 2}, {1, 0}},  // non-square everything
      {{2, 1, 5, 5}, {5, 5}, {1, 1}, {2, 2}},  // window = input, max padding
  };
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const PC& c = cases[ci];
    INFO("case " << ci);
    for (DType dt : {DType::F32, DType::F64}) {
      Tensor x = kiln::randn(c.shape, dt);
      IntList s = c.s.empty() ? c.k : c.s;
      int64_t OH, OW;
      for (int layout = 0; layout < 3; ++layout) {
        Tensor xin = layout == 0 ? x : layout == 1 ? channels_last(x) : x.transpose(2, 3).contiguous().transpose(2, 3);
        auto mx = naive_pool(x, Kind::Max, c.k, s, c.p, OH, OW);
        Tensor y = F::max_pool2d(xin, c.k, c.s, c.p);
        REQUIRE(y.sizes() == IntList{c.shape[0], c.shape[1], OH, OW});
        pcheck(y, mx, 1e-6, "max layout " + std::to_string(layout));
        pcheck(F::avg_pool2d(xin, c.k, c.s, c.p, true), naive_pool(x, Kind::AvgPad, c.k, s, c.p, OH, OW), 1e-6,
               "avg count_include_pad layout " + std::to_string(layout));
        pcheck(F::avg_pool2d(xin, c.k, c.s, c.p, false), naive_pool(x, Kind::AvgNoPad, c.k, s, c.p, OH, OW), 1e-6,
               "avg exclude pad layout " + std::to_string(layout));
        if (layout == 1 && c.shape[1] > 1) {
          CHECK(y.stride(1) == 1);  // channels-last in, channels-last out
        }
      }
    }
  }
  // the integer shorthand and a 3-D input
  Tensor x = kiln::randn({3, 6, 4});
  CHECK(F::max_pool2d(x.unsqueeze(0), 2).sizes() == IntList{1, 3, 3, 2});
  CHECK(F::max_pool2d(x, {2, 2}).sizes() == IntList{3, 3, 2});
}

TEST_CASE("max_pool2d: ties send the gradient to the first maximum", "[pool]") {
  Tensor x = kiln::tensor({1.0, 3.0, 3.0, 0.0,  //
                           3.0, 2.0, 5.0, 5.0,  //
                           0.0, 0.0, 7.0, 1.0,  //
                           0.0, 0.0, 2.0, 7.0},
                          f64())
                 .view({1, 1, 4, 4})
                 .detach()
                 .requires_grad_();
  Tensor y = F::max_pool2d(x, 2);
  pcheck(y, {3, 5, 0, 7}, 0, "values");
  y.backward(kiln::tensor({1.0, 2.0, 3.0, 4.0}, f64()).view({1, 1, 2, 2}));
  pcheck(x.grad(),
         {0, 1, 0, 0,  //
          0, 0, 2, 0,  //
          3, 0, 4, 0,  //
          0, 0, 0, 0},
         0, "grad");
  // overlapping windows accumulate
  Tensor x2 = kiln::tensor({0.0, 9.0, 0.0, 1.0, 2.0, 3.0}, f64()).view({1, 1, 2, 3}).detach().requires_grad_();
  F::max_pool2d(x2, {2, 2}, {1, 1}).sum().backward();
  pcheck(x2.grad(), {0, 2, 0, 0, 0, 0}, 0, "overlap");
}

// The f32 2x2 fast paths (a 16-wide vector loop with a masked tail; tiling backward, both layouts)
// against a row-order scan: ties pick the first maximum, NaN wins and propagates, odd H and W
// leave a last row/column that gets no gradient.
TEST_CASE("max_pool2d 2x2 f32: ties, NaN and tails match a row-order scan", "[pool]") {
  kiln::manual_seed(5);
  const int64_t N = 2, C = 3, H = 7, W = 37;                    // OW = 18: one full 16-wide step and a tail of 2
  Tensor x = kiln::randint(0, 4, {N, C, H, W}).to(DType::F32);  // many ties
  float* xp = static_cast<float*>(x.data_ptr());
  auto at = [&](int64_t n, int64_t c, int64_t h, int64_t w) -> float& { return xp[((n * C + c) * H + h) * W + w]; };
  at(0, 0, 0, 3) = std::numeric_limits<float>::quiet_NaN();
  at(1, 2, 4, 30) = std::numeric_limits<float>::quiet_NaN();
  at(1, 2, 5, 31) = std::numeric_limits<float>::quiet_NaN();  // two NaNs in one window
  const int64_t OH = H / 2, OW = W / 2;
  auto xv = values(x);
  std::vector<double> want_y, want_g(xv.size(), 0.0);
  std::vector<double> gy;
  for (int64_t i = 0; i < N * C * OH * OW; ++i) gy.push_back(1.0 + static_cast<double>(i % 97));
  for (int64_t nc = 0, o = 0; nc < N * C; ++nc)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow, ++o) {
        int64_t bi = (nc * H + 2 * oh) * W + 2 * ow;
        double best = xv[bi];
        for (int64_t i = 0; i < 2; ++i)
          for (int64_t j = 0; j < 2; ++j) {
            int64_t at = (nc * H + 2 * oh + i) * W + 2 * ow + j;
            if (xv[at] > best || std::isnan(xv[at])) best = xv[at], bi = at;
          }
        want_y.push_back(best);
        want_g[bi] += gy[o];
      }
  Tensor g = kiln::tensor(gy, DType::F32).view({N, C, OH, OW});
  for (int layout = 0; layout < 2; ++layout) {
    INFO("layout " << (layout ? "channels-last" : "NCHW"));
    Tensor xin = (layout ? channels_last(x) : x.clone()).detach().requires_grad_();
    Tensor y = F::max_pool2d(xin, 2);
    auto yv = values(y);
    REQUIRE(yv.size() == want_y.size());
    for (size_t i = 0; i < yv.size(); ++i) {
      INFO("output " << i);
      if (std::isnan(want_y[i])) REQUIRE(std::isnan(yv[i]));
      else REQUIRE(yv[i] == want_y[i]);
    }
    y.backward(layout ? channels_last(g) : g);
    pcheck(xin.grad(), want_g, 0, "grad");
  }
}

TEST_CASE("pooling: gradcheck (f64)", "[pool][gradcheck]") {
  kiln::manual_seed(12);
  // distinct values keep max_pool2d differentiable under finite differences
  auto distinct = [](IntList s) {
    Tensor t = kiln::randn(s, f64());
    return (t + kiln::arange(0.0, double(t.numel()), 1.0, f64()).view(s) * 0.37).detach().requires_grad_();
  };
  Tensor x = distinct({2, 2, 5, 4});
  CHECK(kiln::gradcheck([](const TL& t) { return F::max_pool2d(t[0], {3, 2}, {2, 1}, {1, 1}); }, {x}));
  CHECK(kiln::gradcheck([](const TL& t) { return F::max_pool2d(channels_last(t[0]), 2); }, {x}));
  CHECK(kiln::gradcheck([](const TL& t) { return F::avg_pool2d(t[0], {3, 3}, {2, 2}, {1, 1}, true); }, {x}));
  CHECK(kiln::gradcheck([](const TL& t) { return F::avg_pool2d(t[0], {3, 3}, {2, 1}, {1, 1}, false); }, {x}));
  CHECK(kiln::gradcheck([](const TL& t) { return F::avg_pool2d(channels_last(t[0]), {2, 2}); }, {x}));
  CHECK(kiln::gradcheck([](const TL& t) { return F::adaptive_avg_pool2d(t[0], {3, 3}); }, {x}));
  CHECK(kiln::gradcheck([](const TL& t) { return F::adaptive_avg_pool2d(t[0].transpose(2, 3), {2, 3}); }, {x}));
}

TEST_CASE("adaptive_avg_pool2d: PyTorch's windows", "[pool]") {
  kiln::manual_seed(13);
  Tensor x = kiln::randn({2, 3, 7, 5}, f64());
  auto xv = values(x);
  for (IntList os : {IntList{3, 2}, IntList{1, 1}, IntList{7, 5}, IntList{4, 4}}) {
    std::vector<double> want;
    for (int64_t nc = 0; nc < 6; ++nc)
      for (int64_t i = 0; i < os[0]; ++i)
        for (int64_t j = 0; j < os[1]; ++j) {
          int64_t hs = i * 7 / os[0], he = ((i + 1) * 7 + os[0] - 1) / os[0];
          int64_t ws = j * 5 / os[1], we = ((j + 1) * 5 + os[1] - 1) / os[1];
          double s = 0;
          for (int64_t h = hs; h < he; ++h)
            for (int64_t w = ws; w < we; ++w) s += xv[(nc * 7 + h) * 5 + w];
          want.push_back(s / double((he - hs) * (we - ws)));
        }
    Tensor y = F::adaptive_avg_pool2d(x, os);
    REQUIRE(y.sizes() == IntList{2, 3, os[0], os[1]});
    pcheck(y, want, 1e-12, "adaptive");
    pcheck(F::adaptive_avg_pool2d(channels_last(x), os), want, 1e-12, "adaptive channels-last");
  }
  // global average pooling equals the mean over H, W
  pcheck(F::adaptive_avg_pool2d(x, {1, 1}), values(x.mean({2, 3})), 1e-12, "global");
}

TEST_CASE("pooling: errors name the op and the shapes", "[pool]") {
  Tensor x = kiln::randn({2, 3, 6, 6});
  REQUIRE_THROWS_AS(F::max_pool2d(x, {7, 7}), kiln::Error);  // kernel larger than input
  REQUIRE_THROWS_WITH(F::max_pool2d(x, {7, 7}), Catch::Contains("max_pool2d") && Catch::Contains("[2, 3, 6, 6]"));
  REQUIRE_THROWS_AS(F::max_pool2d(x, {2, 2}, {0, 1}), kiln::Error);      // stride 0
  REQUIRE_THROWS_AS(F::max_pool2d(x, {2, 2}, {}, {2, 2}), kiln::Error);  // padding > k/2
  REQUIRE_THROWS_AS(F::max_pool2d(x, {0, 2}), kiln::Error);
  REQUIRE_THROWS_AS(F::max_pool2d(x, {2, 2, 2}), kiln::Error);
  REQUIRE_THROWS_AS(F::max_pool2d(kiln::randn({6, 6}), {2, 2}), kiln::Error);  // rank
  REQUIRE_THROWS_AS(F::avg_pool2d(x, {2, 2}, {-1, 1}), kiln::Error);
  REQUIRE_THROWS_AS(F::avg_pool2d(x, {3, 3}, {}, {2, 0}), kiln::Error);
  REQUIRE_THROWS_AS(F::adaptive_avg_pool2d(x, {0, 2}), kiln::Error);
  REQUIRE_THROWS_AS(F::adaptive_avg_pool2d(x, {1, 2, 3}), kiln::Error);
  REQUIRE_THROWS_AS(F::max_pool2d(x.to(DType::I64), 2), kiln::Error);
  Tensor xg = kiln::randn({1, 1, 4, 4}, f64(true));
  Tensor y = F::max_pool2d(xg, 2).sum();
  REQUIRE_THROWS_AS(kiln::autograd::grad({y}, {xg}, {}, false, /*create_graph=*/true), kiln::Error);
}
