// Winograd F(2x2, 3x3) and F(4x4, 3x3) kernels on the CPU (kiln/kernels/cpu/winograd.h; the op-level
// checks are in test_cpu_winograd_ops.cpp), every check under
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

#include "tests/core/winograd_test_util.h"

using namespace winograd_test;

TEST_CASE("winograd_forward f64 equals a direct convolution in double", "[winograd]") {
  for_each_tile([] { check_forward_shapes<double>(11); });
}

TEST_CASE("winograd_forward f32 equals a direct convolution in double within f32 rounding", "[winograd]") {
  for_each_tile([] { check_forward_shapes<float>(12); });
}

TEST_CASE("winograd_backward_input f64 and f32 equal the adjoint of the direct convolution", "[winograd]") {
  f64_and_f32_sections(13, 14, [](auto t, uint32_t seed) { check_backward_input_shapes<decltype(t)>(seed); });
}

TEST_CASE("winograd_backward_weight f64 and f32 equal the direct weight gradient", "[winograd]") {
  f64_and_f32_sections(16, 17, [](auto t, uint32_t seed) { check_backward_weight_shapes<decltype(t)>(seed); });
}

TEST_CASE("winograd_backward_both f64 and f32 equal the direct input and weight gradients", "[winograd]") {
  f64_and_f32_sections(24, 25,
                       [](auto t, uint32_t seed) { check_both_gradients_shapes<decltype(t)>(BothVia::Stored, seed); });
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
  f64_and_f32_sections(
      18, 19, [](auto t, uint32_t seed) { check_both_gradients_shapes<decltype(t)>(BothVia::Generated, seed); });
}

TEST_CASE("winograd_backward_input is the adjoint of winograd_forward: <gy, conv(x)> = <conv^T(gy), x>", "[winograd]") {
  // Independent of the reference loops above: the identity ties the two kernels together.
  std::mt19937 rng(15);
  for (const Shape& s :
       {Shape{2, 5, 7, 7, 6, 1, 2, false}, Shape{1, 17, 3, 13, 4, 2, 0, false}, Shape{3, 3, 4, 4, 37, 0, 1, false}}) {
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

TEST_CASE(
    "winograd_backward_input through both routes: the forward's tiles (whole samples per chunk) and the "
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
        check_against<double>(ref, by_magnitude<double>(),
                              [&](double* gx) { return winograd_backward_input<double>(gy.data(), w.data(), gx, g); });
        const auto gyt = cast<float>(gy), wt = cast<float>(w);
        check_against<float>(ref, by_magnitude<float>(),
                             [&](float* gx) { return winograd_backward_input<float>(gyt.data(), wt.data(), gx, g); });
      }
    });
  }
}

TEST_CASE(
    "winograd_forward: rows-of-tiles and multi-sample chunks on two threads, samples_done once per sample "
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
        const bool ok =
            winograd_forward<T>(xt.data(), wt.data(), bt.data(), out.data(), g, [&](int64_t n0, int64_t n1) {
              if (n0 < 0 || n1 > g.N || n0 >= n1) {
                bad_range = true;
                return;
              }
              int first = -1;
              // (on one thread only: elsewhere other chunks are being written)
              if (threads == 1 && all_final_at_first_call.compare_exchange_strong(first, 0)) {
                const bool all = std::none_of(out.begin(), out.end(), [](T v) { return std::isnan(v); });
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
  for (const ConvGeometry& g :
       {geometry(2, 16, 16, 127, 129, 1, 1), geometry(2, 16, 16, 1000, 14, 1, 1), geometry(13, 16, 16, 9, 7, 1, 2)}) {
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
