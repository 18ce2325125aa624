// Fused softmax + cross-entropy (kiln/kernels/cpu/xent.cpp behind kiln::cross_entropy) against
// the composite it replaced: log_softmax, nll_loss (with its target range check) and, with label
// smoothing, a mean over the log-probabilities; forward alone and forward+backward, f32, mean
// reduction, every 8th target ignored. Shapes: [128, 10] (an MNIST-sized classifier),
// [4096, 1000] (ImageNet classes), [1024, 50257] (GPT-2 vocabulary, 1024 tokens).
// GB/s counts the minimal traffic: forward reads the logits once; forward+backward reads them
// twice and writes dx once. Fused results are validated against the composite computed in f64
// (exit 1 on a mismatch) before timing.
#include <omp.h>

#include <cstdio>
#include <string>
#include <vector>

#include <kiln/kiln.h>

#include "../bench_util.h"

namespace {

using kiln::DType;
using kiln::Reduction;
using kiln::Tensor;

// The composite formula of cross_entropy before the fused kernel (kiln ops only).
Tensor composite(const Tensor& x, const Tensor& t, double e) {
  Tensor logp = kiln::log_softmax(x, 1);
  Tensor nll = kiln::nll_loss(logp, t, -100, Reduction::None);
  Tensor valid = (t != -100.0).to(nll.dtype());
  if (e == 0.0) return nll.sum() / valid.sum();
  Tensor smooth = -kiln::sum(logp, {1}, false) / static_cast<double>(x.size(1)) * valid;
  return (nll * (1.0 - e) + smooth * e).sum() / valid.sum();
}

Tensor fused(const Tensor& x, const Tensor& t, double e) { return kiln::cross_entropy(x, t, -100, e); }

double max_rel_err(const Tensor& a, const Tensor& b) {
  kiln::NoGradGuard ng;
  Tensor d = kiln::abs(a.detach().to(DType::F64) - b.detach().to(DType::F64));
  Tensor s = kiln::abs(b.detach().to(DType::F64)).max();
  return (d.max() / (s + 1e-30)).item<double>();
}

void row(const std::string& name, double tf, double tc, double bytes) {
  std::printf("%-44s fused %9.3f ms %7.2f GB/s | composite %9.3f ms %7.2f GB/s | %5.2fx\n", name.c_str(), tf * 1e3,
              bytes / tf / 1e9, tc * 1e3, bytes / tc / 1e9, tc / tf);
}

void run(int64_t R, int64_t C, double e) {
  const std::string shape = "[" + std::to_string(R) + ", " + std::to_string(C) + "]" +
                            (e > 0 ? " smoothing " + std::to_string(e).substr(0, 3) : "");
  Tensor x0 = kiln::randn({R, C}) * 2.0;
  Tensor t = kiln::randint(0, C, {R});
  {
    int64_t* p = t.data_ptr<int64_t>();
    for (int64_t i = 7; i < R; i += 8) p[i] = -100;
  }
  const double bytes = static_cast<double>(x0.nbytes());
  const int reps = R * C > (1 << 24) ? 5 : 15;
  {
    kiln::NoGradGuard ng;
    const double err = max_rel_err(fused(x0, t, e), composite(x0.to(DType::F64), t, e));
    kiln::bench::validate(err < 1e-5, ("forward " + shape).c_str(), err);
    const double tf = kiln::bench::time_median([&] { fused(x0, t, e); }, reps);
    const double tc = kiln::bench::time_median([&] { composite(x0, t, e); }, reps);
    row("cross_entropy " + shape + " forward", tf, tc, bytes);
  }
  Tensor x = x0.detach().requires_grad_(true);
  auto step = [&](Tensor (*f)(const Tensor&, const Tensor&, double)) {
    x.set_grad(Tensor());
    f(x, t, e).backward();
  };
  step(fused);
  Tensor gf = x.grad();
  // reference: the composite in f64 (the f32 composite itself is only ~1e-5 accurate here)
  Tensor x64 = x0.to(DType::F64).detach().requires_grad_(true);
  composite(x64, t, e).backward();
  const double err = max_rel_err(gf, x64.grad());
  kiln::bench::validate(err < 1e-5, ("backward " + shape).c_str(), err);
  const double tf = kiln::bench::time_median([&] { step(fused); }, reps);
  const double tc = kiln::bench::time_median([&] { step(composite); }, reps);
  row("cross_entropy " + shape + " fwd+bwd", tf, tc, 3 * bytes);
}

}  // namespace

int main() {
  kiln::manual_seed(0);
  std::printf("threads: %d (float32, mean reduction, every 8th target ignored)\n", omp_get_max_threads());
  run(128, 10, 0.0);
  run(4096, 1000, 0.0);
  run(4096, 1000, 0.1);
  run(1024, 50257, 0.0);
  return 0;
}
