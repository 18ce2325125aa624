// Host-to-device copies of 1..256 MiB: kiln's Tensor::to(cuda, non_blocking) from pinned memory
// (Tensor::pin_memory(), the pinned caching allocator) and from pageable memory, against raw
// cudaMemcpyAsync from a cudaHostAlloc buffer and cudaMemcpy from a malloc'd one, measured in the
// same run. Pinned copies are asynchronous DMA at PCIe/NVLink-C2C speed; pageable ones are staged
// by the driver through its own pinned buffer (and block the host).
// Every copy is validated by copying it back and comparing the bytes before timing.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_bench_util.h"

namespace {

using kiln::Tensor;
namespace gpu = kiln::bench::gpu;

const kiln::Device kGpu = kiln::Device::cuda(0);

bool same_bytes(const Tensor& dev, const void* host, size_t n) {
  Tensor back = dev.cpu();
  return std::memcmp(back.data_ptr(), host, n) == 0;
}

}  // namespace

int main() {
  gpu::start("bench_cuda_transfer");
  cudaStream_t s = gpu::current_stream();
  std::printf("host -> device; GB/s = bytes copied per second; ratios: kiln / raw CUDA on the same kind of memory\n");
  std::printf("%8s | %12s %12s %6s | %12s %12s %6s | %s\n", "MiB", "kiln pinned", "raw pinned", "ratio",
              "kiln pageable", "raw pageable", "ratio", "pinned / pageable (kiln)");
  for (size_t mib : {1, 4, 16, 64, 256}) {
    const size_t bytes = mib << 20;
    const int64_t n = static_cast<int64_t>(bytes / 4);
    Tensor pageable = kiln::randn({n});
    Tensor pinned = pageable.pin_memory();
    if (!pinned.is_pinned()) {
      std::fprintf(stderr, "pin_memory() did not return pinned memory\n");
      return 1;
    }
    // raw buffers with the same bytes
    void* raw_pinned = nullptr;
    void* raw_dev = nullptr;
    gpu::check(cudaHostAlloc(&raw_pinned, bytes, cudaHostAllocDefault), "cudaHostAlloc");
    gpu::check(cudaMalloc(&raw_dev, bytes), "cudaMalloc");
    std::vector<char> raw_pageable(bytes);
    std::memcpy(raw_pinned, pageable.data_ptr(), bytes);
    std::memcpy(raw_pageable.data(), pageable.data_ptr(), bytes);

    // validation
    {
      Tensor a = pinned.to(kGpu, true);
      kiln::cuda::synchronize();
      kiln::bench::validate(same_bytes(a, pageable.data_ptr(), bytes), "kiln pinned copy", 1);
      Tensor b = pageable.to(kGpu, true);  // non_blocking has no effect on pageable memory
      kiln::bench::validate(same_bytes(b, pageable.data_ptr(), bytes), "kiln pageable copy", 1);
      gpu::check(cudaMemcpyAsync(raw_dev, raw_pinned, bytes, cudaMemcpyHostToDevice, s), "copy");
      gpu::check(cudaStreamSynchronize(s), "sync");
      std::vector<char> back(bytes);
      gpu::check(cudaMemcpy(back.data(), raw_dev, bytes, cudaMemcpyDeviceToHost), "copy back");
      kiln::bench::validate(std::memcmp(back.data(), raw_pinned, bytes) == 0, "raw pinned copy", 1);
    }

    const int reps = mib >= 64 ? 5 : 10, inner = mib >= 64 ? 2 : 5;
    const double t_kp = gpu::time_ms([&] { Tensor d = pinned.to(kGpu, true); }, reps, inner);
    const double t_rp = gpu::time_ms(
        [&] { gpu::check(cudaMemcpyAsync(raw_dev, raw_pinned, bytes, cudaMemcpyHostToDevice, s), "copy"); }, reps,
        inner);
    const double t_kg = gpu::time_ms([&] { Tensor d = pageable.to(kGpu, true); }, reps, inner);
    const double t_rg = gpu::time_ms(
        [&] { gpu::check(cudaMemcpy(raw_dev, raw_pageable.data(), bytes, cudaMemcpyHostToDevice), "copy"); }, reps,
        inner);
    const double b = static_cast<double>(bytes);
    std::printf("%8zu | %7.1f GB/s %7.1f GB/s %5.2fx | %8.1f GB/s %7.1f GB/s %5.2fx | %5.2fx\n", mib, gpu::gbs(b, t_kp),
                gpu::gbs(b, t_rp), t_rp / t_kp, gpu::gbs(b, t_kg), gpu::gbs(b, t_rg), t_rg / t_kg, t_kg / t_kp);
    // recorded as "host->device pinned 16 MiB" (kiln vs cudaMemcpyAsync from cudaHostAlloc memory)
    // and "host->device pageable 16 MiB" (kiln vs cudaMemcpy from malloc'd memory)
    const std::string sz = " " + std::to_string(mib) + " MiB";
    gpu::record("transfer", "host->device pinned" + sz, "kiln", t_kp, gpu::bytes(b));
    gpu::record("transfer", "host->device pinned" + sz, "cudaMemcpyAsync", t_rp, gpu::bytes(b));
    gpu::record("transfer", "host->device pageable" + sz, "kiln", t_kg, gpu::bytes(b));
    gpu::record("transfer", "host->device pageable" + sz, "cudaMemcpy", t_rg, gpu::bytes(b));
    gpu::check(cudaFreeHost(raw_pinned), "cudaFreeHost");
    gpu::check(cudaFree(raw_dev), "cudaFree");
  }
  return 0;
}
