// The global deterministic-algorithms switch (kiln/core/determinism.h).
#include <catch2/catch.hpp>

#include <kiln/kiln.h>
#include <kiln/kernels/indexing.h>

TEST_CASE("set_deterministic_algorithms toggles the global switch; the guard restores it", "[core][determinism]") {
  REQUIRE_FALSE(kiln::deterministic_algorithms());  // off by default
  kiln::set_deterministic_algorithms(true);
  REQUIRE(kiln::deterministic_algorithms());
  {
    kiln::DeterministicGuard g(false);
    REQUIRE_FALSE(kiln::deterministic_algorithms());
  }
  REQUIRE(kiln::deterministic_algorithms());
  kiln::set_deterministic_algorithms(false);
  REQUIRE_FALSE(kiln::deterministic_algorithms());
  // CPU index_add gives the same result either way (it is ordered on the CPU)
  kiln::manual_seed(5);
  kiln::Tensor src = kiln::randn({64, 7});
  kiln::Tensor idx = kiln::randint(0, 5, {64});
  kiln::Tensor a = kiln::zeros({5, 7}), b = kiln::zeros({5, 7});
  kiln::kernels::index_add(a, 0, idx, src);
  {
    kiln::DeterministicGuard g(true);
    kiln::kernels::index_add(b, 0, idx, src);
  }
  REQUIRE(kiln::equal(a, b));
}
