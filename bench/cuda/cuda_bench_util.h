#pragma once
// Helpers shared by the GPU bench programs (bench/cuda): skip without a device, time with CUDA
// events on the current stream, and measure the device-to-device copy ceiling that memory-bound
// kernels are reported against. Benches validate against the CPU reference before timing and
// never assert timings.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include <kiln/kiln.h>

#include "../bench_util.h"

namespace kiln::bench::gpu {

// Exits with CTest's skip code when there is no device, so the GPU suite can run every bench.
inline void require_gpu(const char* bench_name) {
  if (!kiln::cuda::is_available()) {
    std::printf("%s: no CUDA device, skipping\n", bench_name);
    std::exit(77);
  }
}

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "CUDA error in %s: %s\n", what, cudaGetErrorString(e));
    std::exit(2);
  }
}

inline cudaStream_t current_stream() {
  return static_cast<cudaStream_t>(kiln::cuda::current_stream().handle);
}

// Median milliseconds per call of fn, timed with events around `inner` back-to-back calls on the
// current stream (amortises the event overhead for microsecond kernels).
inline double time_ms(const std::function<void()>& fn, int reps = 20, int inner = 10, int warmup = 3) {
  cudaStream_t s = current_stream();
  for (int i = 0; i < warmup; ++i) fn();
  check(cudaStreamSynchronize(s), "warmup");
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    check(cudaEventRecord(a, s), "cudaEventRecord");
    for (int i = 0; i < inner; ++i) fn();
    check(cudaEventRecord(b, s), "cudaEventRecord");
    check(cudaEventSynchronize(b), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
    t.push_back(ms / inner);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Device-to-device copy bandwidth in GB/s (bytes read + written) for a buffer of `bytes`: the
// ceiling memory-bound kernels are compared with, measured in the same run.
inline double copy_bandwidth_gbs(size_t bytes) {
  void *src = nullptr, *dst = nullptr;
  check(cudaMalloc(&src, bytes), "cudaMalloc");
  check(cudaMalloc(&dst, bytes), "cudaMalloc");
  check(cudaMemset(src, 1, bytes), "cudaMemset");
  cudaStream_t s = current_stream();
  double ms = time_ms([&] { check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s), "copy"); });
  cudaFree(src);
  cudaFree(dst);
  return 2.0 * bytes / (ms * 1e-3) / 1e9;
}

inline double gbs(double bytes, double ms) { return bytes / (ms * 1e-3) / 1e9; }

}  // namespace kiln::bench::gpu
