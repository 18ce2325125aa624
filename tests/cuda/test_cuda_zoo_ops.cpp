// CUDA vs CPU parity for the model-zoo additions (docs/model_zoo.md): F::pad in every mode,
// F::interpolate in every mode, the masked/scaled scaled_dot_product_attention, and the LSTM and
// GRU layers -- values and gradients, odd sizes, non-contiguous inputs. These are composites of
// ops with their own CUDA kernels; this checks the composition on the device.
#include <catch2/catch.hpp>

#include <functional>
#include <string>

#include <kiln/kiln.h>
#include "cuda_test_util.h"

using kiln::DType;
using kiln::Tensor;
using namespace kiln_cuda_test;
namespace F = kiln::nn::functional;

namespace {

void close(const Tensor& gpu, const Tensor& cpu, double tol, const std::string& what) {
  require_allclose(gpu, cpu, tol, tol, what);
}

// f(x) and d(sum(f(x) * w))/dx on both devices, x f64 so that only the algorithms differ.
void same_value_and_grad(const Tensor& x_cpu, const std::function<Tensor(const Tensor&)>& f, const std::string& what) {
  Tensor xc = x_cpu.detach().requires_grad_(true);
  Tensor yc = f(xc);
  Tensor w = kiln::randn(yc.sizes(), DType::F64);
  (yc * w).sum().backward();
  Tensor xg = x_cpu.detach().to(kGpu).requires_grad_(true);
  Tensor yg = f(xg);
  (yg * w.to(kGpu)).sum().backward();
  close(yg, yc, 1e-9, what + ": value");
  close(xg.grad(), xc.grad(), 1e-9, what + ": gradient");
}
}  // namespace

TEST_CASE("zoo ops: pad and interpolate match the CPU in every mode", "[cuda][zoo]") {
  kiln::manual_seed(11);
  Tensor x = kiln::randn({2, 3, 9, 7}, DType::F64).transpose(2, 3);  // [2, 3, 7, 9], strided
  for (std::string mode : {"constant", "reflect", "replicate", "circular"})
    same_value_and_grad(
        x,
        [&](const Tensor& t) {
          return F::pad(t, {2, 1, 3, 0}, mode, mode == "constant" ? 0.5 : 0.0);  // a value is constant mode's only
        },
        "pad " + mode);
  same_value_and_grad(
      x,
      [](const Tensor& t) {
        return F::pad(t, {-1, 2});
      },
      "pad constant crop");
  for (std::string mode : {"nearest", "nearest-exact", "bilinear", "bicubic", "area"})
    for (bool ac : {false, true}) {
      if (ac && mode != "bilinear" && mode != "bicubic") continue;
      same_value_and_grad(
          x,
          [&](const Tensor& t) {
            return F::interpolate(t, F::InterpolateOptions().size({11, 5}).mode(mode).align_corners(ac));
          },
          "interpolate " + mode + (ac ? " align_corners" : ""));
    }
  Tensor x1 = kiln::randn({2, 3, 13}, DType::F64);
  same_value_and_grad(
      x1, [](const Tensor& t) { return F::interpolate(t, F::InterpolateOptions().scale_factor({1.5}).mode("linear")); },
      "interpolate linear");
}

TEST_CASE("zoo ops: masked and scaled attention match the CPU", "[cuda][zoo]") {
  kiln::manual_seed(12);
  Tensor q = kiln::randn({2, 3, 5, 8}, DType::F64), k = kiln::randn({2, 3, 7, 8}, DType::F64);
  Tensor v = kiln::randn({2, 3, 7, 8}, DType::F64);
  Tensor bool_mask = kiln::rand({5, 7}, DType::F64) > 0.3;
  Tensor add_mask = kiln::randn({1, 3, 5, 7}, DType::F64);
  for (const Tensor& mask : {bool_mask, add_mask}) {
    auto run = [&](const Tensor& qq) {
      const kiln::Device d = qq.device();
      return F::scaled_dot_product_attention(qq, k.to(d), v.to(d), mask.to(d), 0.0, false, 0.3);
    };
    same_value_and_grad(q, run, mask.dtype() == DType::Bool ? "sdpa bool mask" : "sdpa additive mask");
  }
}

TEST_CASE("zoo ops: LSTM and GRU layers match the CPU, outputs and parameter gradients", "[cuda][zoo]") {
  kiln::manual_seed(13);
  Tensor x = kiln::randn({6, 3, 5}, DType::F64);  // [T, B, input]
  auto compare = [&](kiln::nn::Module& cpu_model, kiln::nn::Module& gpu_model,
                     const std::function<Tensor(kiln::nn::Module&, const Tensor&)>& run, const std::string& what) {
    gpu_model.load_state_dict(cpu_model.state_dict());
    gpu_model.to(kGpu);
    Tensor yc = run(cpu_model, x), yg = run(gpu_model, x.to(kGpu));
    Tensor w = kiln::randn(yc.sizes(), DType::F64);
    (yc * w).sum().backward();
    (yg * w.to(kGpu)).sum().backward();
    close(yg, yc, 1e-9, what + ": output");
    for_each_parameter_pair(cpu_model, gpu_model, [&](const std::string& name, const Tensor& c, const Tensor& g) {
      close(g.grad(), c.grad(), 1e-9, what + ": " + name);
    });
  };
  auto lstm_options = kiln::nn::LSTMOptions(5, 4).num_layers(2).bidirectional(true);
  kiln::nn::LSTM lstm_cpu(lstm_options), lstm_gpu(lstm_options);
  lstm_cpu.to(DType::F64);
  lstm_gpu.to(DType::F64);
  compare(
      lstm_cpu, lstm_gpu,
      [](kiln::nn::Module& m, const Tensor& in) {
        auto [out, state] = static_cast<kiln::nn::LSTM&>(m)(in, kiln::nn::LSTMState{});
        return kiln::cat({out.flatten(), std::get<0>(state).flatten(), std::get<1>(state).flatten()});
      },
      "LSTM");
  kiln::nn::GRU gru_cpu(5, 4, 2), gru_gpu(5, 4, 2);
  gru_cpu.to(DType::F64);
  gru_gpu.to(DType::F64);
  compare(
      gru_cpu, gru_gpu,
      [](kiln::nn::Module& m, const Tensor& in) {
        auto [out, h] = static_cast<kiln::nn::GRU&>(m)(in, Tensor());
        return kiln::cat({out.flatten(), h.flatten()});
      },
      "GRU");
}
