// bench_training_utils: the training utilities of kiln::optim on the CPU, each fused version
// against the plain per-tensor loop a straightforward implementation runs, validated first:
//   1. loss-scaler unscale + inf check: one multi-tensor pass (kernels::unscale_and_check_) vs,
//      per gradient, g *= 1/scale then an isfinite() reduction;
//   2. clip_grad_norm: one multi-tensor norm + one multi-tensor scale vs per-tensor norms, their
//      norm, and a per-tensor multiply (torch.nn.utils.clip_grad_norm_'s foreach=False path);
//   3. activation checkpointing on GPT blocks: forward+backward time and the CPU allocator's peak
//      above the baseline, with and without checkpointing every block.
// Gradient lists have the shapes of ResNet-18 (11.7M parameters in 62 tensors).
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "../bench_util.h"
#include "../model_shapes.h"
#include "kiln/kernels/amp_kernels.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {

using kiln::bench::gpt2_124m_shapes;
using kiln::bench::resnet18_shapes;

double max_abs_diff(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, (a[i] - b[i]).abs().max().item<double>());
  return m;
}

void bench_unscale(const std::vector<IntList>& shapes) {
  NoGradGuard ng;
  std::vector<Tensor> g1, g2;
  int64_t numel = 0;
  for (const auto& s : shapes) {
    Tensor g = randn(s).mul_(1024.0);
    g1.push_back(g.clone());
    g2.push_back(g.clone());
    numel += g.numel();
  }
  Tensor inv = scalar_tensor(1.0 / 1024.0, DType::F32), found = zeros({}, TensorOptions().dtype(DType::F32));
  Tensor back = scalar_tensor(1024.0, DType::F32);
  auto fused = [&](const Tensor& s) { kernels::unscale_and_check_(g1, s, found); };
  auto loop = [&](double s) {
    bool bad = false;
    for (auto& g : g2) {
      g.mul_(s);
      bad = bad || kiln::isfinite(g).to(DType::F32).min().item<float>() < 1.0f;
    }
    return bad;
  };
  fused(inv);
  const bool bad = loop(1.0 / 1024.0);
  const double err = max_abs_diff(g1, g2);
  bench::validate(err == 0 && !bad && found.item<float>() == 0, "fused unscale vs per-tensor loop", err);
  // Each timed call scales by 1/1024 and back by 1024 (two passes), so repetitions never drift
  // into denormals, whose slow arithmetic would distort the comparison.
  const double tf = bench::time_median(
                        [&] {
                          fused(back);
                          fused(inv);
                        },
                        7, 1) /
                    2;
  const double tl = bench::time_median(
                        [&] {
                          loop(1024.0);
                          loop(1.0 / 1024.0);
                        },
                        7, 1) /
                    2;
  const double bytes = 8.0 * static_cast<double>(numel);  // read + write f32
  std::printf(
      "unscale + inf check  %3zu tensors %6.2fM | fused %7.2f ms %6.2f GB/s | per-tensor %7.2f ms %6.2f GB/s | %.2fx\n",
      shapes.size(), numel / 1e6, tf * 1e3, bytes / tf / 1e9, tl * 1e3, bytes / tl / 1e9, tl / tf);
}

void bench_clip(const std::vector<IntList>& shapes) {
  std::vector<Tensor> p1, p2;
  int64_t numel = 0;
  for (const auto& s : shapes) {
    Tensor g = randn(s);
    Tensor a = zeros(s).requires_grad_(), b = zeros(s).requires_grad_();
    a.set_grad(g.clone());
    b.set_grad(g.clone());
    p1.push_back(a);
    p2.push_back(b);
    numel += g.numel();
  }
  const double max_norm = 1.0;
  auto loop = [&] {
    NoGradGuard ng;
    std::vector<Tensor> norms;
    for (auto& p : p2) norms.push_back((p.grad() * p.grad()).sum().sqrt());
    Tensor total = stack(norms).pow(2.0).sum().sqrt();
    Tensor coef = (max_norm / (total + 1e-6)).clamp_max(1.0);
    for (auto& p : p2) p.mutable_grad().mul_(coef);
    return total;
  };
  Tensor n1 = optim::clip_grad_norm(p1, max_norm);
  Tensor n2 = loop();
  std::vector<Tensor> g1, g2;
  for (size_t i = 0; i < p1.size(); ++i) {
    g1.push_back(p1[i].grad());
    g2.push_back(p2[i].grad());
  }
  const double err =
      std::max(max_abs_diff(g1, g2), std::abs(n1.item<double>() - n2.item<double>()) / n2.item<double>());
  bench::validate(err < 1e-5, "fused clip_grad_norm vs per-tensor loop", err);
  const double tf = bench::time_median([&] { optim::clip_grad_norm(p1, max_norm); }, 7, 1);
  const double tl = bench::time_median([&] { loop(); }, 7, 1);
  const double bytes = 12.0 * static_cast<double>(numel);  // norm pass reads, scale pass reads + writes
  std::printf(
      "clip_grad_norm       %3zu tensors %6.2fM | fused %7.2f ms %6.2f GB/s | per-tensor %7.2f ms %6.2f GB/s | %.2fx\n",
      shapes.size(), numel / 1e6, tf * 1e3, bytes / tf / 1e9, tl * 1e3, bytes / tl / 1e9, tl / tf);
}

