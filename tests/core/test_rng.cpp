// Philox: known-answer vectors, reproducibility, and the distributions' moments.
#include <catch2/catch.hpp>

#include <cmath>

#include <kiln/core/philox.h>
#include <kiln/kiln.h>

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
