// Softmax forward/backward (kiln/kernels/cuda/softmax.cu) and the fused softmax + cross-entropy
// (kiln/kernels/cuda/xent.cu) at GPT-2 vocabulary shapes ([1024 or 8192 tokens, 50257]) in f32
// and bf16, against the composites it replaced, measured in the same run:
//   - "composite": log_softmax + nll_loss, what cross_entropy computed before (nll_loss range-
//     checks the targets with item(), one host synchronisation per call);
//   - "composite, no sync": log_softmax + gather + masked mean, the same math without the sync.
// GB/s counts the minimal traffic of the fused kernels: softmax forward reads x and writes y,
// softmax backward reads g and y and writes dx, cross-entropy forward reads the logits once,
// forward+backward reads them twice and writes dx. The ceiling is the device copy bandwidth.
// Every GPU result is validated against the CPU backend (on the first 64 rows; every row runs
// the same code) before timing.
#include <cstdio>
#include <functional>
#include <string>

#include "cuda_bench_util.h"
#include "kiln/kernels/copy_fill.h"
#include "kiln/kernels/matmul.h"
#include "kiln/kernels/pointwise.h"
#include "kiln/kernels/reduce.h"
#include "kiln/kernels/softmax.h"

namespace {

namespace gpu = kiln::bench::gpu;
using gpu::kGpu;
using kiln::DType;
using kiln::Reduction;
using kiln::Tensor;
constexpr int64_t kVocab = 50257;

double excess_error(const Tensor& gpu_out, const Tensor& cpu_out, double rtol) {
  kiln::NoGradGuard ng;
  Tensor c = cpu_out.detach().to(DType::F64), g = gpu_out.detach().cpu().to(DType::F64);
  const double scale = c.abs().max().item<double>();
  return ((g - c).abs() - c.abs() * rtol).max().item<double>() / (scale + 1e-30);
}

Tensor composite_sync(const Tensor& x, const Tensor& t) {
  Tensor logp = kiln::log_softmax(x, 1);
  Tensor nll = kiln::nll_loss(logp, t, -100, Reduction::None);
  Tensor valid = (t != -100.0).to(nll.dtype());
  return nll.sum() / valid.sum();
}

Tensor composite_nosync(const Tensor& x, const Tensor& t) {
  Tensor logp = kiln::log_softmax(x, 1);
  Tensor valid = t != -100.0;
  Tensor safe = kiln::where(valid, t, kiln::zeros({}, t.options()));
  Tensor validf = valid.to(logp.dtype());
  Tensor nll = -kiln::gather(logp, 1, safe.unsqueeze(1)).squeeze(1) * validf;
  return nll.sum() / validf.sum();
}

Tensor fused(const Tensor& x, const Tensor& t) { return kiln::cross_entropy(x, t); }

using LossFn = Tensor (*)(const Tensor&, const Tensor&);

// Loss and, when `backward`, the logits' gradient.
std::pair<Tensor, Tensor> step(LossFn f, const Tensor& x0, const Tensor& t, bool backward) {
  if (!backward) {
    kiln::NoGradGuard ng;
    return {f(x0, t), Tensor()};
  }
  Tensor x = x0.detach().requires_grad_(true);
  Tensor l = f(x, t);
  l.backward();
  return {l.detach(), x.grad()};
}

void print_row(const std::string& name, double ms, double bytes, double ceiling, double ratio) {
  const double bw = gpu::gbs(bytes, ms);
  std::printf("%-58s %8.3f ms %8.1f GB/s %6.1f%% of copy", name.c_str(), ms, bw, 100.0 * bw / ceiling);
  if (ratio > 0) std::printf("  %5.2fx vs fused", ratio);
  std::printf("\n");
}

void softmax_rows(int64_t R, DType dt, double ceiling) {
  const std::string shape = "[" + std::to_string(R) + ", 50257] " + kiln::dtype_name(dt);
  const double tol = dt == DType::F32 ? 1e-5 : 2e-2;
  Tensor xc = (kiln::randn({64, kVocab}) * 3.0).to(dt);
  Tensor gc = kiln::randn({64, kVocab}).to(dt);
  {
    Tensor yc = kiln::softmax(xc, -1), yg = kiln::softmax(xc.to(kGpu), -1);
    double e = excess_error(yg, yc, tol);
    kiln::bench::validate(e <= tol, ("softmax " + shape).c_str(), e);
    Tensor dc = kiln::empty(yc.sizes(), dt), dg = kiln::empty(yc.sizes(), kiln::TensorOptions().dtype(dt).device(kGpu));
    kiln::kernels::softmax_backward(dc, gc, yc, false);
    kiln::kernels::softmax_backward(dg, gc.to(kGpu), yc.to(kGpu), false);
    e = excess_error(dg, dc, tol);
    kiln::bench::validate(e <= tol, ("softmax backward " + shape).c_str(), e);
  }
  Tensor x = (kiln::randn({R, kVocab}, kiln::TensorOptions().device(kGpu)) * 3.0).to(dt);
  Tensor g = kiln::randn({R, kVocab}, kiln::TensorOptions().device(kGpu)).to(dt);
  Tensor y = kiln::softmax(x, -1);
  Tensor dx = kiln::empty(y.sizes(), y.options());
  const double bytes = static_cast<double>(x.nbytes());
  const double t_fwd = gpu::time_ms([&] { kiln::softmax(x, -1); });
  const double t_bwd = gpu::time_ms([&] { kiln::kernels::softmax_backward(dx, g, y, false); });
  print_row("softmax forward " + shape, t_fwd, 2 * bytes, ceiling, 0);
  print_row("softmax backward " + shape, t_bwd, 3 * bytes, ceiling, 0);
  gpu::record("softmax_xent", "softmax forward " + shape, "kiln", t_fwd, gpu::bytes(2 * bytes));
  gpu::record("softmax_xent", "softmax backward " + shape, "kiln", t_bwd, gpu::bytes(3 * bytes));
}

void xent_rows(int64_t R, DType dt, double ceiling) {
  const std::string shape = "[" + std::to_string(R) + ", 50257] " + kiln::dtype_name(dt);
  const double tol = dt == DType::F32 ? 1e-5 : 2e-2;
  // validation: the GPU against the CPU, fused and composites, 64 rows
  {
    Tensor xc = (kiln::randn({64, kVocab}) * 3.0).to(dt);
    Tensor tc = kiln::randint(0, kVocab, {64});
    auto ref = step(fused, xc, tc, true);
    for (LossFn f : {fused, composite_sync, composite_nosync}) {
      auto got = step(f, xc.to(kGpu), tc.to(kGpu), true);
      double e = std::max(excess_error(got.first, ref.first, tol), excess_error(got.second, ref.second, tol));
      kiln::bench::validate(e <= tol, ("cross_entropy " + shape).c_str(), e);
    }
  }
  Tensor x = (kiln::randn({R, kVocab}, kiln::TensorOptions().device(kGpu)) * 3.0).to(dt);
  Tensor t = kiln::randint(0, kVocab, {R}).to(kGpu);
  const double bytes = static_cast<double>(x.nbytes());
  for (bool backward : {false, true}) {
    const char* what = backward ? " fwd+bwd " : " forward ";
    const double tf = gpu::time_ms([&] { step(fused, x, t, backward); }, 10, 5);
    const double ts = gpu::time_ms([&] { step(composite_sync, x, t, backward); }, 10, 5);
    const double tn = gpu::time_ms([&] { step(composite_nosync, x, t, backward); }, 10, 5);
    const double b = backward ? 3 * bytes : bytes;
    print_row(std::string("cross_entropy fused") + what + shape, tf, b, ceiling, 0);
    print_row(std::string("  composite (log_softmax + nll_loss)") + what, ts, b, ceiling, ts / tf);
    print_row(std::string("  composite, no sync") + what, tn, b, ceiling, tn / tf);
    // recorded as "cross_entropy forward [1024, 50257] float32" / "cross_entropy fwd+bwd ..."
    const std::string rec = std::string("cross_entropy") + what + shape;
    gpu::record("softmax_xent", rec, "kiln", tf, gpu::bytes(b));
    gpu::record("softmax_xent", rec, "composite log_softmax+nll_loss", ts, gpu::bytes(b));
    gpu::record("softmax_xent", rec, "composite, no sync", tn, gpu::bytes(b));
  }
}

}  // namespace

int main() {
  gpu::start("bench_cuda_softmax_xent");
  const double ceiling = gpu::copy_bandwidth_gbs(size_t{256} << 20);
  std::printf("device copy bandwidth (256 MiB, read + write): %.1f GB/s\n", ceiling);
  std::printf("GB/s: the fused kernels' minimal traffic (the composites move more for the same result)\n");
  for (DType dt : {DType::F32, DType::BF16}) {
    for (int64_t R : {1024, 8192}) softmax_rows(R, dt, ceiling);
  }
  for (DType dt : {DType::F32, DType::BF16}) {
    for (int64_t R : {1024, 8192}) xent_rows(R, dt, ceiling);
  }
  return 0;
}
