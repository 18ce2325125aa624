// The per-element math of the CUDA pooling kernels (kiln/kernels/cuda/pool_math.h) run on the
// CPU, element by element, against the CPU pooling kernels: forward values and argmax indices,
// and the gather-form backward (one input element from the windows covering it) against the
// CPU's scatter. f32/f64 must match bitwise (same summation order); f16 must match the CPU's
// widen-to-f32 path bitwise too. Also the inverse-window ranges against a brute-force scan.
// These tests check the CUDA kernels' math without a GPU; tests/cuda/test_cuda_conv.cpp checks
// the launches.
#include <catch2/catch.hpp>

#include <array>
#include <cstring>
#include <string>
#include <vector>

#include <kiln/kiln.h>
#include "kiln/kernels/cuda/pool_math.h"
#include "kiln/kernels/conv.h"
#include "kiln/kernels/memory_format.h"
#include "kiln/kernels/pool.h"
#include "tests/test_util.h"

namespace {

namespace K = kiln::kernels;
namespace PM = kiln::kernels::pool_math;
using kiln::DType;
using kiln::Tensor;

struct Case {
  int64_t N, C, H, W, kh, kw, sh, sw, ph, pw;
};

K::PoolGeometry geometry(const Case& c) {
  K::PoolGeometry g;
  g.N = c.N, g.C = c.C, g.H = c.H, g.W = c.W;
  g.kh = c.kh, g.kw = c.kw, g.sh = c.sh, g.sw = c.sw, g.ph = c.ph, g.pw = c.pw;
  g.set_output_size();
  return g;
}

const std::vector<Case> kCases = {
    {2, 3, 8, 8, 2, 2, 2, 2, 0, 0},  // the CNN's 2x2 pool
    {2, 3, 7, 9, 3, 3, 2, 2, 1, 1},  // ResNet's stem pool, odd sizes
    {1, 4, 7, 5, 3, 2, 1, 1, 1, 1},  // overlapping windows, stride 1
    {2, 2, 9, 7, 2, 3, 3, 4, 1, 0},  // stride larger than the kernel (gaps)
    {1, 1, 1, 1, 1, 1, 1, 1, 0, 0},  // a single element
    {3, 5, 6, 6, 4, 4, 1, 2, 2, 1},
};

// Layouts the kernels must handle: NCHW, channels-last, and a non-contiguous view.
Tensor in_layout(const Tensor& t, int layout) {
  if (layout == 0) return t.contiguous();
  if (layout == 1) return kiln_test::channels_last(t);
  // a strided view: every other column of a twice-as-wide tensor
  Tensor wide = kiln::empty({t.size(0), t.size(1), t.size(2), 2 * t.size(3)}, t.options());
  Tensor v = wide.slice(3, 0, 2 * t.size(3), 2);
  v.copy_(t);
  return v;
}

template <class T> std::vector<T> raw(const Tensor& t) {  // logical row-major order
  Tensor c = t.contiguous();
  std::vector<T> v(static_cast<size_t>(c.numel()));
  if (!v.empty()) std::memcpy(v.data(), c.data_ptr(), v.size() * sizeof(T));
  return v;
}

// Runs f(n, c, h, w) over [N, C, H, W] into a new contiguous tensor of dtype T.
template <class T, class F> Tensor per_element(int64_t N, int64_t C, int64_t H, int64_t W, DType dt, F f) {
  Tensor out = kiln::empty({N, C, H, W}, dt);
  T* p = static_cast<T*>(out.data_ptr());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t w = 0; w < W; ++w) *p++ = static_cast<T>(f(n, c, h, w));
  return out;
}

