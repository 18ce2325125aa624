#include <catch2/catch.hpp>

#include <cmath>

#include <kiln/kiln.h>
#include <kiln/optim/lr_finder.h>

TEST_CASE("LR range test: exponential sweep, divergence stop, steepest-descent suggestion", "[lr_finder]") {
  auto w = kiln::zeros({1}, kiln::TensorOptions().requires_grad(true));
  kiln::optim::SGD opt({w}, kiln::optim::SGDOptions(1e-3));
  // A synthetic loss curve in log10(lr): flat, then falling fastest near 1e-2, then exploding.
  auto step = [&]() {
    double lr = opt.param_groups()[0].lr();
    double x = std::log10(lr);
    return 2.0 - std::tanh((x + 2.0) * 2.0) + (x > 0 ? std::exp(5 * x) : 0.0);
  };
  kiln::optim::LRFinderOptions o;
  o.smoothing(0.0);  // exact curve
  auto r = kiln::optim::lr_range_test(opt, step, o);
  REQUIRE(r.lrs.front() == Approx(1e-7));
  REQUIRE(r.lrs[1] / r.lrs[0] == Approx(std::pow(1e8, 1.0 / 99)));
  REQUIRE(r.diverged);
  REQUIRE(r.lrs.back() < 10.0);
  REQUIRE(std::log10(r.suggested_lr) == Approx(-2.0).margin(0.1));
  REQUIRE_THROWS_AS(kiln::optim::lr_range_test(opt, step, kiln::optim::LRFinderOptions().start_lr(1.0).end_lr(0.5)),
                    kiln::Error);
}
