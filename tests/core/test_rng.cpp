// Philox: known-answer vectors, reproducibility, and the distributions' moments.
#include <catch2/catch.hpp>

#include <cmath>

#include <kiln/core/philox.h>
#include <kiln/kernels/cpu/dropout_keep.h>
#include <kiln/kiln.h>

#include "tests/test_util.h"

using kiln::DType;

TEST_CASE("Philox4x32-10 matches the Random123 known-answer vectors", "[rng]") {
  auto z = kiln::philox::block(0, 0, 0);
  REQUIRE(z.v[0] == 0x6627e8d5u);
  REQUIRE(z.v[1] == 0xe169c58du);
  REQUIRE(z.v[2] == 0xbc57ac4cu);
  REQUIRE(z.v[3] == 0x9b00dbd8u);
  auto f = kiln::philox::block(~0ull, ~0ull, ~0ull);
  REQUIRE(f.v[0] == 0x408f276du);
  REQUIRE(f.v[1] == 0x41c83b0eu);
  REQUIRE(f.v[2] == 0xa20bc7c6u);
  REQUIRE(f.v[3] == 0x6d5451fdu);
}

TEST_CASE("manual_seed makes draws reproducible and streams advance", "[rng]") {
  kiln::manual_seed(42);
  auto a = kiln::randn({100});
  auto b = kiln::randn({100});
  kiln::manual_seed(42);
  auto a2 = kiln::randn({100});
  REQUIRE(kiln::equal(a, a2));
  REQUIRE_FALSE(kiln::equal(a, b));
  kiln::manual_seed(43);
  REQUIRE_FALSE(kiln::equal(kiln::randn({100}), a));
}

TEST_CASE("the numbers do not depend on the thread count or layout", "[rng]") {
  kiln::manual_seed(7);
  auto big = kiln::rand({100000});
  kiln::manual_seed(7);
  auto r = kiln::rand({100, 1000});  // same offsets, other shape
  REQUIRE(kiln::equal(big.reshape({100, 1000}), r));
}

TEST_CASE("uniform and normal moments", "[rng]") {
  kiln::manual_seed(123);
  const int64_t n = 200000;
  for (DType dt : {DType::F32, DType::F64}) {
    auto u = kiln::rand({n}, dt).to(DType::F64);
    REQUIRE(u.mean().item<double>() == Approx(0.5).margin(0.005));
    REQUIRE(u.var().item<double>() == Approx(1.0 / 12).margin(0.002));
    REQUIRE(u.min().item<double>() >= 0.0);
    REQUIRE(u.max().item<double>() < 1.0);
    auto g = kiln::randn({n}, dt).to(DType::F64);
    REQUIRE(g.mean().item<double>() == Approx(0.0).margin(0.01));
    REQUIRE(g.var().item<double>() == Approx(1.0).margin(0.02));
    auto tail = (kiln::abs(g) > 1.96).to(DType::F64).mean().item<double>();
    REQUIRE(tail == Approx(0.05).margin(0.004));
  }
  auto ri = kiln::randint(-3, 4, {n});
  REQUIRE(ri.dtype() == DType::I64);
  REQUIRE(ri.min().item<int64_t>() == -3);
  REQUIRE(ri.max().item<int64_t>() == 3);
  REQUIRE_THROWS_AS(kiln::randint(5, 5, {3}), kiln::Error);
  REQUIRE_THROWS_AS(kiln::rand({3}, DType::I64), kiln::Error);
}

TEST_CASE("dropout draws four elements from each Philox block, in word order", "[rng]") {
  for (uint64_t seed : {uint64_t{0}, uint64_t{42}, ~uint64_t{0}}) {
    for (uint64_t offset : {uint64_t{0}, uint64_t{5}, (uint64_t{1} << 32) - 1}) {
      for (uint64_t q : {uint64_t{0}, uint64_t{1}, uint64_t{1000}}) {
        const kiln::philox::U32x4 b = kiln::philox::block(seed, offset + q);
        for (uint64_t w = 0; w < 4; ++w)
          REQUIRE(kiln::philox::dropout_uniform(seed, offset, 4 * q + w) == kiln::philox::to_unit_float(b.v[w]));
      }
    }
  }
}

TEST_CASE("dropout_keep draws the scalar Philox decisions, 32 or 64 at a time, across a low-word wrap", "[rng]") {
  kiln_test::for_each_cpu_isa([] {
    // Block counters offset + (i0 + j) / 4: runs whose counters cross 2^32 inside a vector (the
    // low word wraps), start at 0, and at large values; runs starting at every element of a block
    // (i0 % 4) and lengths around the 32- and 64-element steps; p from 0 to near 1; at every CPU
    // level (the AVX2 and AVX-512 copies vectorise differently).
    const uint64_t seeds[] = {0, 42, 0x123456789ABCDEFull, ~0ull};
    const uint64_t offsets[] = {0, 7, (1ull << 32) - 9, (1ull << 32) - 16, (3ull << 32) - 1, ~0ull - 100};
    const float ps[] = {0.0f, 0.1f, 0.5f, 0.9f, 0.999f};
    int64_t kept = 0, total = 0;
    for (uint64_t seed : seeds)
      for (uint64_t offset : offsets)
        for (float p : ps)
          for (uint64_t i0 : {0, 1, 2, 3, 14, 4099})
            for (int64_t n : {0, 1, 3, 5, 31, 32, 33, 63, 64, 65, 67, 130, 200}) {
              uint8_t keep[200];
              kiln::kernels::cpu::dropout_keep_in_use.on(kiln::Device::cpu(), seed, offset, p, i0, n, keep);
              for (int64_t j = 0; j < n; ++j) {
                const bool want = kiln::philox::dropout_uniform(seed, offset, i0 + static_cast<uint64_t>(j)) >= p;
                if (static_cast<bool>(keep[j]) != want || keep[j] > 1) {
                  INFO("seed " << seed << " offset " << offset << " i0 " << i0 << " n " << n << " p " << p << " j "
                               << j);
                  REQUIRE(static_cast<bool>(keep[j]) == want);
                  REQUIRE(keep[j] <= 1);
                }
                kept += keep[j];
                ++total;
              }
            }
    CHECK(kept > total / 3);  // the draws are not all one way
    CHECK(kept < total);
  });
}
