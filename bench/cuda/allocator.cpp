// kiln's caching device allocator (kiln/cuda/caching_allocator.h behind every CUDA tensor) against
// raw cudaMalloc/cudaFree, on a training-like mix: per step, a forward allocates activations of a
// small transformer-ish model (sizes from 512 B to 48 MiB, with temporaries freed right away),
// the backward frees them in reverse order while allocating and freeing gradients. Reported:
// allocations per second (alloc + free pairs) and the number of real cudaMalloc calls
// (kiln::cuda::memory_stats().num_backend_allocs): after the first step the cache serves
// everything, so steady-state steps make none.
// Validation before timing: the memory handed out is usable (written on the device and read
// back) and steady-state steps make no cudaMalloc call (exit 1 otherwise).
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda_bench_util.h"

namespace {

namespace gpu = kiln::bench::gpu;

// One training-like step's allocation sizes: for each of `layers` layers, the activations kept
// for backward (sizes[i]) and a temporary freed at once.
struct Mix {
  std::vector<size_t> keep;  // kept until backward
  std::vector<size_t> temp;  // allocated and freed during forward
  std::vector<size_t> grad;  // allocated and freed during backward
};

Mix training_mix() {
  Mix m;
  const size_t tokens = 4096, d = 768;
  for (int layer = 0; layer < 12; ++layer) {
    m.keep.push_back(tokens * d * 2);      // layer-norm output, bf16: 6 MiB
    m.keep.push_back(tokens * 4);          // per-token statistics: 16 KiB
    m.keep.push_back(tokens * 3 * d * 2);  // qkv: 18 MiB
    m.keep.push_back(tokens * 4 * d * 2);  // MLP hidden: 24 MiB
    m.keep.push_back(tokens * 4 * d * 2);  // GELU output: 24 MiB
    m.temp.push_back(tokens * d * 4);      // f32 residual temporary: 12 MiB
    m.temp.push_back(3 * d * 4);           // bias-sized scratch: 9 KiB
    m.temp.push_back(512);                 // scalars / flags
    m.grad.push_back(4 * d * d * 2);       // weight gradient: 4.5 MiB
    m.grad.push_back(4 * d * 4);           // bias gradient: 12 KiB
    m.grad.push_back(tokens * 4 * d * 2);  // activation gradient: 24 MiB
  }
  m.keep.push_back(tokens * 50304 * 2 / 8);  // a slice of logits: 48 MiB
  return m;
}

struct Api {
  void* (*alloc)(size_t);
  void (*free)(void*);
};

void* kiln_alloc(size_t n) { return kiln::allocator_for(kiln::Device::cuda(0))->allocate(n); }
void kiln_free(void* p) { kiln::allocator_for(kiln::Device::cuda(0))->deallocate(p); }
void* raw_alloc(size_t n) {
  void* p = nullptr;
  gpu::check(cudaMalloc(&p, n), "cudaMalloc");
  return p;
}
void raw_free(void* p) { gpu::check(cudaFree(p), "cudaFree"); }

// Runs one step; returns the number of alloc/free pairs.
size_t step(const Mix& m, const Api& api) {
  std::vector<void*> kept;
  size_t pairs = 0;
  for (size_t i = 0; i < m.keep.size(); ++i) {
    kept.push_back(api.alloc(m.keep[i]));
    if (i < m.temp.size()) {
      void* t = api.alloc(m.temp[i]);
      api.free(t);
      ++pairs;
    }
  }
  for (size_t i = kept.size(); i-- > 0;) {
    if (i < m.grad.size()) {
      void* g = api.alloc(m.grad[i]);
      api.free(g);
      ++pairs;
    }
    api.free(kept[i]);
    ++pairs;
  }
  return pairs;
}

double seconds_per_step(const Mix& m, const Api& api, int steps) {
  auto a = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) step(m, api);
  auto b = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(b - a).count() / steps;
}

}  // namespace

int main() {
  gpu::require_gpu("bench_cuda_allocator");
  const Mix m = training_mix();
  const Api kiln_api{kiln_alloc, kiln_free}, raw_api{raw_alloc, raw_free};

  // validation: the memory works, and the cache absorbs the steady state
  {
    void* p = kiln_alloc(size_t{1} << 20);
    gpu::check(cudaMemset(p, 0x5a, size_t{1} << 20), "cudaMemset");
    std::vector<unsigned char> back(size_t{1} << 20);
    gpu::check(cudaMemcpy(back.data(), p, back.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
    bool ok = true;
    for (unsigned char c : back) ok = ok && c == 0x5a;
    kiln_free(p);
    kiln::bench::validate(ok, "caching allocator memory is usable", 0);
  }
  kiln::cuda::empty_cache();
  const uint64_t before = kiln::cuda::memory_stats().num_backend_allocs;
  const size_t pairs = step(m, kiln_api);  // first step: fills the cache
  const uint64_t first = kiln::cuda::memory_stats().num_backend_allocs - before;
  for (int i = 0; i < 3; ++i) step(m, kiln_api);
  const uint64_t steady = kiln::cuda::memory_stats().num_backend_allocs - before - first;
  kiln::bench::validate(steady == 0, "no cudaMalloc in steady-state steps", static_cast<double>(steady));

  const int kiln_steps = 200, raw_steps = 5;
  const double tk = seconds_per_step(m, kiln_api, kiln_steps);
  const uint64_t after_timing = kiln::cuda::memory_stats().num_backend_allocs - before;
  const double tr = seconds_per_step(m, raw_api, raw_steps);
  std::printf("training-like mix: %zu alloc/free pairs per step, 512 B .. 48 MiB\n", pairs);
  std::printf("%-34s %10.1f us/step %12.0f allocs/s  cudaMalloc calls: %llu in the first step, %llu after\n",
              "kiln caching allocator", tk * 1e6, pairs / tk, static_cast<unsigned long long>(first),
              static_cast<unsigned long long>(after_timing - first));
  std::printf("%-34s %10.1f us/step %12.0f allocs/s  cudaMalloc calls: %zu per step\n", "raw cudaMalloc/cudaFree",
              tr * 1e6, pairs / tr, pairs);
  std::printf("ratio: %.1fx faster with the cache\n", tr / tk);
  const std::string mix = "training-like mix, " + std::to_string(pairs) + " alloc/free pairs per step";
  gpu::record("allocator", mix, "kiln", tk * 1e3);
  gpu::record("allocator", mix, "cudaMalloc/cudaFree", tr * 1e3);
  const kiln::AllocatorStats st = kiln::cuda::memory_stats();
  std::printf("reserved %.1f MiB in %zu segments, peak allocated %.1f MiB\n", st.reserved_bytes / 1048576.0,
              st.num_segments, st.peak_allocated_bytes / 1048576.0);
  return 0;
}
