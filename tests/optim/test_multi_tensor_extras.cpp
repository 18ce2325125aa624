// The fused multi-tensor lerp (the EMA update) and the loss-scale update kernel on the CPU: both
// run the functors the CUDA launchers share (math::LerpOp, math::update_loss_scale), so these
// tests check the math of the GPU kernels too.
#include <catch2/catch.hpp>

#include <cmath>

#include <kiln/kiln.h>
#include <kiln/kernels/amp_kernels.h>
#include <kiln/kernels/multi_tensor.h>
#include <kiln/optim/ema.h>

using kiln::DType;
using kiln::Tensor;

TEST_CASE("multi_tensor_lerp_ equals dst + w * (src - dst) for every tensor and dtype", "[optim][lerp]") {
  kiln::manual_seed(3);
  const double w = 0.137;
  std::vector<Tensor> dst, src, want;
  // sizes across the 64K-element chunk boundary, an empty tensor, 16-bit and f64 dtypes, and a
  // transposed (non-dense pair) case that takes the strided path
  const std::vector<std::pair<kiln::IntList, DType>> cases = {
      {{7}, DType::F32},     {{1 << 16}, DType::F32}, {{(1 << 17) + 3}, DType::F32}, {{0}, DType::F32},
      {{33, 5}, DType::F64}, {{1023}, DType::F16},    {{4097}, DType::BF16}};
  for (auto& [sizes, dt] : cases) {
    Tensor d = kiln::randn(sizes).to(dt), s = kiln::randn(sizes).to(dt);
    // the formula in f64 on the same (rounded) inputs, rounded once to the dtype
    want.push_back((d.to(DType::F64) + (s.to(DType::F64) - d.to(DType::F64)) * w).to(dt));
    dst.push_back(d);
    src.push_back(s);
  }
  Tensor a = kiln::randn({6, 9});
  Tensor t_dst = kiln::randn({9, 6}).t();  // dense but transposed; src contiguous: layouts differ
  want.push_back(t_dst + (a - t_dst) * w);
  dst.push_back(t_dst);
  src.push_back(a);

  kiln::kernels::multi_tensor_lerp_(dst, src, w);
  for (size_t i = 0; i < dst.size(); ++i) {
    INFO("tensor " << i << " dtype " << kiln::dtype_name(dst[i].dtype()));
    const DType dt = dst[i].dtype();
    const double tol = dt == DType::BF16 ? 1e-2 : dt == DType::F16 ? 1e-3 : dt == DType::F64 ? 1e-14 : 1e-6;
    REQUIRE(kiln::allclose(dst[i].to(DType::F64), want[i].to(DType::F64), tol, tol));
  }
  // f32 is the functor in f32 (to an ulp: the vectorized loop may contract to an FMA)
  Tensor x = kiln::randn({100}), y = kiln::randn({100});
  Tensor x0 = x.clone();
  kiln::kernels::multi_tensor_lerp_({x}, {y}, w);
  const kiln::math::LerpOp<float> f{static_cast<float>(w)};
  for (int64_t i = 0; i < 100; ++i) {
    const float want = f(x0.data_ptr<float>()[i], y.data_ptr<float>()[i]);
    REQUIRE(std::abs(x.data_ptr<float>()[i] - want) <= 2e-7f * (1.0f + std::abs(want)));
  }

  REQUIRE_THROWS_AS(kiln::kernels::multi_tensor_lerp_({x}, {}, w), kiln::Error);
  REQUIRE_THROWS_AS(kiln::kernels::multi_tensor_lerp_({x}, {kiln::randn({99})}, w), kiln::Error);
  REQUIRE_THROWS_AS(kiln::kernels::multi_tensor_lerp_({x}, {y.to(DType::F64)}, w), kiln::Error);
}

TEST_CASE("EMA.update is the fused lerp: shadow = d * shadow + (1 - d) * param", "[optim][ema][lerp]") {
  kiln::manual_seed(4);
  kiln::nn::Linear l(5, 3);
  kiln::optim::EMA ema(l, 0.9);
  ema.set_warmup(false);
  Tensor shadow_w = l.weight.detach().clone(), shadow_b = l.bias.detach().clone();
  for (int step = 0; step < 3; ++step) {
    {
      kiln::NoGradGuard ng;
      l.weight.add_(kiln::randn({3, 5}));
      l.bias.mul_(1.5);
    }
    ema.update();
    shadow_w = shadow_w * 0.9 + l.weight.detach() * 0.1;
    shadow_b = shadow_b * 0.9 + l.bias.detach() * 0.1;
  }
  auto sd = ema.state_dict();
  REQUIRE(kiln::allclose(sd.at("ema.weight"), shadow_w, 1e-6, 1e-6));
  REQUIRE(kiln::allclose(sd.at("ema.bias"), shadow_b, 1e-6, 1e-6));
}

TEST_CASE("amp_update_scale_ follows GradScaler's schedule on the CPU", "[optim][amp]") {
  Tensor scale = kiln::full({}, 1024.0, DType::F32);
  Tensor tracker = kiln::zeros({}, DType::I64);
  Tensor skipped = kiln::zeros({}, DType::I64);
  Tensor found = kiln::zeros({}, DType::F32);
  auto update = [&] { kiln::kernels::amp_update_scale_(scale, tracker, skipped, found, 2.0, 0.5, 3); };
  update();
  update();
  REQUIRE(scale.item<double>() == 1024.0);
  REQUIRE(tracker.item<int64_t>() == 2);
  update();  // the third clean step grows the scale
  REQUIRE(scale.item<double>() == 2048.0);
  REQUIRE(tracker.item<int64_t>() == 0);
  update();
  found.fill_(1.0);
  REQUIRE(skipped.item<int64_t>() == 0);
  update();  // overflow: back off and reset, and count the skipped step
  REQUIRE(scale.item<double>() == 1024.0);
  REQUIRE(tracker.item<int64_t>() == 0);
  REQUIRE(skipped.item<int64_t>() == 1);
  update();
  REQUIRE(skipped.item<int64_t>() == 2);
  // the shared rule itself
  double s = 8.0;
  int64_t t = 1999, k = 0;
  kiln::math::update_loss_scale(s, t, k, false, 2.0, 0.5, 2000);
  REQUIRE(s == 16.0);
  REQUIRE(t == 0);
  REQUIRE(k == 0);
  kiln::math::update_loss_scale(s, t, k, true, 2.0, 0.25, 2000);
  REQUIRE(s == 4.0);
  REQUIRE(k == 1);
  REQUIRE_THROWS_AS(kiln::kernels::amp_update_scale_(scale, scale, skipped, found, 2.0, 0.5, 3), kiln::Error);
  REQUIRE_THROWS_AS(kiln::kernels::amp_update_scale_(scale, tracker, found, found, 2.0, 0.5, 3), kiln::Error);
}
