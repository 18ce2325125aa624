#pragma once
// Small helpers shared by the bench programs: a median-of-runs timer, result validation and the
// composite references that fused kernels are validated and timed against (CPU and GPU benches).
// Benchmarks print numbers; they never assert timings (docs/kernels.md, "Benchmarks").
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include <kiln/kiln.h>

namespace kiln::bench {

// Median seconds per call of fn over `reps` timed repetitions after `warmup` untimed ones.
inline double time_median(const std::function<void()>& fn, int reps = 7, int warmup = 2) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto a = std::chrono::steady_clock::now();
    fn();
    auto b = std::chrono::steady_clock::now();
    t.push_back(std::chrono::duration<double>(b - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Exits non-zero when a benchmarked result is wrong: a fast wrong kernel is not a result.
inline void validate(bool ok, const char* what, double err) {
  if (!ok) {
    std::fprintf(stderr, "VALIDATION FAILED: %s (max error %g)\n", what, err);
    std::exit(1);
  }
}

// Largest |a - b| / (|b| + 1), computed in f64 on the CPU (a and b may be on any devices).
inline double max_rel_err(const Tensor& a, const Tensor& b) {
  NoGradGuard ng;
  Tensor x = a.detach().cpu().to(DType::F64), y = b.detach().cpu().to(DType::F64);
  return (kiln::abs(x - y) / (kiln::abs(y) + 1.0)).max().item<double>();
}

// Batch norm over the N, H, W dims of an NCHW tensor, in training mode, as a chain of kiln ops.
inline Tensor bn_composite(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  Tensor m = x.mean({0, 2, 3}, true);
  Tensor v = x.var({0, 2, 3}, 0, true);
  return (x - m) / kiln::sqrt(v + eps) * w.view({1, -1, 1, 1}) + b.view({1, -1, 1, 1});
}

// Layer norm over the last dim, as a chain of kiln ops.
inline Tensor ln_composite(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  Tensor m = x.mean({-1}, true);
  Tensor v = x.var({-1}, 0, true);
  return (x - m) / kiln::sqrt(v + eps) * w + b;
}

}  // namespace kiln::bench
