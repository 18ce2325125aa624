// The CPU convolution lab: kiln's conv2d kernels (forward, input gradient, weight gradient) on
// every convolution shape of kiln-train's ResNet-18 (CIFAR stem, 28x28 input) and of the
// Fashion-MNIST CNN, in GFLOP/s and as a fraction of this machine's FMA peak measured in the same
// run. Each f32 result is validated against the f64 kernels (Eigen's GEMM) before its time counts.
// Prints a table, and with --json one JSON line per shape, which bench/cpu/conv_lab_pytorch.py
// reads to put PyTorch's time for the same shape beside it (docs/kernels.md, "The CPU GEMM").
//
// 3x3 stride-1 shapes, which the Winograd kernels compute (all three directions), are
// also timed and validated with it switched off (kiln::set_cpu_conv_winograd(false)): a second
// line gives the direct kernel's times, the speed-up and both kernels' errors; a third times
// both gradients in one call (conv2d_backward, as conv2d's backward runs them) against two.
//
// Usage: bench_conv_lab [--batch N] [--threads T] [--only SUBSTRING] [--json]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <kiln/kiln.h>
#include <kiln/kernels/conv.h>
#include <kiln/kernels/cpu/winograd.h>

#include "../bench_util.h"

using kiln::Tensor;
namespace K = kiln::kernels;

namespace {

struct Shape {
  std::string name;
  int64_t C, H, K, k, stride;
  int uses;         // how many times one training step of the model runs this convolution
  bool input_grad;  // whether training needs its input gradient (not for the images)
};

std::string format(const char* f, long long a, long long b = 0, long long c = 0) {
  char buf[96];
  std::snprintf(buf, sizeof(buf), f, a, b, c);
  return buf;
}

// Every convolution of ResNet-18 (CIFAR stem, 28x28 input, stages of two BasicBlocks) and of
// the CNN. Each stage after the first starts with a stride-2 3x3 and a stride-2 1x1 downsample;
// the stage's other 3x3 convolutions (three, four in the first stage) keep its plane size.
std::vector<Shape> shapes() {
  std::vector<Shape> v{{"resnet stem 1->64 28x28", 1, 28, 64, 3, 1, 1, false}};
  int64_t in = 64, h = 28;
  for (int s = 0; s < 4; ++s) {
    const int64_t planes = 64 << s;
    if (s > 0) {
      v.push_back({format("resnet layer%lld.0 %lld->%lld s2", s + 1, in, planes), in, h, planes, 3, 2, 1, true});
      v.push_back({format("resnet layer%lld downsample 1x1 s2", s + 1), in, h, planes, 1, 2, 1, true});
      h = (h - 1) / 2 + 1;
    }
    v.push_back({format("resnet layer%lld %lld %lldx", s + 1, planes, h) + std::to_string(h), planes, h, planes, 3, 1,
                 s == 0 ? 4 : 3, true});
    in = planes;
  }
  v.push_back({"cnn conv1 1->32 28x28", 1, 28, 32, 3, 1, 1, false});
  v.push_back({"cnn conv2 32->64 14x14", 32, 14, 64, 3, 1, 1, true});
  return v;
}

// Best of `reps` wall-clock runs after one warm-up: the least disturbed estimate on a shared VM.
double best_seconds(const std::function<void()>& fn, int reps) {
  fn();
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// f32 FMA throughput of all threads: 12 independent accumulator chains per thread, so neither
// the FMA latency nor memory limits it. 0 when the build has no AVX-512.
double measured_peak_gflops(int threads) {
#if defined(__AVX512F__)
  const int64_t iters = 20'000'000;
  double seconds = 0;
  float sink = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
  {
    __m512 acc[12];
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(1.0f + 1e-7f * static_cast<float>(i));
    const __m512 m = _mm512_set1_ps(0.9999999f), a = _mm512_set1_ps(1e-7f);
#pragma omp barrier
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t k = 0; k < iters; ++k)
#pragma GCC unroll 12
      for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], m, a);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
#pragma omp critical
    seconds = std::max(seconds, s);
    for (int i = 0; i < 12; ++i) sink += _mm512_reduce_add_ps(acc[i]);
  }
  if (sink == 12345.0f) std::printf(" ");  // keeps the loop from being optimised away
  return 2.0 * 16 * 12 * static_cast<double>(iters) * threads / seconds / 1e9;
