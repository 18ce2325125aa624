// Autocast's policy table and the GradScaler's arithmetic (forced on, on the CPU).
#include <catch2/catch.hpp>

#include <cmath>

#include <kiln/kiln.h>
#include "tests/test_util.h"

using kiln::DType;
using kiln::Tensor;
namespace F = kiln::nn::functional;

TEST_CASE("autocast runs matmul/linear/conv low and softmax/losses/norms in f32", "[amp]") {
  kiln::manual_seed(1);
  kiln::nn::Linear lin(8, 4);
  Tensor x = kiln::randn({3, 8});
  Tensor img = kiln::randn({2, 3, 8, 8}), w = kiln::randn({4, 3, 3, 3});
  {
    kiln::amp::Autocast ac(DType::BF16);
    REQUIRE(kiln::amp::autocast_dtype() == DType::BF16);
    Tensor y = lin(x);
    REQUIRE(y.dtype() == DType::BF16);
    REQUIRE(kiln::matmul(x, x.t()).dtype() == DType::BF16);
    REQUIRE(F::conv2d(img, w).dtype() == DType::BF16);
    REQUIRE(kiln::softmax(y, -1).dtype() == DType::F32);
    REQUIRE(F::cross_entropy(y, kiln::tensor(std::vector<int64_t>{0, 1, 2})).dtype() == DType::F32);
    REQUIRE(F::layer_norm(y, {4}).dtype() == DType::F32);
    REQUIRE((y + 1.0).dtype() == DType::BF16);  // not in the table: input dtype
    REQUIRE(kiln::matmul(x.to(DType::F64), x.to(DType::F64).t()).dtype() == DType::F64);  // f64 stays
    {
      kiln::amp::Autocast off(DType::F16, /*enabled=*/false);
      REQUIRE(kiln::amp::autocast_dtype() == DType::BF16);  // a disabled guard changes nothing
    }
    // gradients reach the f32 parameters, in f32
    F::cross_entropy(lin(x), kiln::tensor(std::vector<int64_t>{0, 1, 2})).backward();
  }
  REQUIRE_FALSE(kiln::amp::autocast_dtype().has_value());
  REQUIRE(lin.weight.grad().dtype() == DType::F32);
  REQUIRE(lin(x).dtype() == DType::F32);
  // bf16 results stay close to f32 ones
  Tensor ref = kiln::matmul(x, x.t());
  Tensor low;
  {
    kiln::amp::Autocast ac(DType::BF16);
    low = kiln::matmul(x, x.t());
  }
  REQUIRE(kiln::allclose(low.to(DType::F32), ref, 3e-2, 5e-2));
  REQUIRE_THROWS_AS(kiln::amp::Autocast(DType::F32), kiln::Error);
}

TEST_CASE("GradScaler scales, unscales, skips on overflow, backs off and grows", "[amp]") {
  auto w = kiln::tensor({1.0f, 2.0f}, kiln::TensorOptions().requires_grad(true));
  kiln::optim::SGD opt({w}, kiln::optim::SGDOptions(0.1));
  kiln::amp::GradScaler scaler(kiln::amp::GradScalerOptions().enabled(true).growth_interval(3));
  REQUIRE(scaler.is_enabled());
  CHECK(!kiln::amp::GradScalerOptions().enabled().has_value());  // default: where CUDA is available
  // clean step: d/dw sum(w^2) = 2w, applied unscaled
  Tensor loss = (w * w).sum();
  Tensor scaled = scaler.scale(loss);
  REQUIRE(scaled.item<double>() == Approx(65536.0 * 5.0));
  scaled.backward();
  scaler.unscale(opt);
  REQUIRE(w.grad()[1].item<float>() == Approx(4.0f));
  scaler.step(opt);  // does not unscale twice
  scaler.update();
  REQUIRE(w[1].item<float>() == Approx(2.0f - 0.1f * 4.0f));
  REQUIRE(scaler.get_scale() == 65536.0);
  kiln_test::check_grad_scaler_backoff_and_growth(scaler, opt, w);
  auto sd = scaler.state_dict();
  kiln::amp::GradScaler other(kiln::amp::GradScalerOptions().enabled(true));
  other.load_state_dict(sd);
  REQUIRE(other.get_scale() == 65536.0);
}

TEST_CASE("GradScaler is a transparent no-op without a GPU by default", "[amp]") {
  kiln::amp::GradScaler scaler;
  REQUIRE(scaler.is_enabled() == kiln::cuda::is_available());
  if (scaler.is_enabled()) return;
  auto w = kiln::tensor({3.0f}, kiln::TensorOptions().requires_grad(true));
  kiln::optim::SGD opt({w}, kiln::optim::SGDOptions(0.5));
  Tensor loss = (w * w).sum();
  REQUIRE(scaler.scale(loss).is_same(loss));
  loss.backward();
  scaler.step(opt);
  scaler.update();
  REQUIRE(w.item<float>() == Approx(3.0f - 0.5f * 6.0f));
  REQUIRE(scaler.get_scale() == 1.0);
}
