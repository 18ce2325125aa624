// bench_cuda_optim: the multi-tensor optimizer kernels on the GPU (kiln/optim/adamw.cu through
// kernels/cuda/multi_tensor.cuh, kernels/cuda/multi_tensor.cu, amp.cu) against a per-parameter loop of kiln tensor ops,
// on ResNet-18-sized (11.7M parameters in 62 tensors) and GPT-2-124M-sized (124M parameters in 148 tensors) f32
// parameter lists:
//   1. one AdamW step: fused (a few launches for all parameters) vs per-parameter ops (~10
//      kernels per parameter). GB/s counts the fused kernel's minimal traffic, 28 bytes per
//      element (read param, grad, exp_avg, exp_avg_sq; write param, exp_avg, exp_avg_sq), for both
//      versions, and is compared with the device-to-device copy bandwidth measured in the same run
//      (target: >= 80% of it on an H100);
//   2. the loss scaler's unscale + inf check: one fused pass vs a scale and an isfinite count per
//      tensor (8 bytes per element: read and write the gradient);
//   3. clip_grad_norm: the fused norm (per-chunk partials, one combining block) + one multi-tensor
//      scale vs a norm and a scale per tensor (12 bytes per element: read twice, write once).
// Every fused result is validated against its loop before anything is timed; a mismatch exits 1.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda_bench_util.h"
#include "../model_shapes.h"
#include "kiln/kernels/amp_kernels.h"
#include "kiln/kernels/multi_tensor.h"

using namespace kiln;
namespace gpu = kiln::bench::gpu;

