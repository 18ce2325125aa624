#pragma once
// Helpers shared by the GPU bench programs (bench/cuda): skip without a device, time with CUDA
// events on the current stream, and measure the device-to-device copy ceiling that memory-bound
// kernels are reported against. Benches validate against the CPU reference before timing and
// never assert timings. Each timed variant is also recorded as one JSON line (record(), below) for
// bench/cuda/compare.py, which sets kiln beside its in-run peers and PyTorch (pytorch_peer.py).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <kiln/kiln.h>
#include "kiln/core/escape.h"

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

inline cudaStream_t current_stream() { return static_cast<cudaStream_t>(kiln::cuda::current_stream().handle); }

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

// The work a recorded row did, for compare.py's GB/s (bytes: the traffic the bench counts) or
// TFLOP/s (flops); zero: not reported.
struct Work {
  double bytes = 0, flops = 0;
};
inline Work bytes(double b) { return {b, 0}; }
inline Work flops(double f) { return {0, f}; }

namespace detail {
inline std::string json_string(const std::string& s) { return "\"" + kiln::detail::json_escape(s) + "\""; }

inline std::string json_number(double v, int digits) {
  if (!std::isfinite(v)) return "null";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

inline const std::string& device_name() {
  static const std::string name = [] {
    int dev = 0;
    cudaDeviceProp prop{};
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess)
      return std::string("?");
    return std::string(prop.name);
  }();
  return name;
}
}  // namespace detail

// Appends one result row as a JSON line to the file named by $KILN_BENCH_JSON (nothing when it is
// unset or empty):
//   {"bench": "matmul", "case": "square bfloat16 [4096x4096] @ [4096x4096]", "impl": "kiln",
//    "ms": 1.23, "flops": 1.37e+11, "gpu": "NVIDIA H100 80GB HBM3"}
// bench: the program without its bench_cuda_ prefix; case: a name pytorch_peer.py reproduces
// exactly; impl: "kiln" for kiln's version, the peer's name for each in-run peer. The printed
// tables stay the human-readable output; these rows only feed compare.py.
inline void record(const std::string& bench, const std::string& case_name, const std::string& impl, double ms,
                   Work work = {}) {
  const char* path = std::getenv("KILN_BENCH_JSON");
  if (path == nullptr || *path == '\0') return;
  std::string line = "{\"bench\": " + detail::json_string(bench) + ", \"case\": " + detail::json_string(case_name) +
                     ", \"impl\": " + detail::json_string(impl) + ", \"ms\": " + detail::json_number(ms, 7);
  if (work.bytes > 0) line += ", \"bytes\": " + detail::json_number(work.bytes, 15);
  if (work.flops > 0) line += ", \"flops\": " + detail::json_number(work.flops, 15);
  line += ", \"gpu\": " + detail::json_string(detail::device_name()) + "}\n";
  std::FILE* f = std::fopen(path, "a");
  if (f == nullptr) {
    static bool warned = false;
    if (!warned) std::fprintf(stderr, "KILN_BENCH_JSON: cannot open %s for appending; rows not recorded\n", path);
    warned = true;
    return;
  }
  std::fputs(line.c_str(), f);
  std::fclose(f);
}

// Device-to-device copy bandwidth in GB/s (bytes read + written) for a buffer of `bytes`: the
// ceiling memory-bound kernels are compared with, measured in the same run. Recorded as bench
// "copy", case "device copy <MiB> MiB", impl "cudaMemcpyAsync" (compare.py's ceiling).
inline double copy_bandwidth_gbs(size_t bytes) {
  void *src = nullptr, *dst = nullptr;
  check(cudaMalloc(&src, bytes), "cudaMalloc");
  check(cudaMalloc(&dst, bytes), "cudaMalloc");
  check(cudaMemset(src, 1, bytes), "cudaMemset");
  cudaStream_t s = current_stream();
  double ms = time_ms([&] { check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s), "copy"); });
  cudaFree(src);
  cudaFree(dst);
  char name[64];
  std::snprintf(name, sizeof name, "device copy %g MiB", static_cast<double>(bytes) / 1048576.0);
  record("copy", name, "cudaMemcpyAsync", ms, Work{2.0 * static_cast<double>(bytes), 0});
  return 2.0 * bytes / (ms * 1e-3) / 1e9;
}

// The device the benches run on.
inline const kiln::Device kGpu = kiln::Device::cuda(0);

inline double gbs(double bytes, double ms) { return bytes / (ms * 1e-3) / 1e9; }

// A bench's opening: exits 77 without a device, seeds kiln's generator with 0 and returns the
// properties of device 0.
inline cudaDeviceProp start(const char* bench_name) {
  require_gpu(bench_name);
  kiln::manual_seed(0);
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  return prop;
}

// One row of a fused kernel against its peer (`peer`: "unfused", "composite"): time, GB/s and % of
// copy bandwidth printed under `name` (a column `width` wide), both timings recorded under bench
// and case_name with impl "kiln" and `peer`. bytes: the fused kernel's minimal traffic.
inline void fused_row(const char* bench, int width, const char* peer, const std::string& name,
                      const std::string& case_name, double fused_ms, double peer_ms, double bytes, double copy_gbs) {
  const double gf = gbs(bytes, fused_ms), gp = gbs(bytes, peer_ms);
  std::printf("%-*s fused %8.3f ms %7.0f GB/s (%3.0f%% of copy) | %s %8.3f ms %7.0f GB/s | %5.2fx\n", width,
              name.c_str(), fused_ms, gf, 100.0 * gf / copy_gbs, peer, peer_ms, gp, peer_ms / fused_ms);
  record(bench, case_name, "kiln", fused_ms, gpu::bytes(bytes));
  record(bench, case_name, peer, peer_ms, gpu::bytes(bytes));
}

}  // namespace kiln::bench::gpu
