#pragma once
// What the Winograd tests share (test_cpu_winograd.cpp: the kernels against direct loops in double;
// test_cpu_winograd_ops.cpp: non-finite operands, conv2d with the switch on and off, errors,
// which geometries Winograd takes): the kernels of the CPU level in use, scoped settings, problem
// shapes and the direct references.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <kiln/kiln.h>
#include <kiln/nn/functional.h>
#include "kiln/kernels/conv.h"
#include "kiln/kernels/conv_block.h"
#include "kiln/kernels/cpu/winograd.h"
#include "tests/conv_geometry.h"
#include "tests/test_util.h"
#include <catch2/catch.hpp>

namespace winograd_test {

namespace F = kiln::nn::functional;
using kiln::DType;
using kiln::Tensor;
using kiln::kernels::ConvGeometry;
using kiln::kernels::cpu::winograd_applies;
using kiln::kernels::cpu::winograd_geometry;
using kiln_test::check_close_rel;
using kiln_test::values;

namespace wk = kiln::kernels::cpu;

// The kernels of the CPU level in use for f32 (KILN_CPU_ISA; CTest runs this file at every level
// the host has), each level's vector transforms included; f64 runs the generic transforms, the
// same at every level.
inline wk::WinogradEntries f32_kernels() { return wk::winograd_f32_in_use.on(kiln::Device::cpu()); }

template <class T>
bool winograd_forward(const T* x, const T* w, const T* bias, T* out, const ConvGeometry& g,
                      const std::function<void(int64_t, int64_t)>& samples_done = {}) {
  if constexpr (std::is_same_v<T, float>) return f32_kernels().forward(x, w, bias, out, g, samples_done);
  else return wk::winograd_forward<T>(x, w, bias, out, g, samples_done);
}
template <class T> bool winograd_backward_input(const T* gy, const T* w, T* gx, const ConvGeometry& g) {
  if constexpr (std::is_same_v<T, float>) return f32_kernels().backward_input(gy, w, gx, g);
  else return wk::winograd_backward_input<T>(gy, w, gx, g);
}
template <class T> bool winograd_backward_weight(const T* x, const T* gy, T* dw, const ConvGeometry& g) {
  if constexpr (std::is_same_v<T, float>) return f32_kernels().backward_weight(x, gy, dw, g);
  else return wk::winograd_backward_weight<T>(x, gy, dw, g);
}
template <class T>
bool winograd_backward_both(const T* x, const T* gy, const T* w, T* gx, T* dw, const ConvGeometry& g) {
  if constexpr (std::is_same_v<T, float>) return f32_kernels().backward_both(x, gy, w, gx, dw, g);
  else return wk::winograd_backward_both<T>(x, gy, w, gx, dw, g);
}
template <class T>
bool winograd_backward_generated(const T* x, const T* w, T* gx, T* dw, const ConvGeometry& g,
                                 const std::function<void(int64_t, void*)>& make_dy) {
  if constexpr (std::is_same_v<T, float>) return f32_kernels().backward_generated(x, w, gx, dw, g, make_dy);
  else return wk::winograd_backward_generated<T>(x, w, gx, dw, g, make_dy);
}

// Sets one of kiln's process-wide settings for a scope and restores the previous value.
template <class T, T (*Get)(), void (*Set)(T)> struct ScopedSetting {
  T saved;
  explicit ScopedSetting(T value) : saved(Get()) { Set(value); }
  ~ScopedSetting() { Set(saved); }
  ScopedSetting(const ScopedSetting&) = delete;
  ScopedSetting& operator=(const ScopedSetting&) = delete;
};
// The Winograd switch, the Winograd tile (2 or 4) and the CPU kernels' thread count.
using WinogradSwitch = ScopedSetting<bool, kiln::cpu_conv_winograd, kiln::set_cpu_conv_winograd>;
using Tile = ScopedSetting<int, kiln::cpu_conv_winograd_tile, kiln::set_cpu_conv_winograd_tile>;
using Threads = ScopedSetting<int, kiln::get_num_threads, kiln::set_num_threads>;

// Runs check once with each tile forced: F(2x2, 3x3), then F(4x4, 3x3).
template <class Check> void for_each_tile(Check&& check) {
  for (int m : {2, 4}) {
    INFO("F(" << m << "x" << m << ", 3x3)");
    Tile tile(m);
    check();
  }
}

// A 3x3 stride-1 NCHW convolution of [N, C, H, W] into [N, K, OH, OW] with padding (ph, pw).
inline ConvGeometry geometry(int64_t N, int64_t C, int64_t K, int64_t H, int64_t W, int64_t ph, int64_t pw) {
  return kiln_test::conv_geometry({N, C, H, W}, K, {3, 3}, {ph, pw});
}

inline std::string describe(const ConvGeometry& g) {
  return "N " + std::to_string(g.N) + " C " + std::to_string(g.C) + " K " + std::to_string(g.K) + " H " +
         std::to_string(g.H) + " W " + std::to_string(g.W) + " ph " + std::to_string(g.ph) + " pw " +
         std::to_string(g.pw);
}

// n standard normal values, each exactly representable in f32 (so that the f32 and f64 kernels
// see the same numbers as the double reference).
inline std::vector<double> normals(size_t n, std::mt19937& rng) {
  std::normal_distribution<double> nd;
  std::vector<double> v(n);
  for (double& x : v) x = static_cast<double>(static_cast<float>(nd(rng)));
  return v;
}

template <class T> std::vector<T> cast(const std::vector<double>& v) { return std::vector<T>(v.begin(), v.end()); }

// A reference result in double and, per element, the sum of the magnitudes of its terms
// (|bias| + sum |w x|): the scale of the rounding error any summation order can make.
struct Ref {
  std::vector<double> v, mag;
};

// Calls term(n, k, c, i, j, o, xi): every product of the direct convolution, w[k, c, i, j] times
// x[n, c, ...] at plane offset xi, for the output at plane offset o (taps outside the plane,
// which read the zero padding, are skipped).
template <class Term> void for_each_term(const ConvGeometry& g, Term&& term) {
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t k = 0; k < g.K; ++k)
      for (int64_t c = 0; c < g.C; ++c)
        for (int64_t i = 0; i < 3; ++i)
          for (int64_t j = 0; j < 3; ++j)
            for (int64_t oy = 0; oy < g.OH; ++oy) {
              const int64_t y = oy - g.ph + i;
              if (y < 0 || y >= g.H) continue;
              for (int64_t ox = 0; ox < g.OW; ++ox) {
                const int64_t xx = ox - g.pw + j;
                if (xx >= 0 && xx < g.W) term(n, k, c, i, j, oy * g.OW + ox, y * g.W + xx);
              }
            }
}