namespace {

using kiln::bench::gpt2_124m_shapes;
using kiln::bench::resnet18_shapes;

const Device kGpu = Device::cuda(0);

double max_abs_diff(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  NoGradGuard ng;
  double e = 0;
  for (size_t i = 0; i < a.size(); ++i)
    e = std::max(e, (a[i].detach() - b[i].detach()).abs().max().cpu().item<double>());
  return e;
}

void run(const char* name, const std::vector<IntList>& shapes, double copy_gbs) {
  manual_seed(0);
  std::vector<Tensor> fused_p, loop_p, grads;
  int64_t numel = 0;
  for (const IntList& s : shapes) {
    Tensor p = (randn(s) * 0.02).to(kGpu);
    Tensor g = (randn(s) * 0.01).to(kGpu);
    Tensor a = p.clone().requires_grad_(true), b = p.clone().requires_grad_(true);
    a.set_grad(g.clone());
    b.set_grad(g.clone());
    fused_p.push_back(a);
    loop_p.push_back(b);
    grads.push_back(g);
    numel += p.numel();
  }
  std::printf("\n%s: %zu tensors, %.2fM parameters (f32)\n", name, shapes.size(), numel / 1e6);
  // recorded case names: "<step> <model> (<tensors> tensors, <parameters> f32)", e.g.
  // "AdamW step ResNet-18 (62 tensors, 11689512 f32)"
  const std::string model =
      std::string(name) + " (" + std::to_string(shapes.size()) + " tensors, " + std::to_string(numel) + " f32)";

  // ---- 1. AdamW step
  optim::AdamW opt(fused_p, optim::AdamWOptions(1e-3).weight_decay(0.1));
  bench::LoopAdamW ref(loop_p, 1e-3, 0.1);
  for (int k = 0; k < 3; ++k) {
    opt.step();
    ref.step();
  }
  const double err = max_abs_diff(fused_p, loop_p);
  bench::validate(err < 1e-6, "fused AdamW vs per-parameter tensor ops (GPU)", err);
  const double t_fused = gpu::time_ms([&] { opt.step(); });
  const double t_loop = gpu::time_ms([&] { ref.step(); }, 10, 3);
  const double bytes = 28.0 * static_cast<double>(numel);
  std::printf(
      "  AdamW step      fused %8.3f ms %7.1f GB/s (%5.1f%% of copy) | per-param loop %8.3f ms %7.1f GB/s | speed-up "
      "%.2fx (max |diff| %.1e)\n",
      t_fused, gpu::gbs(bytes, t_fused), 100.0 * gpu::gbs(bytes, t_fused) / copy_gbs, t_loop, gpu::gbs(bytes, t_loop),
      t_loop / t_fused, err);
  gpu::record("optim", "AdamW step " + model, "kiln", t_fused, gpu::bytes(bytes));
  gpu::record("optim", "AdamW step " + model, "per-param loop", t_loop, gpu::bytes(bytes));

  // ---- 2. unscale + inf check
  {
    NoGradGuard ng;
    std::vector<Tensor> ga, gb;
    for (const Tensor& g : grads) {
      ga.push_back(g.clone());
      gb.push_back(g.clone());
    }
    Tensor inv = full({}, 1.0, TensorOptions(DType::F32).device(kGpu));  // 1: repeated calls keep the values
    Tensor found = zeros({}, TensorOptions(DType::F32).device(kGpu));
    Tensor nonfinite = zeros({}, TensorOptions(DType::F32).device(kGpu));
    auto fused = [&] { kernels::unscale_and_check_(ga, inv, found); };
    auto separate = [&] {
      for (Tensor& g : gb) {
        g.mul_(inv);
        nonfinite.add_(static_cast<double>(g.numel()) - isfinite(g).to(DType::F32).sum());
      }
    };
    fused();
    separate();
    const double e = max_abs_diff(ga, gb);
    bench::validate(e == 0.0 && found.cpu().item<float>() == 0.0f && nonfinite.cpu().item<float>() == 0.0f,
                    "fused unscale+inf-check vs per-tensor ops", e);
    const double tf = gpu::time_ms(fused), ts = gpu::time_ms(separate, 10, 3);
    const double b = 8.0 * static_cast<double>(numel);
    std::printf(
        "  unscale+check   fused %8.3f ms %7.1f GB/s (%5.1f%% of copy) | per-tensor ops %8.3f ms %7.1f GB/s | speed-up "
        "%.2fx\n",
        tf, gpu::gbs(b, tf), 100.0 * gpu::gbs(b, tf) / copy_gbs, ts, gpu::gbs(b, ts), ts / tf);
    gpu::record("optim", "unscale+inf check " + model, "kiln", tf, gpu::bytes(b));
    gpu::record("optim", "unscale+inf check " + model, "per-tensor ops", ts, gpu::bytes(b));
  }

  // ---- 3. clip_grad_norm
  {
    NoGradGuard ng;
    const double max_norm = 1e9;  // coefficient 1: repeated calls keep the values
    auto per_tensor = [&]() -> Tensor {
      Tensor total = zeros({}, TensorOptions(DType::F32).device(kGpu));
      for (const Tensor& p : loop_p) total = total + (p.grad() * p.grad()).sum();
      total = total.sqrt();
      Tensor coef = (max_norm / (total + 1e-6)).clamp_max(1.0);
      for (const Tensor& p : loop_p) const_cast<Tensor&>(p).mutable_grad().mul_(coef);
      return total;
    };
    const double nf = optim::clip_grad_norm(fused_p, max_norm).cpu().item<double>();
    const double nl = per_tensor().cpu().item<double>();
    bench::validate(std::abs(nf - nl) <= 1e-4 * nl, "fused clip_grad_norm vs per-tensor norms", std::abs(nf - nl));
    const double tf = gpu::time_ms([&] { optim::clip_grad_norm(fused_p, max_norm); });
    const double ts = gpu::time_ms([&] { per_tensor(); }, 10, 3);
    const double b = 12.0 * static_cast<double>(numel);
    std::printf(
        "  clip_grad_norm  fused %8.3f ms %7.1f GB/s (%5.1f%% of copy) | per-tensor ops %8.3f ms %7.1f GB/s | speed-up "
        "%.2fx (norm %.6g)\n",
        tf, gpu::gbs(b, tf), 100.0 * gpu::gbs(b, tf) / copy_gbs, ts, gpu::gbs(b, ts), ts / tf, nf);
    gpu::record("optim", "clip_grad_norm " + model, "kiln", tf, gpu::bytes(b));
    gpu::record("optim", "clip_grad_norm " + model, "per-tensor ops", ts, gpu::bytes(b));
  }
}

}  // namespace

int main() {
  gpu::require_gpu("bench_cuda_optim");
  const double copy = gpu::copy_bandwidth_gbs(size_t{512} << 20);
  std::printf("bench_cuda_optim: device-to-device copy bandwidth (512 MiB, read + write): %.1f GB/s\n", copy);
  run("ResNet-18", resnet18_shapes(), copy);
  run("GPT-2 124M", gpt2_124m_shapes(), copy);
  return 0;
}
