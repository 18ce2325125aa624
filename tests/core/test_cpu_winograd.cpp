// Winograd F(2x2, 3x3) and F(4x4, 3x3) on the CPU (kiln/kernels/cpu/winograd.h), every check under
// each tile (and the gathered transforms of narrow planes with them): the forward, the input gradient
// and the weight gradient in f64 and f32 against direct loops in double written here, over odd
// and even planes (1 to 13 rows, up to 68 columns: several 16-tile vector blocks), padding 0-2 on
// each side, batches of 1 and 3, 1-17 channels, with and without bias; both ways of cutting the
// work into chunks (rows of tiles of one sample, several whole samples) on one and two threads,
// with samples_done covering each sample once after its planes are final (and the BatchNorm
// statistics taken there by conv2d_forward_batch_stats); Inf / NaN / overflowing operands
// refused; and, at the op level, conv2d with the switch (kiln::set_cpu_conv_winograd) on equal
// to it off: within f32 rounding for finite inputs (forward, input and weight gradients,
// non-contiguous inputs), bitwise where Inf or NaN make Winograd fall back to the direct kernel;
// which geometries and dtypes winograd_applies takes.
#include <catch2/catch.hpp>

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
#include "tests/test_util.h"

namespace {

namespace F = kiln::nn::functional;
using kiln::kernels::ConvGeometry;
using kiln::kernels::cpu::winograd_applies;
using kiln::kernels::cpu::winograd_geometry;
using kiln_test::check_close_rel;
using kiln_test::values;
using kiln::DType;
using kiln::Tensor;

namespace wk = kiln::kernels::cpu;

// The kernels of the CPU level in use for f32 (KILN_CPU_ISA; CTest runs this file at every level
// the host has), each level's vector transforms included; f64 runs the generic transforms, the
// same at every level.
wk::WinogradEntries f32_kernels() { return wk::winograd_f32_in_use.on(kiln::Device::cpu()); }

template <class T>
bool winograd_forward(const T* x, const T* w, const T* bias, T* out, const ConvGeometry& g,
                      const std::function<void(int64_t, int64_t)>& samples_done = {}) {
  if constexpr (std::is_same_v<T, float>) return f32_kernels().forward(x, w, bias, out, g, samples_done);
  else return wk::winograd_forward<T>(x, w, bias, out, g, samples_done);
}
template <class T>
bool winograd_backward_input(const T* gy, const T* w, T* gx, const ConvGeometry& g) {
  if constexpr (std::is_same_v<T, float>) return f32_kernels().backward_input(gy, w, gx, g);
  else return wk::winograd_backward_input<T>(gy, w, gx, g);
}
template <class T>
bool winograd_backward_weight(const T* x, const T* gy, T* dw, const ConvGeometry& g) {
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
template <class T, T (*Get)(), void (*Set)(T)>
struct ScopedSetting {
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
template <class Check>
void for_each_tile(Check&& check) {
  for (int m : {2, 4}) {
    INFO("F(" << m << "x" << m << ", 3x3)");
    Tile tile(m);
    check();
  }
}

// A 3x3 stride-1 NCHW convolution of [N, C, H, W] into [N, K, OH, OW] with padding (ph, pw).
ConvGeometry geometry(int64_t N, int64_t C, int64_t K, int64_t H, int64_t W, int64_t ph, int64_t pw) {
  ConvGeometry g;
  g.N = N, g.C = C, g.H = H, g.W = W, g.K = K;
  g.kh = 3, g.kw = 3;
  g.ph = ph, g.pw = pw;
  g.OH = H + 2 * ph - 2, g.OW = W + 2 * pw - 2;
  return g;
}

std::string describe(const ConvGeometry& g) {
  return "N " + std::to_string(g.N) + " C " + std::to_string(g.C) + " K " + std::to_string(g.K) + " H " +
         std::to_string(g.H) + " W " + std::to_string(g.W) + " ph " + std::to_string(g.ph) + " pw " +
         std::to_string(g.pw);
}

// n standard normal values, each exactly representable in f32 (so that the f32 and f64 kernels
// see the same numbers as the double reference).
std::vector<double> normals(size_t n, std::mt19937& rng) {
  std::normal_distribution<double> nd;
  std::vector<double> v(n);
  for (double& x : v) x = static_cast<double>(static_cast<float>(nd(rng)));
  return v;
}

template <class T>
std::vector<T> cast(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

// A reference result in double and, per element, the sum of the magnitudes of its terms
// (|bias| + sum |w x|): the scale of the rounding error any summation order can make.
struct Ref {
  std::vector<double> v, mag;
};

// Calls term(n, k, c, i, j, o, xi): every product of the direct convolution, w[k, c, i, j] times
// x[n, c, ...] at plane offset xi, for the output at plane offset o (taps outside the plane,
// which read the zero padding, are skipped).
template <class Term>
void for_each_term(const ConvGeometry& g, Term&& term) {
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
Ref direct_forward(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>* bias,
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
Ref direct_backward_input(const std::vector<double>& gy, const std::vector<double>& w, const ConvGeometry& g) {
  const int64_t HW = g.H * g.W;
  Ref r{std::vector<double>(g.N * g.C * HW), std::vector<double>(g.N * g.C * HW)};
  for_each_term(g, [&](int64_t n, int64_t k, int64_t c, int64_t i, int64_t j, int64_t o, int64_t xi) {
    add_term(r, (n * g.C + c) * HW + xi, w[((k * g.C + c) * 3 + i) * 3 + j] * gy[(n * g.K + k) * g.OH * g.OW + o]);
  });
  return r;
}

// The weight gradient: gw[k, c, i, j] = sum_{n, oy, ox} gy[n, k, oy, ox] x[n, c, oy - ph + i, ox - pw + j].
Ref direct_backward_weight(const std::vector<double>& x, const std::vector<double>& gy, const ConvGeometry& g) {
  Ref r{std::vector<double>(g.K * g.C * 9), std::vector<double>(g.K * g.C * 9)};
  for_each_term(g, [&](int64_t n, int64_t k, int64_t c, int64_t i, int64_t j, int64_t o, int64_t xi) {
    add_term(r, ((k * g.C + c) * 3 + i) * 3 + j, gy[(n * g.K + k) * g.OH * g.OW + o] * x[(n * g.C + c) * g.H * g.W + xi]);
  });
  return r;
}

// The worst |got - ref| / (1 + scale), scale = |ref| or the terms' magnitude sum; a NaN or Inf
// counts as infinitely wrong.
template <class T>
double worst_error(const T* got, const Ref& ref, bool by_magnitude) {
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
double tolerance32() { return kiln::cpu_conv_winograd_tile() == 2 ? kTol32 : kTol32F4; }

template <class T>
double tolerance() {
  return sizeof(T) == 8 ? kTol64 : tolerance32();
}
template <class T>
bool by_magnitude() {
  return sizeof(T) == 4;
}

struct Shape {
  int64_t N, C, K, H, W, ph, pw;
  bool bias;
};

// Planes of 1 to 13 rows and 1 to 66 columns (odd, even, H != W; W = 37 and 66 make 19 and up
// to 34 tiles per row: more than one 16-tile vector block of the f32 transforms), each with
// every padding (ph, pw) in {0, 1, 2}^2 that leaves an output; batch, channels and bias cycle.
std::vector<Shape> small_shapes() {
  const int64_t hw[][2] = {{1, 1}, {1, 4}, {2, 3}, {3, 3}, {4, 2}, {5, 7}, {7, 5},
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

template <class T>
void check_forward_shapes(uint32_t seed) {
  std::mt19937 rng(seed);
  const auto shapes = small_shapes();
  REQUIRE(shapes.size() > 90);
  for (const Shape& s : shapes) {
    const ConvGeometry g = geometry(s.N, s.C, s.K, s.H, s.W, s.ph, s.pw);
    INFO(describe(g) << " bias " << s.bias);
    REQUIRE(winograd_geometry(g));
    const auto x = normals(g.N * g.C * g.H * g.W, rng), w = normals(g.K * g.C * 9, rng), b = normals(g.K, rng);
    const Ref ref = direct_forward(x, w, s.bias ? &b : nullptr, g);
    const auto xt = cast<T>(x), wt = cast<T>(w), bt = cast<T>(b);
    std::vector<T> out(ref.v.size(), std::numeric_limits<T>::quiet_NaN());  // every element must be written
    REQUIRE(winograd_forward<T>(xt.data(), wt.data(), s.bias ? bt.data() : nullptr, out.data(), g));
    CHECK(worst_error(out.data(), ref, by_magnitude<T>()) <= tolerance<T>());
  }
}

template <class T>
void check_backward_input_shapes(uint32_t seed) {
  std::mt19937 rng(seed);
  for (const Shape& s : small_shapes()) {
    const ConvGeometry g = geometry(s.N, s.C, s.K, s.H, s.W, s.ph, s.pw);
    INFO(describe(g));
    const auto gy = normals(g.N * g.K * g.OH * g.OW, rng), w = normals(g.K * g.C * 9, rng);
    const Ref ref = direct_backward_input(gy, w, g);
    const auto gyt = cast<T>(gy), wt = cast<T>(w);
    std::vector<T> gx(ref.v.size(), std::numeric_limits<T>::quiet_NaN());
    REQUIRE(winograd_backward_input<T>(gyt.data(), wt.data(), gx.data(), g));
    CHECK(worst_error(gx.data(), ref, by_magnitude<T>()) <= tolerance<T>());
  }
}

template <class T>
void check_backward_weight_shapes(uint32_t seed) {
  std::mt19937 rng(seed);
  for (const Shape& s : small_shapes()) {
    const ConvGeometry g = geometry(s.N, s.C, s.K, s.H, s.W, s.ph, s.pw);
    INFO(describe(g));
    const auto x = normals(g.N * g.C * g.H * g.W, rng), gy = normals(g.N * g.K * g.OH * g.OW, rng);
    const Ref ref = direct_backward_weight(x, gy, g);
    const auto xt = cast<T>(x), gyt = cast<T>(gy);
    std::vector<T> gw(ref.v.size(), std::numeric_limits<T>::quiet_NaN());
    REQUIRE(winograd_backward_weight<T>(xt.data(), gyt.data(), gw.data(), g));
    CHECK(worst_error(gw.data(), ref, true) <= tolerance<T>());
  }
}

// Both gradients at once, against the direct references: winograd_backward_generated with the
// output gradient handed over one sample at a time (each sample asked for at least once; also
// with only one of the two wanted), or winograd_backward_both with it stored.
enum class BothVia { Generated, Stored };
template <class T>
void check_both_gradients_shapes(BothVia via, uint32_t seed) {
  std::mt19937 rng(seed);
  for (const Shape& s : small_shapes()) {
    const ConvGeometry g = geometry(s.N, s.C, s.K, s.H, s.W, s.ph, s.pw);
    INFO(describe(g));
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
    if (via == BothVia::Stored) continue;
    CHECK(*std::min_element(asked.begin(), asked.end()) >= 1);
    std::vector<T> gx_only(gx.size()), gw_only(gw.size());
    REQUIRE(winograd_backward_generated<T>(xt.data(), wt.data(), gx_only.data(), nullptr, g, make_dy));
    REQUIRE(winograd_backward_generated<T>(xt.data(), wt.data(), nullptr, gw_only.data(), g, make_dy));
    CHECK(gx_only == gx);
    CHECK(gw_only == gw);
  }
}

// Bitwise equality of two tensors of one dtype and shape (NaNs compare by their bits).
bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype()) return false;
  const Tensor ac = a.detach().contiguous(), bc = b.detach().contiguous();
  REQUIRE(ac.dtype() == DType::F32);
  return std::memcmp(ac.data_ptr<float>(), bc.data_ptr<float>(), ac.numel() * sizeof(float)) == 0;
}

// CHECKs a tensor against a reference and the sums of its terms' magnitudes (both computed in
// f64) within the f32 bound of the tile in use, as worst_error measures it.
void check_scaled(const Tensor& got, const Tensor& want, const Tensor& mag, const char* what) {
  INFO(what);
  REQUIRE(got.sizes() == want.sizes());
  const std::vector<double> g = values(got);
  const Ref ref{values(want), values(mag)};
  CHECK(worst_error(g.data(), ref, true) <= tolerance32());
}

bool any_of_values(const Tensor& t, bool (*pred)(double)) {
  for (double v : values(t))
    if (pred(v)) return true;
  return false;
}

}  // namespace

TEST_CASE("winograd_forward f64 equals a direct convolution in double", "[winograd]") {
  for_each_tile([] { check_forward_shapes<double>(11); });
}

TEST_CASE("winograd_forward f32 equals a direct convolution in double within f32 rounding", "[winograd]") {
  for_each_tile([] { check_forward_shapes<float>(12); });
}

TEST_CASE("winograd_backward_input f64 and f32 equal the adjoint of the direct convolution", "[winograd]") {
  SECTION("f64") { for_each_tile([] { check_backward_input_shapes<double>(13); }); }
  SECTION("f32") { for_each_tile([] { check_backward_input_shapes<float>(14); }); }
}

TEST_CASE("winograd_backward_weight f64 and f32 equal the direct weight gradient", "[winograd]") {
  SECTION("f64") { for_each_tile([] { check_backward_weight_shapes<double>(16); }); }
  SECTION("f32") { for_each_tile([] { check_backward_weight_shapes<float>(17); }); }
}

TEST_CASE("winograd_backward_both f64 and f32 equal the direct input and weight gradients", "[winograd]") {
  SECTION("f64") { for_each_tile([] { check_both_gradients_shapes<double>(BothVia::Stored, 24); }); }
  SECTION("f32") { for_each_tile([] { check_both_gradients_shapes<float>(BothVia::Stored, 25); }); }
}

TEST_CASE("winograd_backward_both declines samples larger than a chunk, writing nothing", "[winograd]") {
  const ConvGeometry g = geometry(1, 3, 2, 321, 319, 1, 2);  // 161 x 160 tiles per sample
  std::vector<float> x(g.N * g.C * g.H * g.W, 1.0f), w(g.K * g.C * 9, 1.0f), gy(g.N * g.K * g.OH * g.OW, 1.0f);
  std::vector<float> gx(x.size(), -7.0f), gw(w.size(), -7.0f);
  CHECK_FALSE(winograd_backward_both<float>(x.data(), gy.data(), w.data(), gx.data(), gw.data(), g));
  CHECK(std::all_of(gx.begin(), gx.end(), [](float v) { return v == -7.0f; }));
  CHECK(std::all_of(gw.begin(), gw.end(), [](float v) { return v == -7.0f; }));
}

TEST_CASE("winograd_backward_generated f64 and f32: the output gradient made per sample", "[winograd]") {
  SECTION("f64") { for_each_tile([] { check_both_gradients_shapes<double>(BothVia::Generated, 18); }); }
  SECTION("f32") { for_each_tile([] { check_both_gradients_shapes<float>(BothVia::Generated, 19); }); }
}

TEST_CASE("winograd_backward_input is the adjoint of winograd_forward: <gy, conv(x)> = <conv^T(gy), x>",
          "[winograd]") {
  // Independent of the reference loops above: the identity ties the two kernels together.
  std::mt19937 rng(15);
  for (const Shape& s : {Shape{2, 5, 7, 7, 6, 1, 2, false}, Shape{1, 17, 3, 13, 4, 2, 0, false},
                         Shape{3, 3, 4, 4, 37, 0, 1, false}}) {
    const ConvGeometry g = geometry(s.N, s.C, s.K, s.H, s.W, s.ph, s.pw);
    INFO(describe(g));
    const auto x = normals(g.N * g.C * g.H * g.W, rng), w = normals(g.K * g.C * 9, rng);
    const auto gy = normals(g.N * g.K * g.OH * g.OW, rng);
    std::vector<double> y(gy.size()), gx(x.size());
    REQUIRE(winograd_forward<double>(x.data(), w.data(), nullptr, y.data(), g));
    REQUIRE(winograd_backward_input<double>(gy.data(), w.data(), gx.data(), g));
    double lhs = 0, rhs = 0, mag = 0;
    for (size_t i = 0; i < y.size(); ++i) lhs += gy[i] * y[i], mag += std::abs(gy[i] * y[i]);
    for (size_t i = 0; i < x.size(); ++i) rhs += gx[i] * x[i], mag += std::abs(gx[i] * x[i]);
    CHECK(std::abs(lhs - rhs) <= 1e-12 * mag);
  }
}

TEST_CASE("winograd_backward_input through both routes: the forward's tiles (whole samples per chunk) and the "
          "full convolution (samples larger than a chunk)",
          "[winograd]") {
  // The adjoint route needs whole samples in a chunk (~2^22 / (xi * 4 * (C + K)) tiles, xi = 16
  // or 36 transformed positions); a 321 x 319 output with C = 3, K = 2 has 161 x 160 tiles of
  // 2x2 per sample, more than F(2x2, 3x3)'s budget of ~13000, or 81 x 80 of 4x4, more than
  // F(4x4, 3x3)'s ~5800, so it runs as the "full" convolution of the output gradient; the 9 x 7
  // planes run through the forward's tiles. Both tiles, on one and two threads, in f64 and f32.
  const ConvGeometry big = geometry(2, 3, 2, 321, 319, 1, 2), small = geometry(13, 16, 16, 9, 7, 1, 2);
  std::mt19937 rng(23);
  for (const ConvGeometry& g : {big, small}) {
    INFO(describe(g));
    const auto gy = normals(g.N * g.K * g.OH * g.OW, rng), w = normals(g.K * g.C * 9, rng);
    const Ref ref = direct_backward_input(gy, w, g);
    for_each_tile([&] {
      for (int threads : {1, 2}) {
        INFO(threads << " thread(s)");
        Threads th(threads);
        std::vector<double> gx64(ref.v.size(), std::numeric_limits<double>::quiet_NaN());
        REQUIRE(winograd_backward_input<double>(gy.data(), w.data(), gx64.data(), g));
        CHECK(worst_error(gx64.data(), ref, by_magnitude<double>()) <= tolerance<double>());
        const auto gyt = cast<float>(gy), wt = cast<float>(w);
        std::vector<float> gx32(ref.v.size(), std::numeric_limits<float>::quiet_NaN());
        REQUIRE(winograd_backward_input<float>(gyt.data(), wt.data(), gx32.data(), g));
        CHECK(worst_error(gx32.data(), ref, by_magnitude<float>()) <= tolerance<float>());
      }
    });
  }
}

TEST_CASE("winograd_forward: rows-of-tiles and multi-sample chunks on two threads, samples_done once per sample "
          "after its planes are final",
          "[winograd]") {
  struct ChunkCase {
    const char* what;
    ConvGeometry g;
    bool rows;  // cut into rows of tiles (else several whole samples per chunk)
  };
  // make_chunks (winograd.cpp) gives a chunk about 2^22 / (xi * 4 * (C + K)) tiles, at least 32,
  // xi = 16 for F(2x2, 3x3) and 36 for F(4x4, 3x3) (each case below keeps its way of cutting for
  // budgets up to ~1.1x that, or any smaller one; the checks at the first samples_done call
  // notice if it changes). For F(2x2, 3x3), then F(4x4, 3x3):
  //  - C = 3, K = 2: a budget of ~13000 (~5800) tiles against 161 x 160 = 25760 (81 x 80 = 6480)
  //    tiles per sample (a 321 x 319 output): each sample is cut into rows of tiles, and
  //    samples_done comes for each sample after all chunks. Cheap to check in double: few
  //    channels; odd plane, ph != pw, the last tile row and column overhang the plane.
  //  - C = K = 4 on a tall plane narrower than a vector (5000 x 14): ~8000 (~3600) tiles per chunk
  //    against 2500 x 7 = 17500 (1250 x 4 = 5000) per sample, rows of tiles again, with a 32-float
  //    (64-float) store of a tile row reaching rows beyond it (into the next chunk's rows,
  //    another thread's).
  //  - C = K = 16: a budget of ~2000 (~900) tiles against 5 x 5 = 25 (3 x 3 = 9): with 2 threads,
  //    min(budget / tiles, 13 / (2 * 2)) = 3 whole samples per chunk: [0, 3), ..., [12, 13).
  // Which way a case was cut shows at the first samples_done call on one thread: with rows of
  // tiles every sample's planes are final by then, with whole samples the later ones are not.
  const std::vector<ChunkCase> cases = {
      {"rows of tiles", geometry(2, 3, 2, 321, 319, 1, 2), true},
      {"rows of tiles, narrow plane", geometry(2, 4, 4, 5000, 14, 1, 1), true},
      {"several whole samples per chunk", geometry(13, 16, 16, 9, 7, 1, 2), false},
  };
  std::mt19937 rng(21);
  for_each_tile([&] {
    for (const ChunkCase& cc : cases) {
      const ConvGeometry& g = cc.g;
      INFO(cc.what << ": " << describe(g));
      const auto x = normals(g.N * g.C * g.H * g.W, rng), w = normals(g.K * g.C * 9, rng), b = normals(g.K, rng);
      const Ref ref = direct_forward(x, w, &b, g);
      const size_t plane = static_cast<size_t>(g.K * g.OH * g.OW);  // one sample's output
      auto run = [&](auto tag, int threads) {
        using T = decltype(tag);
        INFO((sizeof(T) == 8 ? "f64" : "f32") << ", " << threads << " thread(s)");
        Threads th(threads);
        const auto xt = cast<T>(x), wt = cast<T>(w), bt = cast<T>(b);
        std::vector<T> out(ref.v.size(), std::numeric_limits<T>::quiet_NaN());
        std::vector<T> snapshot(ref.v.size(), std::numeric_limits<T>::quiet_NaN());
        std::unique_ptr<std::atomic<int>[]> calls(new std::atomic<int>[g.N]);
        for (int64_t n = 0; n < g.N; ++n) calls[n].store(0);
        std::atomic<int64_t> widest{0};
        std::atomic<bool> bad_range{false};
        std::atomic<int> all_final_at_first_call{-1};  // -1: no call yet
        const bool ok = winograd_forward<T>(xt.data(), wt.data(), bt.data(), out.data(), g,
                                            [&](int64_t n0, int64_t n1) {
                                              if (n0 < 0 || n1 > g.N || n0 >= n1) {
                                                bad_range = true;
                                                return;
                                              }
                                              int first = -1;
                                              // (on one thread only: elsewhere other chunks are being written)
                                              if (threads == 1 && all_final_at_first_call.compare_exchange_strong(first, 0)) {
                                                const bool all = std::none_of(out.begin(), out.end(),
                                                                              [](T v) { return std::isnan(v); });
                                                all_final_at_first_call = all ? 1 : 0;
                                              }
                                              int64_t cur = widest.load();
                                              while (n1 - n0 > cur && !widest.compare_exchange_weak(cur, n1 - n0)) {
                                              }
                                              for (int64_t n = n0; n < n1; ++n) {
                                                calls[n].fetch_add(1);
                                                // what the caller would read now (e.g. BatchNorm statistics)
                                                std::copy_n(out.data() + n * plane, plane, snapshot.data() + n * plane);
                                              }
                                            });
        REQUIRE(ok);
        CHECK_FALSE(bad_range.load());
        for (int64_t n = 0; n < g.N; ++n) {
          INFO("sample " << n);
          CHECK(calls[n].load() == 1);
        }
        if (!cc.rows && threads > 1) CHECK(widest.load() > 1);
        if (cc.rows) CHECK(widest.load() == 1);
        if (threads == 1) CHECK(all_final_at_first_call.load() == (cc.rows ? 1 : 0));
        CHECK(worst_error(out.data(), ref, by_magnitude<T>()) <= tolerance<T>());
        CHECK(worst_error(snapshot.data(), ref, by_magnitude<T>()) <= tolerance<T>());
      };
      run(float{}, 2);
      run(double{}, 2);
      run(float{}, 1);

      // the weight gradient over the same chunks: per-thread partial sums added in a fixed order,
      // so two runs on two threads agree bitwise
      const auto gy = normals(g.N * g.K * g.OH * g.OW, rng);
      const Ref wref = direct_backward_weight(x, gy, g);
      auto weight_grad = [&](auto tag, int threads) {
        using T = decltype(tag);
        Threads th(threads);
        const auto xt = cast<T>(x), gyt = cast<T>(gy);
        std::vector<T> gw(wref.v.size(), std::numeric_limits<T>::quiet_NaN());
        REQUIRE(winograd_backward_weight<T>(xt.data(), gyt.data(), gw.data(), g));
        CHECK(worst_error(gw.data(), wref, true) <= tolerance<T>());
        return gw;
      };
      {
        INFO("weight gradient");
        const auto a = weight_grad(float{}, 2), b = weight_grad(float{}, 2);
        CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
        weight_grad(double{}, 2);
        weight_grad(float{}, 1);
      }
    }
  });
}

TEST_CASE("conv2d_forward_batch_stats takes its statistics from final Winograd planes in both chunkings",
          "[winograd]") {
  // The statistics come from samples_done (kernels/cpu/conv.cpp): a sample reported before its
  // planes are final would give statistics that do not match the output.
  Threads th(2);
  WinogradSwitch on(true);
  kiln::manual_seed(22);
  // rows of tiles (64 x 65 = 4160 tiles per sample against a budget of ~2000 at 16 + 16 channels;
  // and 500 x 7 = 3500 on a plane narrower than a vector) and several whole samples per chunk
  // (see the chunking test)
  for (const ConvGeometry& g : {geometry(2, 16, 16, 127, 129, 1, 1), geometry(2, 16, 16, 1000, 14, 1, 1),
                                geometry(13, 16, 16, 9, 7, 1, 2)}) {
    INFO(describe(g));
    REQUIRE(winograd_applies(g, DType::F32));
    Tensor x = kiln::randn({g.N, g.C, g.H, g.W}) + 0.5, w = kiln::randn({g.K, g.C, 3, 3}), b = kiln::randn({g.K});
    Tensor out = kiln::empty({g.N, g.K, g.OH, g.OW});
    Tensor mean = kiln::empty({g.K}), var = kiln::empty({g.K});
    kiln::kernels::conv2d_forward_batch_stats(out, mean, var, x, w, b, g);
    F::Conv2dParams p;
    p.padding = {g.ph, g.pw};
    const Tensor x64 = x.to(DType::F64), w64 = w.to(DType::F64), b64 = b.to(DType::F64);
    check_scaled(out, F::conv2d(x64, w64, b64, p), F::conv2d(x64.abs(), w64.abs(), b64.abs(), p), "output");
    const Tensor od = out.to(DType::F64);  // statistics of what was written
    check_close_rel(mean, values(od.mean({0, 2, 3})), 1e-6, "mean");
    check_close_rel(var, values(od.var({0, 2, 3}, 0)), 1e-6, "biased variance");
  }
}

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
  const Tensor x0 = kiln::randn({g.N, g.C, g.H, g.W}), b = kiln::randn({g.K}), gy0 = kiln::randn({g.N, g.K, g.OH, g.OW});
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

TEST_CASE("conv2d with Winograd on equals it off: forward, input and weight gradients, strided inputs",
          "[winograd]") {
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
      return Result{values(y), values(l.grad()), values(wl.grad()), values(bl.grad()), y.detach(), l.grad(),
                    wl.grad(), bl.grad()};
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
    const Result mag = run(in.leaf.to(DType::F64).abs(), w0.to(DType::F64).abs(), b0.to(DType::F64).abs(),
                           gy.to(DType::F64).abs());
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
  CHECK_THROWS_AS(kiln::kernels::conv2d_backward(gx, kiln::empty({16, 16, 3, 2}), Tensor(), gy, x, w, g),
                  kiln::Error);
  CHECK_THROWS_AS(kiln::kernels::conv2d_backward(gx, kiln::empty({16, 16, 3, 3}).transpose(0, 1), Tensor(), gy, x,
                                                 w, g),
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
  CHECK_FALSE(winograd_applies(g, DType::F32));  // dilation 2 (same 9x9 output)
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

TEST_CASE("conv2d_batch_norm_relu_max_pool2d's generated backward with Winograd on equals it off",
          "[winograd]") {
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

TEST_CASE("winograd_tile: F(4x4, 3x3) where its products dominate; set_cpu_conv_winograd_tile forces one", "[winograd]") {
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
