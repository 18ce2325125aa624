// The CPU GEMM under every dense kernel (kiln/kernels/cpu/gemm.h) against a triple loop in
// double: sizes around its tile edges (12 rows, 16/32 columns, 256-deep slices), every
// combination of transposed operands, accumulate or overwrite, an empty inner dimension, a
// column-major output, multi-threaded splits by rows and by columns, and a left operand packed
// once (PackedLhs) for several products. f32 runs at every CPU level the machine has (the AVX2
// 6 x 16 and AVX-512 12 x 32 micro-tiles, Eigen at the baseline).
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kiln/kernels/cpu/gemm.h"
#include "tests/test_util.h"

namespace {

using kiln::kernels::cpu::gemm;
using kiln::kernels::cpu::MatrixView;
using kiln_test::for_each_cpu_isa;

template <class T> struct Case {
  int64_t M, N, K;
  bool ta, tb, accumulate;
  int threads;
  bool packed = false;  // A through PackedLhs
};

// Runs one product with A stored [M, K] (or [K, M] when ta) and B [K, N] (or [N, K] when tb) and
// returns the worst error relative to 1 + |reference|.
template <class T> double max_error(const Case<T>& c, std::mt19937& rng) {
  std::normal_distribution<double> nd;
  std::vector<T> a(c.M * c.K), b(c.K * c.N), out(c.M * c.N);
  for (auto& v : a) v = static_cast<T>(nd(rng));
  for (auto& v : b) v = static_cast<T>(nd(rng));
  for (auto& v : out) v = static_cast<T>(nd(rng));
  auto A = [&](int64_t i, int64_t k) { return static_cast<double>(c.ta ? a[k * c.M + i] : a[i * c.K + k]); };
  auto B = [&](int64_t k, int64_t j) { return static_cast<double>(c.tb ? b[j * c.K + k] : b[k * c.N + j]); };
  std::vector<double> want(c.M * c.N);
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = 0; j < c.N; ++j) {
      double s = c.accumulate ? static_cast<double>(out[i * c.N + j]) : 0.0;
      for (int64_t k = 0; k < c.K; ++k) s += A(i, k) * B(k, j);
      want[i * c.N + j] = s;
    }
  MatrixView<const T> av =
      c.ta ? MatrixView<const T>{a.data(), c.M, c.K, 1, c.M} : MatrixView<const T>{a.data(), c.M, c.K, c.K, 1};
  MatrixView<const T> bv =
      c.tb ? MatrixView<const T>{b.data(), c.K, c.N, 1, c.K} : MatrixView<const T>{b.data(), c.K, c.N, c.N, 1};
  if constexpr (std::is_same_v<T, float>) {  // the copy of the CPU level in use
    kiln::kernels::cpu::gemm_f32_in_use.on(kiln::Device::cpu(), av, bv, MatrixView<T>{out.data(), c.M, c.N, c.N, 1},
                                           c.accumulate, c.threads, c.packed);
  } else if (c.packed) {
    gemm(kiln::kernels::cpu::PackedLhs<T>(av), bv, MatrixView<T>{out.data(), c.M, c.N, c.N, 1}, c.accumulate,
         c.threads);
  } else {
    gemm(av, bv, MatrixView<T>{out.data(), c.M, c.N, c.N, 1}, c.accumulate, c.threads);
  }
  double err = 0;
  for (int64_t i = 0; i < c.M * c.N; ++i) {
    const double d = std::abs(static_cast<double>(out[i]) - want[i]) / (1 + std::abs(want[i]));
    err = std::isnan(d) ? INFINITY : std::max(err, d);
  }
  return err;
}

}  // namespace

TEST_CASE("cpu gemm: f32 and f64 against a triple loop, all transposes, tile edges", "[gemm]") {
  std::mt19937 rng(7);
  int checked = 0;
  // M: whole panels of 6 (AVX2) and 12 (AVX-512) rows and last panels of a third, two thirds and
  // less than a whole one (each its own kernel); N: one- and two-vector panels of 8 and 16
  for (int64_t M : {1, 5, 6, 7, 11, 12, 13, 20, 37, 64, 150})
    for (int64_t N : {1, 7, 8, 9, 15, 16, 17, 33, 70})
      for (int64_t K : {1, 3, 255, 257})
        for (int flags = 0; flags < 8; ++flags) {
          const bool ta = flags & 1, tb = flags & 2, acc = flags & 4;
          INFO("M " << M << " N " << N << " K " << K << " ta " << ta << " tb " << tb << " acc " << acc);
          // f32 accumulates in float: error ~ K * 2^-24 * |terms|
          for_each_cpu_isa([&] {
            CHECK(max_error(Case<float>{M, N, K, ta, tb, acc, 1}, rng) < 2e-5 * std::sqrt(double(K)) + 1e-6);
          });
          CHECK(max_error(Case<double>{M, N, K, ta, tb, acc, 1}, rng) < 1e-12);
          ++checked;
        }
  CHECK(checked == 11 * 9 * 4 * 8);
}