#else
  (void)threads;
  return 0;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  int64_t batch = 128;
  int threads = omp_get_max_threads();
  bool json = false;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--batch") && i + 1 < argc) batch = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--json")) json = true;
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
    else {
      std::fprintf(stderr, "usage: %s [--batch N] [--threads T] [--only SUBSTRING] [--json]\n", argv[0]);
      return 2;
    }
  }
  kiln::set_num_threads(threads);
  kiln::manual_seed(0);
  const double peak = measured_peak_gflops(threads);
  if (!json)
    std::printf("conv lab: batch %lld, %d threads, measured f32 FMA peak %.0f GFLOP/s\n%-34s %22s %22s %22s\n",
                static_cast<long long>(batch), threads, peak, "shape", "forward", "input grad", "weight grad");
  for (const Shape& s : shapes()) {
    if (!only.empty() && s.name.find(only) == std::string::npos) continue;
    K::ConvGeometry g;
    g.N = batch, g.C = s.C, g.H = g.W = s.H, g.K = s.K, g.kh = g.kw = s.k, g.sh = g.sw = s.stride;
    g.ph = g.pw = s.k / 2;
    g.set_output_size();
    const Tensor x = kiln::randn({batch, s.C, s.H, s.H}), w = kiln::randn({s.K, s.C, s.k, s.k});
    const Tensor gy = kiln::randn({batch, s.K, g.OH, g.OW});
    Tensor y = kiln::empty({batch, s.K, g.OH, g.OW}), gx = kiln::empty_like(x), gw = kiln::empty_like(w);
    const double flops = 2.0 * batch * s.K * g.OH * g.OW * s.C * s.k * s.k;
    const bool wino = K::cpu::winograd_applies(g, kiln::DType::F32);
    // the f64 kernels (never Winograd) on the same inputs validate every f32 result
    const Tensor x64 = x.to(kiln::DType::F64), w64 = w.to(kiln::DType::F64), gy64 = gy.to(kiln::DType::F64);
    Tensor y64 = kiln::empty_like(gy64), gx64 = kiln::empty_like(x64), gw64 = kiln::empty_like(w64);
    K::conv2d_forward(y64, x64, w64, Tensor(), g);
    K::conv2d_backward_input(gx64, gy64, w64, g);
    K::conv2d_backward_weight(gw64, Tensor(), gy64, x64, g);
    // relative to the result's scale: sums of ~C*k*k (or N*OH*OW) unit-variance products
    auto scaled_err = [](const Tensor& a, const Tensor& ref) {
      const double scale = kiln::abs(ref).max().item<double>() + 1;
      return kiln::abs(a.to(kiln::DType::F64) - ref).max().item<double>() / scale;
    };
    // Winograd shapes: the direct kernel first (switch off), then the kernels as configured,
    // each validated right after it ran
    double td[3] = {0, 0, 0}, ed[3] = {0, 0, 0};
    if (wino) {
      kiln::set_cpu_conv_winograd(false);
      td[0] = best_seconds([&] { K::conv2d_forward(y, x, w, Tensor(), g); }, 5);
      td[1] = best_seconds([&] { K::conv2d_backward_input(gx, gy, w, g); }, 5);
      td[2] = best_seconds([&] { K::conv2d_backward_weight(gw, Tensor(), gy, x, g); }, 5);
      ed[0] = scaled_err(y, y64), ed[1] = scaled_err(gx, gx64), ed[2] = scaled_err(gw, gw64);
      kiln::set_cpu_conv_winograd(true);
    }
    const double t[3] = {best_seconds([&] { K::conv2d_forward(y, x, w, Tensor(), g); }, 5),
                         best_seconds([&] { K::conv2d_backward_input(gx, gy, w, g); }, 5),
                         best_seconds([&] { K::conv2d_backward_weight(gw, Tensor(), gy, x, g); }, 5)};
    const double e[3] = {scaled_err(y, y64), scaled_err(gx, gx64), scaled_err(gw, gw64)};
    for (int i = 0; i < 3; ++i) kiln::bench::validate(e[i] < 1e-4, s.name.c_str(), e[i]);
    // Winograd shapes: both gradients in one call (the output gradient transformed once, as
    // conv2d's backward runs them when both are wanted) against the two calls above
    double tboth = 0, eboth = 0;
    if (wino) {
      gx.zero_(), gw.zero_();
      tboth = best_seconds([&] { K::conv2d_backward(gx, gw, Tensor(), gy, x, w, g); }, 5);
      eboth = std::max(scaled_err(gx, gx64), scaled_err(gw, gw64));
      kiln::bench::validate(eboth < 1e-4, s.name.c_str(), eboth);
    }
    for (int i = 0; i < 3 && wino; ++i) kiln::bench::validate(ed[i] < 1e-4, s.name.c_str(), ed[i]);
    if (json) {
      std::printf(
          "{\"shape\":\"%s\",\"uses\":%d,\"input_grad\":%s,\"batch\":%lld,\"C\":%lld,\"H\":%lld,"
          "\"K\":%lld,\"k\":%lld,\"stride\":%lld,\"threads\":%d,\"peak_gflops\":%.1f,\"forward_s\":%.6g,"
          "\"input_grad_s\":%.6g,\"weight_grad_s\":%.6g,\"gflop\":%.6g,\"winograd\":%s,"
          "\"direct_forward_s\":%.6g,\"direct_input_grad_s\":%.6g,\"direct_weight_grad_s\":%.6g,"
          "\"both_grads_s\":%.6g}\n",
          s.name.c_str(), s.uses, s.input_grad ? "true" : "false", static_cast<long long>(batch),
          static_cast<long long>(s.C), static_cast<long long>(s.H), static_cast<long long>(s.K),
          static_cast<long long>(s.k), static_cast<long long>(s.stride), threads, peak, t[0], t[1], t[2], flops / 1e9,
          wino ? "true" : "false", td[0], td[1], td[2], tboth);
    } else {
      std::printf("%-34s", s.name.c_str());
      for (double ti : t)
        std::printf("  %7.2f ms %5.0f GF/s %3.0f%%", ti * 1e3, flops / ti / 1e9,
                    peak > 0 ? 100 * flops / ti / 1e9 / peak : 0.0);
      std::printf("\n");
      if (wino)
        std::printf(
            "  Winograd above; direct %.2f / %.2f / %.2f ms: speed-up %.2fx / %.2fx / %.2fx; max error "
            "%.1e / %.1e / %.1e, direct %.1e / %.1e / %.1e\n",
            td[0] * 1e3, td[1] * 1e3, td[2] * 1e3, td[0] / t[0], td[1] / t[1], td[2] / t[2], e[0], e[1], e[2], ed[0],
            ed[1], ed[2]);
      if (wino)
        std::printf("  both gradients in one call %.2f ms against %.2f ms in two: %.2fx; max error %.1e\n", tboth * 1e3,
                    (t[1] + t[2]) * 1e3, (t[1] + t[2]) / tboth, eboth);
    }
  }
  return 0;
}
