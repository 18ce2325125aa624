#pragma once
// The CUDA side of the kernel lab (docs/lab.md), for the standalone lab_*_cuda programs: every
// runtime call and every launch checked, a clean skip without a device, device buffers, timing
// with CUDA events, and the device's copy bandwidth as the peak of memory-bound kernels.
#include <cuda_runtime.h>

#include "lab.h"

// Every CUDA runtime call goes through CUDA_CHECK; every launch is followed by LAUNCH_CHECK (the
// launch's own errors, such as a bad configuration; a fault inside the kernel surfaces at the next
// synchronising call, which is checked as well).
#define CUDA_CHECK(call) ::lab::cuda_check((call), #call, __FILE__, __LINE__)
#define LAUNCH_CHECK() ::lab::cuda_check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

namespace lab {

inline void cuda_check(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s:%d: CUDA error in %s: %s\n", file, line, what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// The device's properties; without a usable device, says so and exits with code 77, which CTest
// reports as skipped (the GPU tests and benches do the same).
inline cudaDeviceProp require_device(const char* program) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    std::printf("%s: no CUDA device (%s), skipping\n", program,
                e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    std::exit(77);
  }
  CUDA_CHECK(cudaSetDevice(0));
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, %.0f GiB\n", prop.name, prop.multiProcessorCount,
              prop.totalGlobalMem / 1073741824.0);
  return prop;
}

// An array in device memory.
template <class T> class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) { CUDA_CHECK(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T))); }
  ~DeviceBuffer() { cudaFree(p_); }  // not checked: a destructor cannot report, and exit() is near
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }
  void upload(const T* host) { CUDA_CHECK(cudaMemcpy(p_, host, n_ * sizeof(T), cudaMemcpyHostToDevice)); }
  void download(T* host) const { CUDA_CHECK(cudaMemcpy(host, p_, n_ * sizeof(T), cudaMemcpyDeviceToHost)); }
  // Fills with a byte pattern: 0xFF makes every float a NaN, so an element a kernel forgets to
  // write fails the validation.
  void poison() { CUDA_CHECK(cudaMemset(p_, 0xFF, n_ * sizeof(T))); }

 private:
  T* p_ = nullptr;
  size_t n_;
};

// Milliseconds between two events around `inner` back-to-back calls of fn, divided by inner.
template <class F> double time_events_ms(F& fn, int inner, cudaEvent_t a, cudaEvent_t b) {
  CUDA_CHECK(cudaEventRecord(a));
  for (int i = 0; i < inner; ++i) fn();
  CUDA_CHECK(cudaEventRecord(b));
  CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  return ms / inner;
}

// GPU time per call of fn (which launches kernels on the default stream): o.warmup untimed calls,
// then up to o.repeats samples (fewer past o.budget_s). A sample times enough back-to-back calls
// to last about a millisecond, so the events' own cost does not count for microsecond kernels.
template <class F> Timing time_gpu(F&& fn, const Options& o) {
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < o.warmup; ++i) fn();
  CUDA_CHECK(cudaDeviceSynchronize());
  const double once = time_events_ms(fn, 1, a, b);
  const int inner = static_cast<int>(std::min(100.0, std::max(1.0, 1.0 / std::max(once, 1e-6))));
  std::vector<double> t;
  double total_s = 0;
  while (static_cast<int>(t.size()) < o.repeats && (t.empty() || total_s < o.budget_s)) {
    t.push_back(time_events_ms(fn, inner, a, b) / 1e3);
    total_s += t.back() * inner;
  }
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  return summarize(std::move(t));
}

// Device-to-device copy bandwidth: cudaMemcpy between two 512 MiB buffers (far beyond L2),
// read + write counted, the best of 10 copies: the ceiling of a kernel that streams memory.
inline double device_copy_gbs() {
  const size_t bytes = size_t(512) << 20;
  DeviceBuffer<char> src(bytes), dst(bytes);
  CUDA_CHECK(cudaMemset(src.data(), 1, bytes));
  CUDA_CHECK(cudaMemset(dst.data(), 0, bytes));
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  double best = 1e30;
  auto copy = [&] { CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice)); };
  for (int i = 0; i < 10; ++i) best = std::min(best, time_events_ms(copy, 1, a, b));
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  return 2.0 * bytes / (best / 1e3) / 1e9;
}

// Blocks of `threads` for n items (work items, or rows times threads per row).
inline unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

}  // namespace lab

// ---- device helpers shared by the kernels

// The sum of v over the 32 lanes of a warp, in every lane: five butterfly exchanges through
// registers, no shared memory and no __syncthreads.
__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// The sum of v over the whole block (blockDim.x a multiple of 32, at most 1024), in every thread:
// warp sums, then the first warp sums the per-warp results. `scratch`: 32 floats of shared
// memory; the call synchronises the block, so it must be reached by every thread.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0f;
  return warp_sum(v);
}
