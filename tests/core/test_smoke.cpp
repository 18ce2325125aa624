#include <catch2/catch.hpp>

#include <kiln/kiln.h>

TEST_CASE("acceptance: x*x + 3x gives grad 2x + 3", "[autograd]") {
  kiln::manual_seed(1);
  auto x = kiln::randn({3, 4}, kiln::TensorOptions().requires_grad(true));
  (x * x + x * 3.0).sum().backward();
  auto expected = x.detach() * 2.0 + 3.0;
  REQUIRE(kiln::allclose(x.grad(), expected, 1e-6, 1e-6));
}