// Adds t to r's value and |t| to its magnitude at i.
inline void add_term(Ref& r, size_t i, double t) {
  r.v[i] += t;
  r.mag[i] += std::abs(t);
}

// out[n, k, oy, ox] = bias[k] + sum_{c, i, j} w[k, c, i, j] x[n, c, oy - ph + i, ox - pw + j],
// zero outside the plane.
inline Ref direct_forward(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>* bias,
                          const ConvGeometry& g) {
  const int64_t OHW = g.OH * g.OW;
  Ref r{std::vector<double>(g.N * g.K * OHW), std::vector<double>(g.N * g.K * OHW)};
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t k = 0; k < g.K; ++k)
      for (int64_t o = 0; o < OHW && bias; ++o) add_term(r, (n * g.K + k) * OHW + o, (*bias)[k]);
  for_each_term(g, [&](int64_t n, int64_t k, int64_t c, int64_t i, int64_t j, int64_t o, int64_t xi) {
    add_term(r, (n * g.K + k) * OHW + o, w[((k * g.C + c) * 3 + i) * 3 + j] * x[(n * g.C + c) * g.H * g.W + xi]);
  });
  return r;
}

// The input gradient as the adjoint of direct_forward, by scattering: every output position and
// tap that reads x[n, c, oy - ph + i, ox - pw + j] adds w[k, c, i, j] gy[n, k, oy, ox] to it.
inline Ref direct_backward_input(const std::vector<double>& gy, const std::vector<double>& w, const ConvGeometry& g) {
  const int64_t HW = g.H * g.W;
  Ref r{std::vector<double>(g.N * g.C * HW), std::vector<double>(g.N * g.C * HW)};
  for_each_term(g, [&](int64_t n, int64_t k, int64_t c, int64_t i, int64_t j, int64_t o, int64_t xi) {
    add_term(r, (n * g.C + c) * HW + xi, w[((k * g.C + c) * 3 + i) * 3 + j] * gy[(n * g.K + k) * g.OH * g.OW + o]);
  });
  return r;
}

