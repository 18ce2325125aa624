// Attention on the CPU: the blocked online-softmax kernel behind
// F::scaled_dot_product_attention against the naive composition softmax(q k^T / sqrt(D) + mask) v
// of kiln ops, which materialises the T x T score matrix. Validated against each other.
#include <cmath>
#include <cstdio>

#include <kiln/kiln.h>

#include "../bench_util.h"

namespace F = kiln::nn::functional;
using kiln::Tensor;

namespace {
Tensor naive(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  const int64_t T = q.size(-2), D = q.size(-1);
  Tensor s = kiln::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(D)));
  if (causal) {
    Tensor i = kiln::arange(static_cast<double>(T), kiln::DType::I64);
    Tensor mask = i.view({T, 1}) < i.view({1, T});  // future positions
    s = kiln::where(mask, -INFINITY, s);
  }
  return kiln::matmul(kiln::softmax(s, -1), v);
}
}  // namespace

int main() {
  kiln::manual_seed(0);
  std::printf("%-28s %12s %12s %8s %14s %14s %8s\n", "shape [BH, T, D], causal", "fused fwd ms", "naive fwd ms",
              "ratio", "fused f+b ms", "naive f+b ms", "ratio");
  for (int64_t T : {256, 1024}) {
    const int64_t BH = 8, D = 64;
    Tensor q = kiln::randn({BH, T, D}), k = kiln::randn({BH, T, D}), v = kiln::randn({BH, T, D});
    Tensor a, b;
    {
      kiln::NoGradGuard ng;
      a = F::scaled_dot_product_attention(q, k, v, true);
      b = naive(q, k, v, true);
    }
    double err = kiln::abs(a - b).max().item<double>();
    kiln::bench::validate(err < 1e-4, "blocked attention vs naive", err);
    auto fwd = [&](bool fused) {
      kiln::NoGradGuard ng;
      return fused ? F::scaled_dot_product_attention(q, k, v, true) : naive(q, k, v, true);
    };
    auto fb = [&](bool fused) {
      Tensor qq = q.detach().requires_grad_(true), kk = k.detach().requires_grad_(true),
             vv = v.detach().requires_grad_(true);
      Tensor y = fused ? F::scaled_dot_product_attention(qq, kk, vv, true) : naive(qq, kk, vv, true);
      y.sum().backward();
    };
    double tf = kiln::bench::time_median([&] { fwd(true); }, 5, 1);
    double tn = kiln::bench::time_median([&] { fwd(false); }, 5, 1);
    double tfb = kiln::bench::time_median([&] { fb(true); }, 3, 1);
    double tnb = kiln::bench::time_median([&] { fb(false); }, 3, 1);
    char shape[64];
    std::snprintf(shape, sizeof shape, "[%lld, %lld, %lld], yes", (long long)BH, (long long)T, (long long)D);
    std::printf("%-28s %12.2f %12.2f %7.2fx %14.2f %14.2f %7.2fx\n", shape, tf * 1e3, tn * 1e3, tn / tf, tfb * 1e3,
                tnb * 1e3, tnb / tfb);
  }
  std::printf(
      "ratio = naive time / fused time; the naive version also holds the T x T scores (and their\n"
      "softmax, for backward) in memory: 8 x 1024 x 1024 x 4 B = 32 MiB per matrix at T = 1024\n");
  return 0;
}