TEST_CASE("cpu gemm: multi-threaded splits by columns and by rows equal one thread", "[gemm]") {
  std::mt19937 rng(8);
  // wide (split by columns), tall (split by rows), and wide over 2048 columns (two column blocks)
  for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{40, 300, 70}, {300, 20, 70}, {13, 2100, 9}})
    for (bool tb : {false, true}) {
      INFO("M " << M << " N " << N << " K " << K << " tb " << tb);
      for_each_cpu_isa([&] {
        CHECK(max_error(Case<float>{M, N, K, false, tb, true, 2}, rng) < 1e-4);
        CHECK(max_error(Case<float>{M, N, K, true, tb, false, 3}, rng) < 1e-4);
      });
    }
}

TEST_CASE("cpu gemm: empty inner dimension, column-major output, shape errors", "[gemm]") {
  std::vector<float> a(6, 1.0f), b(6, 2.0f), c(4, 5.0f);
  // K = 0: overwrite gives zeros, accumulate leaves C alone
  gemm(MatrixView<const float>{a.data(), 2, 0, 1, 1}, MatrixView<const float>{b.data(), 0, 2, 2, 1},
       MatrixView<float>{c.data(), 2, 2, 2, 1}, true);
  CHECK(c == std::vector<float>{5, 5, 5, 5});
  gemm(MatrixView<const float>{a.data(), 2, 0, 1, 1}, MatrixView<const float>{b.data(), 0, 2, 2, 1},
       MatrixView<float>{c.data(), 2, 2, 2, 1}, false);
  CHECK(c == std::vector<float>{0, 0, 0, 0});
  // column-major C (rs 1, cs 2): C[i][j] at c[i + 2j]; A = [[1,2,3],[4,5,6]], B = ones * 2
  std::vector<float> a2{1, 2, 3, 4, 5, 6};
  gemm(MatrixView<const float>{a2.data(), 2, 3, 3, 1}, MatrixView<const float>{b.data(), 3, 2, 2, 1},
       MatrixView<float>{c.data(), 2, 2, 1, 2}, false);
  CHECK(c == std::vector<float>{12, 30, 12, 30});
  CHECK_THROWS_WITH(gemm(MatrixView<const float>{a2.data(), 2, 3, 3, 1}, MatrixView<const float>{b.data(), 2, 3, 3, 1},
                         MatrixView<float>{c.data(), 2, 3, 3, 1}, false),
                    Catch::Contains("gemm: [2, 3] @ [2, 3] -> [2, 3]: shapes do not match"));
}

TEST_CASE("cpu gemm: a left operand packed once gives the plain products", "[gemm]") {
  std::mt19937 rng(9);
  // M around the 12-row panels and the 144-row blocks, K over several 256-deep slices, N wide
  // and narrow (the thread splits by rows and by columns), both dtypes, both layouts of A
  for (int64_t M : {5, 37, 150})
    for (int64_t N : {17, 70, 2100})
      for (int64_t K : {3, 600})
        for (int flags = 0; flags < 4; ++flags) {
          const bool ta = flags & 1, acc = flags & 2;
          for (int threads : {1, 2, 3}) {
            INFO("M " << M << " N " << N << " K " << K << " ta " << ta << " acc " << acc << " threads " << threads);
            for_each_cpu_isa([&] {
              CHECK(max_error(Case<float>{M, N, K, ta, false, acc, threads, true}, rng) <
                    2e-5 * std::sqrt(double(K)) + 1e-6);
            });
          }
          CHECK(max_error(Case<double>{M, N, K, ta, true, acc, 2, true}, rng) < 1e-12);
        }
  // one packing for two right operands: bitwise the unpacked results (same kernel, same order)
  std::normal_distribution<float> nd;
  const int64_t M = 29, K = 300, N = 40;
  std::vector<float> a(M * K), b1(K * N), b2(K * N), got(M * N), want(M * N);
  for (auto* v : {&a, &b1, &b2})
    for (auto& x : *v) x = nd(rng);
  const MatrixView<const float> av{a.data(), M, K, K, 1};
  const kiln::kernels::cpu::PackedLhs<float> packed(av);
  for (const auto* b : {&b1, &b2}) {
    const MatrixView<const float> bv{b->data(), K, N, N, 1};
    gemm(packed, bv, MatrixView<float>{got.data(), M, N, N, 1}, false, 1);
    gemm(av, bv, MatrixView<float>{want.data(), M, N, N, 1}, false, 1);
    CHECK(got == want);
  }
}