// The weight gradient: gw[k, c, i, j] = sum_{n, oy, ox} gy[n, k, oy, ox] x[n, c, oy - ph + i, ox - pw + j].
inline Ref direct_backward_weight(const std::vector<double>& x, const std::vector<double>& gy, const ConvGeometry& g) {
  Ref r{std::vector<double>(g.K * g.C * 9), std::vector<double>(g.K * g.C * 9)};
  for_each_term(g, [&](int64_t n, int64_t k, int64_t c, int64_t i, int64_t j, int64_t o, int64_t xi) {
    add_term(r, ((k * g.C + c) * 3 + i) * 3 + j,
             gy[(n * g.K + k) * g.OH * g.OW + o] * x[(n * g.C + c) * g.H * g.W + xi]);
  });
  return r;
}

// The worst |got - ref| / (1 + scale), scale = |ref| or the terms' magnitude sum; a NaN or Inf
// counts as infinitely wrong.
template <class T> double worst_error(const T* got, const Ref& ref, bool by_magnitude) {
  double worst = 0;
  for (size_t i = 0; i < ref.v.size(); ++i) {
    const double scale = 1.0 + (by_magnitude ? ref.mag[i] : std::abs(ref.v[i]));
    const double e = std::abs(static_cast<double>(got[i]) - ref.v[i]) / scale;
    if (!(e <= worst)) worst = std::isfinite(e) ? e : INFINITY;
  }
  return worst;
}

// Tolerances. f64: |error| / (1 + |ref|); observed at most 1e-14 for the forward and the input
// gradient, bound 1e-12. f32: |error| / (1 + the sum of the terms' magnitudes), since the
// transforms' rounding scales with that sum rather than with the result (against 1 + |ref| the
// f32 errors reach 8e-6 where the terms cancel). F(2x2, 3x3): observed at most 6.3e-7 (input
// gradient; forward 4.4e-7, weight gradient 4.5e-7, chunked runs 2.5e-7, conv2d at the op level
// 2.6e-7 with Winograd and with the direct kernel), bound 6e-6, ~10x that. F(4x4, 3x3), whose
// transforms have coefficients up to 8: observed at most 1.5e-5 (the input gradient as the
// "full" convolution of a 321 x 319 plane; forward 8.7e-6, weight gradient 5.7e-6, input
// gradient through the forward's tiles 3.9e-6, conv2d at the op level 2.2e-6), bound 6e-5, ~4x
// that. The weight gradient sums up to 2 x 321 x 321 terms per element, with much
// cancellation: it is measured against the magnitudes in f64 too (observed 5e-16; bound
// kTol64).
constexpr double kTol64 = 1e-12;
constexpr double kTol32 = 6e-6;
constexpr double kTol32F4 = 6e-5;

// The f32 bound for the tile the kernels use now (by default F(4x4, 3x3) on most planes).
inline double tolerance32() { return kiln::cpu_conv_winograd_tile() == 2 ? kTol32 : kTol32F4; }

template <class T> double tolerance() { return sizeof(T) == 8 ? kTol64 : tolerance32(); }
template <class T> bool by_magnitude() { return sizeof(T) == 4; }

struct Shape {
  int64_t N, C, K, H, W, ph, pw;
  bool bias;
};

