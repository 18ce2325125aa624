#include "kiln/core/storage.h"

#include <malloc.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

#include "kiln/cuda/cuda.h"
#include "kiln/core/error.h"
#include "kiln/core/profiler.h"

namespace kiln {

namespace {

// Host memory, 64-byte aligned. Large blocks (>= 1 MiB) are cached after free and handed out
// again for requests of up to the same size: glibc returns such blocks to the OS (munmap) and
// every new one page-faults on first touch, which costs more than the kernels that fill them.
class CachingCpuAllocator final : public Allocator {
 public:
  static constexpr size_t kCacheMin = size_t{1} << 20;
  static constexpr size_t kCacheLimit = size_t{1} << 30;  // bytes kept in the cache at most

  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    size_t rounded = (nbytes + 63) / 64 * 64;  // aligned_alloc needs a multiple of the alignment
    const size_t limit = limit_.load(), live = allocated_.load();
    if (limit && (rounded > limit || live > limit - rounded))
      KILN_FAIL_OUT_OF_MEMORY("out of memory on cpu: tried to allocate ", nbytes, " bytes; live tensors hold ", live,
                              " bytes of the ", limit, "-byte limit (set_cpu_memory_limit)");
    if (rounded >= kCacheMin) {
      rounded = (rounded + 65535) / 65536 * 65536;
      std::lock_guard<std::mutex> lock(mu_);
      // Reuse a cached block no more than 25% larger than asked for.
      auto it = free_.lower_bound(rounded);
      if (it != free_.end() && it->first <= rounded + rounded / 4) {
        void* p = it->second;
        live_[p] = it->first;
        cached_bytes_ -= it->first;
        count_alloc(it->first);
        free_.erase(it);
        return p;
      }
    }
    void* p = std::aligned_alloc(64, rounded);
    if (!p && rounded >= kCacheMin) {  // out of memory: give the cache back and retry once
      empty_cache();
      p = std::aligned_alloc(64, rounded);
    }
    if (!p)
      KILN_FAIL_OUT_OF_MEMORY("out of memory on cpu: the system could not allocate ", nbytes,
                              " bytes (live tensors hold ", allocated_.load(), " bytes)");
    if (rounded >= kCacheMin) {
      std::lock_guard<std::mutex> lock(mu_);
      live_[p] = rounded;
      count_alloc(rounded);
    } else {
      count_alloc(malloc_usable_size(p));
    }
    return p;
  }

  void deallocate(void* ptr) override {
    if (!ptr) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = live_.find(ptr);
      if (it != live_.end()) {
        size_t size = it->second;
        live_.erase(it);
        allocated_ -= size;
        if (cached_bytes_ + size <= kCacheLimit) {
          free_.emplace(size, ptr);
          cached_bytes_ += size;
          return;
        }
        std::free(ptr);
        return;
      }
    }
    allocated_ -= malloc_usable_size(ptr);
    std::free(ptr);
  }

  size_t allocated() const { return allocated_.load(); }
  void set_limit(size_t bytes) { limit_ = bytes; }
  size_t limit() const { return limit_.load(); }
  size_t peak() const { return peak_.load(); }
  void reset_peak() { peak_ = allocated_.load(); }

  void empty_cache() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [size, p] : free_) std::free(p);
    free_.clear();
    cached_bytes_ = 0;
  }

  size_t cached_bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    return cached_bytes_;
  }

 private:
  void count_alloc(size_t n) {
    size_t now = allocated_ += n;
    size_t p = peak_.load();
    while (now > p && !peak_.compare_exchange_weak(p, now)) {
    }
  }

  std::atomic<size_t> allocated_{0}, peak_{0}, limit_{0};
  std::mutex mu_;
  std::multimap<size_t, void*> free_;
  std::unordered_map<void*, size_t> live_;
  size_t cached_bytes_ = 0;
};

CachingCpuAllocator& cpu_caching_allocator() {
  static auto* a = new CachingCpuAllocator();  // never destroyed: storages may outlive statics
  return *a;
}

Allocator* g_allocators[2] = {nullptr, nullptr};
Allocator* g_pinned = nullptr;

}  // namespace

Allocator* cpu_allocator() { return &cpu_caching_allocator(); }

CpuMemoryStats cpu_memory_stats() {
  auto& a = cpu_caching_allocator();
  return CpuMemoryStats{a.allocated(), a.peak(), a.cached_bytes()};
}
void reset_cpu_peak_memory() { cpu_caching_allocator().reset_peak(); }
void set_cpu_memory_limit(size_t bytes) { cpu_caching_allocator().set_limit(bytes); }
size_t cpu_memory_limit() { return cpu_caching_allocator().limit(); }

void empty_cpu_cache() { cpu_caching_allocator().empty_cache(); }
size_t cpu_cached_bytes() { return cpu_caching_allocator().cached_bytes(); }

void register_allocator(DeviceType type, Allocator* a) { g_allocators[static_cast<int>(type)] = a; }
void register_pinned_allocator(Allocator* a) { g_pinned = a; }

Allocator* allocator_for(Device device) {
  if (device.is_cpu()) return cpu_allocator();
  Allocator* a = g_allocators[static_cast<int>(device.type)];
  KILN_CHECK(a != nullptr, "no allocator for device ", device,
             ": kiln was built without CUDA support (configure with -DKILN_CUDA=ON)");
  return a;
}

// Page-locked memory needs a working CUDA driver; without a device it is ordinary memory.
Allocator* pinned_allocator() { return g_pinned && cuda::is_available() ? g_pinned : cpu_allocator(); }

Storage::Storage(size_t nbytes, Device device, Allocator* alloc) : nbytes_(nbytes), device_(device), alloc_(alloc) {
  data_ = alloc_->allocate(nbytes);
  pinned_ = device.is_cpu() && alloc == g_pinned && g_pinned != nullptr;
  profiler::detail::record_memory(static_cast<int64_t>(nbytes), device);
}

Storage::Storage(void* data, size_t nbytes, Device device, Deleter deleter)
    : data_(data), nbytes_(nbytes), device_(device), deleter_(std::move(deleter)) {}

Storage::~Storage() {
  if (alloc_) {
    if (data_) profiler::detail::record_memory(-static_cast<int64_t>(nbytes_), device_);
    if (data_) alloc_->deallocate(data_);
  } else if (deleter_) {
    deleter_(data_);
  }
}

}  // namespace kiln
