// Fused pointwise ops on the CPU against the unfused chains of kiln ops, measured in the same run
// (docs/guide.md, speed-up 18, on the CPU): the guide's GELU x * 0.5 * (1 + erf(x / 1.41421)) as one kernel
// vs its 5 ops; bias+GELU forward and forward+backward vs gelu(x + b); bias+dropout+residual vs
// r + dropout(x + b). Each fused result is validated against its chain before timing. GB/s
// counts the bytes the fused kernel must move (what a perfect kernel reads and writes).
#include <omp.h>

#include <cstdio>

#include <kiln/kiln.h>
#include <kiln/nn/functional.h>

#include "../bench_util.h"

namespace {

namespace F = kiln::nn::functional;
using kiln::Tensor;

double max_abs_diff(const Tensor& a, const Tensor& b) {
  return kiln::abs(a.to(kiln::DType::F64) - b.to(kiln::DType::F64)).max().item<double>();
}

void row(const char* name, double fused_s, double chain_s, double bytes) {
  std::printf("%-36s fused %8.2f ms %7.2f GB/s | unfused %8.2f ms | speed-up %5.2fx\n", name, fused_s * 1e3,
              bytes / fused_s / 1e9, chain_s * 1e3, chain_s / fused_s);
}

}  // namespace

int main() {
  kiln::manual_seed(0);
  const int64_t rows = 4096, cols = 3072;  // GPT-2 MLP hidden activations: 8 x 512 tokens x 3072
  const int64_t n = rows * cols;           // 12.6M floats = 48 MiB per tensor
  std::printf("threads: %d, tensors [%lld, %lld] f32 (%.0f MiB each)\n", omp_get_max_threads(), (long long)rows,
              (long long)cols, n * 4.0 / (1 << 20));
  Tensor x = kiln::randn({rows, cols}), b = kiln::randn({cols}), r = kiln::randn({rows, cols});
  const double fb = 4.0 * n;  // bytes of one f32 tensor

  {  // fused GELU vs the 5-op chain
    kiln::NoGradGuard ng;
    auto chain = [&] { return x * 0.5 * (1.0 + kiln::erf(x / 1.41421)); };
    kiln::bench::validate(max_abs_diff(F::fused_gelu(x), chain()) < 1e-5, "fused_gelu vs chain",
                          max_abs_diff(F::fused_gelu(x), chain()));
    double tf = kiln::bench::time_median([&] { F::fused_gelu(x); });
    double tc = kiln::bench::time_median([&] { chain(); });
    row("gelu (guide, 5 ops)", tf, tc, 2 * fb);
  }
  {  // bias + GELU forward
    kiln::NoGradGuard ng;
    for (const char* approx : {"none", "tanh"}) {
      double err = max_abs_diff(F::bias_gelu(x, b, approx), kiln::gelu(x + b, approx));
      kiln::bench::validate(err < 1e-5, "bias_gelu forward", err);
      double tf = kiln::bench::time_median([&] { F::bias_gelu(x, b, approx); });
      double tc = kiln::bench::time_median([&] { kiln::gelu(x + b, approx); });
      row(approx[0] == 'n' ? "bias+gelu forward" : "bias+gelu(tanh) forward", tf, tc, 2 * fb);
    }
  }
  {  // bias + GELU forward + backward (dx and dbias)
    Tensor xg = x.detach().requires_grad_(true), bg = b.detach().requires_grad_(true);
    Tensor g = kiln::randn({rows, cols});
    auto fused = [&] { return kiln::autograd::grad({F::bias_gelu(xg, bg)}, {xg, bg}, {g}); };
    auto chain = [&] { return kiln::autograd::grad({kiln::gelu(xg + bg)}, {xg, bg}, {g}); };
    auto a = fused(), c = chain();
    kiln::bench::validate(max_abs_diff(a[0], c[0]) < 1e-5, "bias_gelu dx", max_abs_diff(a[0], c[0]));
    kiln::bench::validate(max_abs_diff(a[1], c[1]) < 1e-2, "bias_gelu dbias", max_abs_diff(a[1], c[1]));
    double tf = kiln::bench::time_median([&] { fused(); });
    double tc = kiln::bench::time_median([&] { chain(); });
    row("bias+gelu forward+backward", tf, tc, 5 * fb);  // fwd: x, y; bwd: g, x, dx
  }
  {  // bias + dropout + residual, forward, training
    kiln::NoGradGuard ng;
    kiln::manual_seed(1);
    Tensor a = F::bias_dropout_add(x, b, r, 0.1, true);
    kiln::manual_seed(1);
    Tensor c = r + F::dropout(x + b, 0.1, true);
    kiln::bench::validate(max_abs_diff(a, c) < 1e-5, "bias_dropout_add vs chain", max_abs_diff(a, c));
    double tf = kiln::bench::time_median([&] { F::bias_dropout_add(x, b, r, 0.1, true); });
    double tc = kiln::bench::time_median([&] { r + F::dropout(x + b, 0.1, true); });
    row("bias+dropout+residual forward", tf, tc, 3 * fb);
  }
  return 0;
}