// Planes of 1 to 13 rows and 1 to 66 columns (odd, even, H != W; W = 37 and 66 make 19 and up
// to 34 tiles per row: more than one 16-tile vector block of the f32 transforms), each with
// every padding (ph, pw) in {0, 1, 2}^2 that leaves an output; batch, channels and bias cycle.
inline std::vector<Shape> small_shapes() {
  const int64_t hw[][2] = {{1, 1}, {1, 4},  {2, 3},  {3, 3},   {4, 2},  {5, 7}, {7, 5},
                           {8, 8}, {13, 4}, {4, 13}, {13, 13}, {3, 37}, {5, 66}};
  const int64_t ck[][2] = {{1, 1}, {3, 5}, {5, 3}, {17, 3}, {3, 17}};
  std::vector<Shape> shapes;
  int i = 0;
  for (const auto& s : hw)
    for (int64_t ph = 0; ph <= 2; ++ph)
      for (int64_t pw = 0; pw <= 2; ++pw) {
        if (s[0] + 2 * ph - 2 <= 0 || s[1] + 2 * pw - 2 <= 0) continue;
        shapes.push_back({i % 2 ? 3 : 1, ck[i % 5][0], ck[i % 5][1], s[0], s[1], ph, pw, i % 3 != 0});
        ++i;
      }
  return shapes;
}

// Runs check(s, g, rng) for each of small_shapes() with its geometry g, an INFO naming it, and one
// generator seeded with seed for all.
template <class Check> void for_each_small_shape(uint32_t seed, Check&& check) {
  std::mt19937 rng(seed);
  for (const Shape& s : small_shapes()) {
    const ConvGeometry g = geometry(s.N, s.C, s.K, s.H, s.W, s.ph, s.pw);
    INFO(describe(g) << " bias " << s.bias);
    check(s, g, rng);
  }
}

// REQUIREs that kernel(out) runs (returns true) into an output of ref's size filled with NaN (so
// every element must be written), then CHECKs the output against ref within tolerance<T>(),
// measured against the terms' magnitudes where by_mag.
template <class T, class Kernel> void check_against(const Ref& ref, bool by_mag, Kernel&& kernel) {
  std::vector<T> out(ref.v.size(), std::numeric_limits<T>::quiet_NaN());
  REQUIRE(kernel(out.data()));
  CHECK(worst_error(out.data(), ref, by_mag) <= tolerance<T>());
}

template <class T> void check_forward_shapes(uint32_t seed) {
  REQUIRE(small_shapes().size() > 90);
  for_each_small_shape(seed, [](const Shape& s, const ConvGeometry& g, std::mt19937& rng) {
    REQUIRE(winograd_geometry(g));
    const auto x = normals(g.N * g.C * g.H * g.W, rng), w = normals(g.K * g.C * 9, rng), b = normals(g.K, rng);
    const auto xt = cast<T>(x), wt = cast<T>(w), bt = cast<T>(b);
    check_against<T>(direct_forward(x, w, s.bias ? &b : nullptr, g), by_magnitude<T>(), [&](T* out) {
      return winograd_forward<T>(xt.data(), wt.data(), s.bias ? bt.data() : nullptr, out, g);
    });
  });
}

template <class T> void check_backward_input_shapes(uint32_t seed) {
  for_each_small_shape(seed, [](const Shape&, const ConvGeometry& g, std::mt19937& rng) {
    const auto gy = normals(g.N * g.K * g.OH * g.OW, rng), w = normals(g.K * g.C * 9, rng);
    const auto gyt = cast<T>(gy), wt = cast<T>(w);
    check_against<T>(direct_backward_input(gy, w, g), by_magnitude<T>(),
                     [&](T* gx) { return winograd_backward_input<T>(gyt.data(), wt.data(), gx, g); });
  });
}

template <class T> void check_backward_weight_shapes(uint32_t seed) {
  for_each_small_shape(seed, [](const Shape&, const ConvGeometry& g, std::mt19937& rng) {
    const auto x = normals(g.N * g.C * g.H * g.W, rng), gy = normals(g.N * g.K * g.OH * g.OW, rng);
    const auto xt = cast<T>(x), gyt = cast<T>(gy);
    check_against<T>(direct_backward_weight(x, gy, g), true,
                     [&](T* gw) { return winograd_backward_weight<T>(xt.data(), gyt.data(), gw, g); });
  });
}