template <class T> void require_bitwise(const Tensor& got, const Tensor& want, const std::string& what) {
  INFO(what);
  REQUIRE(got.sizes() == want.sizes());
  auto a = raw<T>(got), b = raw<T>(want);
  REQUIRE(std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

template <class T> void check_case(const Case& cs, int layout, DType dt) {
  const K::PoolGeometry g = geometry(cs);
  const std::string what = "case " + std::to_string(cs.H) + "x" + std::to_string(cs.W) + " k" + std::to_string(cs.kh) +
                           "x" + std::to_string(cs.kw) + " s" + std::to_string(cs.sh) + " p" + std::to_string(cs.ph) +
                           " layout " + std::to_string(layout) + " " + kiln::dtype_name(dt);
  Tensor x = in_layout(kiln::randn({g.N, g.C, g.H, g.W}).to(dt), layout);
  Tensor gy = in_layout(kiln::randn({g.N, g.C, g.OH, g.OW}).to(dt), layout);
  const auto X = PM::view4<const T>(x);
  const auto GY = PM::view4<const T>(gy);

  // max: values and indices
  Tensor out = kiln::empty({g.N, g.C, g.OH, g.OW}, dt);
  Tensor idx = kiln::empty({g.N, g.C, g.OH, g.OW}, DType::I32);
  K::max_pool2d_forward(out, idx, x, g);
  Tensor m_out = per_element<T>(g.N, g.C, g.OH, g.OW, dt, [&](int64_t n, int64_t c, int64_t oh, int64_t ow) {
    kiln::opmath_t<T> best;
    int32_t bi;
    PM::max_fwd_at<T>(X, g, n, c, oh, ow, best, bi);
    return best;
  });
  Tensor m_idx =
      per_element<int32_t>(g.N, g.C, g.OH, g.OW, DType::I32, [&](int64_t n, int64_t c, int64_t oh, int64_t ow) {
        kiln::opmath_t<T> best;
        int32_t bi;
        PM::max_fwd_at<T>(X, g, n, c, oh, ow, best, bi);
        return bi;
      });
  require_bitwise<T>(m_out, out, what + ": max forward");
  require_bitwise<int32_t>(m_idx, idx, what + ": max indices");

  Tensor gx = kiln::empty({g.N, g.C, g.H, g.W}, dt);
  K::max_pool2d_backward(gx, gy, idx, g);
  const auto I = PM::view4<const int32_t>(idx);
  Tensor m_gx = per_element<T>(g.N, g.C, g.H, g.W, dt, [&](int64_t n, int64_t c, int64_t h, int64_t w) {
    return PM::max_bwd_at<T>(GY, I, g, n, c, h, w);
  });
  require_bitwise<T>(m_gx, gx, what + ": max backward");

  // average, both divisor rules
  for (bool pad : {true, false}) {
    const std::string w2 = what + (pad ? " count_include_pad" : " exclude pad");
    K::avg_pool2d_forward(out, x, g, pad);
    Tensor a_out = per_element<T>(g.N, g.C, g.OH, g.OW, dt, [&](int64_t n, int64_t c, int64_t oh, int64_t ow) {
      return PM::avg_fwd_at<T>(X, g, pad, n, c, oh, ow);
    });
    require_bitwise<T>(a_out, out, w2 + ": avg forward");
    K::avg_pool2d_backward(gx, gy, g, pad);
    Tensor a_gx = per_element<T>(g.N, g.C, g.H, g.W, dt, [&](int64_t n, int64_t c, int64_t h, int64_t w) {
      return PM::avg_bwd_at<T>(GY, g, pad, n, c, h, w);
    });
    require_bitwise<T>(a_gx, gx, w2 + ": avg backward");
  }
}

}  // namespace

TEST_CASE("pool math: CUDA per-element bodies match the CPU kernels bitwise", "[pool][cuda-math]") {
  kiln::manual_seed(71);
  for (const Case& c : kCases)
    for (int layout : {0, 1, 2}) {
      check_case<float>(c, layout, DType::F32);
      check_case<double>(c, layout, DType::F64);
    }
}

TEST_CASE("pool math: adaptive average matches the CPU kernel bitwise", "[pool][cuda-math]") {
  kiln::manual_seed(72);
  // output sizes that divide the input, do not, equal it, and exceed it (overlapping windows)
  for (auto [H, W, OH, OW] :
       std::vector<std::array<int64_t, 4>>{{8, 8, 1, 1}, {7, 9, 3, 4}, {5, 5, 5, 5}, {5, 3, 7, 4}, {13, 11, 6, 5}}) {
    K::PoolGeometry g;
    g.N = 2;
    g.C = 3;
    g.H = H;
    g.W = W;
    g.OH = OH;
    g.OW = OW;
    for (int layout : {0, 1, 2}) {
      INFO("adaptive " << H << "x" << W << " -> " << OH << "x" << OW << " layout " << layout);
      Tensor x = in_layout(kiln::randn({g.N, g.C, H, W}), layout);
      Tensor gy = in_layout(kiln::randn({g.N, g.C, OH, OW}), layout);
      const auto X = PM::view4<const float>(x);
      const auto GY = PM::view4<const float>(gy);
      Tensor out = kiln::empty({g.N, g.C, OH, OW});
      K::adaptive_avg_pool2d_forward(out, x, g);
      Tensor m_out = per_element<float>(
          g.N, g.C, OH, OW, DType::F32,
          [&](int64_t n, int64_t c, int64_t oh, int64_t ow) { return PM::adaptive_fwd_at<float>(X, g, n, c, oh, ow); });
      require_bitwise<float>(m_out, out, "adaptive forward");
      Tensor gx = kiln::empty({g.N, g.C, H, W});
      K::adaptive_avg_pool2d_backward(gx, gy, g);
      Tensor m_gx = per_element<float>(g.N, g.C, H, W, DType::F32, [&](int64_t n, int64_t c, int64_t h, int64_t w) {
        return PM::adaptive_bwd_at<float>(GY, g, n, c, h, w);
      });
      require_bitwise<float>(m_gx, gx, "adaptive backward");
    }
  }
}

TEST_CASE("pool math: f16 bodies equal the CPU's widen-to-f32 path", "[pool][cuda-math]") {
  kiln::manual_seed(73);
  const K::PoolGeometry g = geometry({2, 3, 7, 9, 3, 3, 2, 2, 1, 1});
  Tensor x16 = kiln::randn({g.N, g.C, g.H, g.W}).to(DType::F16);
  Tensor x32 = x16.to(DType::F32);
  const auto X = PM::view4<const kiln::Half>(x16);
  Tensor out = kiln::empty({g.N, g.C, g.OH, g.OW});
  Tensor idx = kiln::empty({g.N, g.C, g.OH, g.OW}, DType::I32);
  K::max_pool2d_forward(out, idx, x32, g);
  Tensor m_out =
      per_element<kiln::Half>(g.N, g.C, g.OH, g.OW, DType::F16, [&](int64_t n, int64_t c, int64_t oh, int64_t ow) {
        float best;
        int32_t bi;
        PM::max_fwd_at<kiln::Half>(X, g, n, c, oh, ow, best, bi);
        return best;
      });
  require_bitwise<kiln::Half>(m_out, out.to(DType::F16), "f16 max forward");
  K::avg_pool2d_forward(out, x32, g, true);
  Tensor a_out =
      per_element<kiln::Half>(g.N, g.C, g.OH, g.OW, DType::F16, [&](int64_t n, int64_t c, int64_t oh, int64_t ow) {
        return PM::avg_fwd_at<kiln::Half>(X, g, true, n, c, oh, ow);
      });
  require_bitwise<kiln::Half>(a_out, out.to(DType::F16), "f16 avg forward");
}

TEST_CASE("pool math: inverse window ranges equal a brute-force scan", "[pool][cuda-math]") {
  for (int64_t n : {1, 2, 7, 16})
    for (int64_t k = 1; k <= 5; ++k)
      for (int64_t s = 1; s <= 4; ++s)
        for (int64_t p = 0; p <= k / 2; ++p) {
          if (n + 2 * p < k) continue;
          const int64_t out_n = (n + 2 * p - k) / s + 1;
          for (int64_t i = 0; i < n; ++i) {
            int64_t lo, hi;
            PM::covering(i, s, p, k, out_n, lo, hi);
            for (int64_t o = 0; o < out_n; ++o) {
              const bool covers = o * s - p <= i && i < o * s - p + k;
              INFO("n " << n << " k " << k << " s " << s << " p " << p << " i " << i << " o " << o);
              REQUIRE(covers == (o >= lo && o <= hi));
            }
          }
        }
  for (int64_t n = 1; n <= 12; ++n)
    for (int64_t out_n = 1; out_n <= 14; ++out_n)
      for (int64_t i = 0; i < n; ++i) {
        int64_t lo, hi;
        PM::ad_covering(i, n, out_n, lo, hi);
        for (int64_t o = 0; o < out_n; ++o) {
          const bool covers = PM::ad_start(o, n, out_n) <= i && i < PM::ad_end(o, n, out_n);
          INFO("adaptive n " << n << " out " << out_n << " i " << i << " o " << o);
          if (covers) REQUIRE((o >= lo && o <= hi));  // the range may be wider: callers test
        }
      }
}
