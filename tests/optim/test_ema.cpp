// EMA: the average follows the formula, swapping in and out restores the weights exactly.
#include <catch2/catch.hpp>

#include <kiln/kiln.h>
#include <kiln/optim/ema.h>

using kiln::Tensor;

TEST_CASE("EMA follows shadow = d * shadow + (1 - d) * param", "[ema]") {
  kiln::nn::Linear l(3, 2);
  kiln::optim::EMA ema(l, 0.9);
  ema.set_warmup(false);
  Tensor w0 = l.weight.detach().clone();
  {
    kiln::NoGradGuard ng;
    l.weight.add_(1.0);
  }
  ema.update();  // shadow = 0.9 w0 + 0.1 (w0 + 1) = w0 + 0.1
  {
    auto swap = ema.average_parameters();
    REQUIRE(kiln::allclose(l.weight, w0 + 0.1, 1e-6, 1e-6));
  }
  REQUIRE(kiln::allclose(l.weight, w0 + 1.0, 0, 0));  // restored exactly
  auto sd = ema.state_dict();
  REQUIRE(sd.at("ema.__num_updates").item<int64_t>() == 1);
  kiln::optim::EMA other(l, 0.9);
  other.load_state_dict(sd);
  REQUIRE(other.num_updates() == 1);
  REQUIRE_THROWS_AS(kiln::optim::EMA(l, 1.0), kiln::Error);
}

TEST_CASE("EMA warmup uses min(decay, (1 + n) / (10 + n))", "[ema]") {
  kiln::nn::Linear l(2, 2);
  kiln::optim::EMA ema(l, 0.999);
  Tensor w0 = l.weight.detach().clone();
  {
    kiln::NoGradGuard ng;
    l.weight.add_(10.0);
  }
  ema.update();  // d = 0.1: shadow = 0.1 w0 + 0.9 (w0 + 10) = w0 + 9
  ema.copy_to_model();
  REQUIRE(kiln::allclose(l.weight, w0 + 9.0, 1e-6, 1e-5));
}