// Both gradients at once, against the direct references: winograd_backward_generated with the
// output gradient handed over one sample at a time (each sample asked for at least once; also
// with only one of the two wanted), or winograd_backward_both with it stored.
enum class BothVia { Generated, Stored };
template <class T> void check_both_gradients_shapes(BothVia via, uint32_t seed) {
  for_each_small_shape(seed, [via](const Shape&, const ConvGeometry& g, std::mt19937& rng) {
    const auto x = normals(g.N * g.C * g.H * g.W, rng), w = normals(g.K * g.C * 9, rng);
    const auto gy = normals(g.N * g.K * g.OH * g.OW, rng);
    const Ref xref = direct_backward_input(gy, w, g), wref = direct_backward_weight(x, gy, g);
    const auto xt = cast<T>(x), wt = cast<T>(w), gyt = cast<T>(gy);
    const int64_t per = g.K * g.OH * g.OW;
    std::vector<int> asked(g.N, 0);
    auto make_dy = [&](int64_t n, void* dy) {
      ++asked[n];
      std::copy_n(gyt.data() + n * per, per, static_cast<T*>(dy));
    };
    std::vector<T> gx(xref.v.size(), std::numeric_limits<T>::quiet_NaN());
    std::vector<T> gw(wref.v.size(), std::numeric_limits<T>::quiet_NaN());
    if (via == BothVia::Stored) {
      REQUIRE(winograd_backward_both<T>(xt.data(), gyt.data(), wt.data(), gx.data(), gw.data(), g));
    } else {
      REQUIRE(winograd_backward_generated<T>(xt.data(), wt.data(), gx.data(), gw.data(), g, make_dy));
    }
    CHECK(worst_error(gx.data(), xref, by_magnitude<T>()) <= tolerance<T>());
    CHECK(worst_error(gw.data(), wref, true) <= tolerance<T>());
    if (via == BothVia::Stored) return;
    CHECK(*std::min_element(asked.begin(), asked.end()) >= 1);
    std::vector<T> gx_only(gx.size()), gw_only(gw.size());
    REQUIRE(winograd_backward_generated<T>(xt.data(), wt.data(), gx_only.data(), nullptr, g, make_dy));
    REQUIRE(winograd_backward_generated<T>(xt.data(), wt.data(), nullptr, gw_only.data(), g, make_dy));
    CHECK(gx_only == gx);
    CHECK(gw_only == gw);
  });
}

// The sections "f64" and "f32", each running check(T{}, seed) under every tile (for_each_tile)
// with T double and seed seed64, or T float and seed seed32.
template <class Check> void f64_and_f32_sections(uint32_t seed64, uint32_t seed32, Check&& check) {
  SECTION("f64") {
    for_each_tile([&] { check(double{}, seed64); });
  }
  SECTION("f32") {
    for_each_tile([&] { check(float{}, seed32); });
  }
}

// Bitwise equality of two tensors of one dtype and shape (NaNs compare by their bits).
inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype()) return false;
  const Tensor ac = a.detach().contiguous(), bc = b.detach().contiguous();
  REQUIRE(ac.dtype() == DType::F32);
  return std::memcmp(ac.data_ptr<float>(), bc.data_ptr<float>(), ac.numel() * sizeof(float)) == 0;
}

// CHECKs a tensor against a reference and the sums of its terms' magnitudes (both computed in
// f64) within the f32 bound of the tile in use, as worst_error measures it.
inline void check_scaled(const Tensor& got, const Tensor& want, const Tensor& mag, const char* what) {
  INFO(what);
  REQUIRE(got.sizes() == want.sizes());
  const std::vector<double> g = values(got);
  const Ref ref{values(want), values(mag)};
  CHECK(worst_error(g.data(), ref, true) <= tolerance32());
}

inline bool any_of_values(const Tensor& t, bool (*pred)(double)) {
  for (double v : values(t))
    if (pred(v)) return true;
  return false;
}

}  // namespace winograd_test
