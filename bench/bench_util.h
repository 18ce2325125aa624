#pragma once
// Small helpers shared by the bench programs: a median-of-runs timer and output formatting.
// Benchmarks print numbers; they never assert timings (docs/kernels.md, "Benchmarks").
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

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

}  // namespace kiln::bench