void bench_checkpointing() {
  nn::models::GPTConfig c;
  c.vocab_size(96).block_size(256).n_layer(6).n_head(4).n_embd(256).dropout(0.0);
  manual_seed(0);
  nn::models::GPT gpt(c);
  const int64_t B = 8, T = 256;
  Tensor idx = randint(0, c.vocab_size(), {B, T});
  Tensor target = randint(0, c.vocab_size(), {B * T});
  auto step = [&](bool ckpt) {
    Tensor pos = arange(static_cast<double>(T), DType::I64);
    Tensor x = gpt.wte(idx) + gpt.wpe(pos);
    for (const auto& blk : gpt.h) {
      if (ckpt) x = kiln::checkpoint([b = blk.get()](const std::vector<Tensor>& in) { return b->forward(in[0]); }, {x});
      else x = blk->forward(x);
    }
    Tensor logits = nn::functional::linear(gpt.ln_f(x), gpt.wte.weight);
    Tensor loss = nn::functional::cross_entropy(logits.reshape({-1, c.vocab_size()}), target);
    loss.backward();
    return loss.item<double>();
  };
  auto run = [&](bool ckpt, double* peak_mb) {
    gpt.zero_grad();
    reset_cpu_peak_memory();
    const size_t base = cpu_memory_stats().allocated_bytes;
    double l = step(ckpt);
    *peak_mb = static_cast<double>(cpu_memory_stats().peak_allocated_bytes - base) / 1e6;
    return l;
  };
  double peak_plain = 0, peak_ckpt = 0;
  const double l1 = run(false, &peak_plain);
  std::vector<Tensor> g_plain;
  for (auto& p : gpt.parameters()) g_plain.push_back(p.grad().clone());
  const double l2 = run(true, &peak_ckpt);
  std::vector<Tensor> g_ckpt;
  for (auto& p : gpt.parameters()) g_ckpt.push_back(p.grad());
  const double err = max_abs_diff(g_plain, g_ckpt);
  bench::validate(std::abs(l1 - l2) < 1e-6 && err < 1e-5, "checkpointed gradients equal plain ones", err);
  const double tp = bench::time_median(
      [&] {
        gpt.zero_grad();
        step(false);
      },
      3, 1);
  const double tc = bench::time_median(
      [&] {
        gpt.zero_grad();
        step(true);
      },
      3, 1);
  std::printf(
      "checkpointing GPT    %d blocks, d=%lld, B=%lld T=%lld | plain %7.1f ms peak %7.1f MB | checkpointed %7.1f ms "
      "peak %7.1f MB | "
      "memory %.2fx less, time %+.0f%%\n",
      static_cast<int>(c.n_layer()), static_cast<long long>(c.n_embd()), static_cast<long long>(B),
      static_cast<long long>(T), tp * 1e3, peak_plain, tc * 1e3, peak_ckpt, peak_plain / peak_ckpt,
      100.0 * (tc / tp - 1.0));
}

}  // namespace

int main() {
  std::printf("bench_training_utils: %d OpenMP threads, f32\n", omp_get_max_threads());
  const auto shapes = resnet18_shapes();
  bench_unscale(shapes);
  bench_clip(shapes);
  bench_checkpointing();
  return 0;
}
