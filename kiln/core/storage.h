#pragma once
// Storage: one allocation (or one borrowed buffer) that tensors view into.
#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>

#include "kiln/core/device.h"

namespace kiln {

// Allocators hand out raw device or host memory. Each backend registers one per device type;
// the CUDA backend also provides a pinned (page-locked) host allocator.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* ptr) = 0;
};

Allocator* cpu_allocator();  // 64-byte aligned host memory, large blocks cached
void empty_cpu_cache();      // returns cached host blocks to the system
size_t cpu_cached_bytes();
// Bytes of host memory held by live CPU tensors (the allocator's usable sizes), and the peak since
// start or the last reset: what activation checkpointing saves on the CPU is visible here.
struct CpuMemoryStats {
  size_t allocated_bytes = 0;
  size_t peak_allocated_bytes = 0;
  size_t cached_bytes = 0;  // freed large blocks kept for reuse
};
CpuMemoryStats cpu_memory_stats();
void reset_cpu_peak_memory();
// Caps the bytes live CPU tensors may hold (0: no cap, the default). An allocation past it throws
// kiln::OutOfMemoryError naming the cap, as a device that ran out would; kiln-train's
// --memory-fraction sets it on the CPU. Like cuda::set_per_process_memory_fraction on a GPU.
void set_cpu_memory_limit(size_t bytes);
size_t cpu_memory_limit();
Allocator* allocator_for(Device device);  // CPU or the current backend's device allocator
Allocator* pinned_allocator();            // page-locked host memory; CPU allocator without CUDA
void register_allocator(DeviceType type, Allocator* a);
void register_pinned_allocator(Allocator* a);

class Storage {
 public:
  using Deleter = std::function<void(void*)>;
  // Allocates nbytes on `device` with `alloc`.
  Storage(size_t nbytes, Device device, Allocator* alloc);
  // Wraps memory someone else owns (zero-copy). `deleter` runs when the last view dies; it may be
  // empty when the caller keeps ownership.
  Storage(void* data, size_t nbytes, Device device, Deleter deleter);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  bool is_pinned() const { return pinned_; }

  // Bumped by every in-place write. Shared by all views of this storage so autograd can detect
  // a tensor that was modified after being saved for backward.
  uint64_t version() const { return version_.load(std::memory_order_relaxed); }
  void bump_version() { version_.fetch_add(1, std::memory_order_relaxed); }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  Allocator* alloc_ = nullptr;
  Deleter deleter_;
  bool pinned_ = false;
  std::atomic<uint64_t> version_{0};
};

}  // namespace kiln
