#pragma once
// The CUDA runtime as the rest of kiln sees it. Every function exists whether or not kiln was
// built with CUDA; without it is_available() is false and the others throw a clear Error.
#include <cstddef>
#include <cstdint>
#include <string>

#include "kiln/cuda/caching_allocator.h"
#include "kiln/core/device.h"

namespace kiln::cuda {

bool is_available();                // built with CUDA and at least one device present
int device_count();                 // 0 without CUDA or without a device
bool built_with_cuda();             // compiled with KILN_CUDA on
void synchronize(int device = -1);  // -1: the current device
// Throws the kiln::Error that a kernel on `device` (-1: the current device) recorded since the
// last check, such as an out-of-range gather index (kernels check indices on the device and the
// error surfaces at the next synchronisation: synchronize(), item(), to(cpu), or this call).
// A small blocking read; nothing inside a CUDA graph capture. docs/kernels.md has the details.
void check_device_errors(int device = -1);
int current_device();
void set_device(int device);
// Throws unless `device` is a CUDA device that exists.
void check_device(Device device, const char* op);

// The stream kernels on `device` are queued on (the legacy default stream unless a guard set
// another).
Stream current_stream(int device = -1);
void set_current_stream(const Stream& s);

// RAII: makes `s` the current stream of its device.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& s);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream prev_;
};

// TF32 tensor-core math for f32 matmuls (off by default, like PyTorch's
// torch.backends.cuda.matmul.allow_tf32): ~10 bits of mantissa in the products, f32 accumulation.
void set_allow_tf32(bool allow);
bool allow_tf32();

// Byte copy between any two devices (host <-> device, device <-> device). Asynchronous on the
// current stream when `non_blocking` and the host side is pinned; otherwise it returns once
// the copy is complete.
void memcpy(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes, bool non_blocking);

// The caching device allocator (caching_allocator.h; one per device). `device` -1 is the current
// device. Without CUDA these throw, except empty_cache(), which has nothing to do.
void empty_cache();  // returns every fully free cached segment of every device to the driver
AllocatorStats memory_stats(int device = -1);
void reset_peak_memory_stats(int device = -1);
std::string memory_summary(int device = -1);  // multi-line text, also part of OOM errors
// Caps what this process's caching allocator may reserve on `device` at `fraction` (0, 1] of the
// device's total memory, as torch.cuda.set_per_process_memory_fraction: past it allocations fail
// with the out-of-memory error (a kiln::Error naming the cap), as if the device were that small.
// 1 lifts the cap.
void set_per_process_memory_fraction(double fraction, int device = -1);
// Records every allocation/free (with MemoryLabel labels) on all devices from now on.
void record_memory_history(bool enabled);
// The recorded history (oldest first); kiln/utils/memory_timeline.h writes it as a Chrome trace
// or an HTML timeline.
std::vector<MemoryEvent> memory_history(int device = -1);
// `data` (the start of a live CUDA allocation) is used on stream `s` too: after it is freed it
// is not reused until the work queued on `s` up to that point has finished.
void record_stream(void* data, const Stream& s);
// Pinned host memory (Tensor::pin_memory(), the data loader's staging buffers) is cached too.
// `data` (the start of a pinned allocation) is read or written by an asynchronous copy queued on
// `s`: once freed, it is reused only after that copy has finished. Copies through Tensor::copy_
// and to() call this themselves; a no-op for memory that is not from the pinned cache.
void record_host_use(void* data, const Stream& s);
void empty_host_cache();             // returns the cached pinned blocks to the driver
AllocatorStats host_memory_stats();  // the pinned cache's statistics (all zero without CUDA)
// Routes this thread's allocations on `device` to private pool `id` (CUDA-graph capture); its
// memory is reused by nothing else until release_private_pool(id).
void begin_private_pool(uint64_t id, int device = -1);
void end_private_pool(int device = -1);
void release_private_pool(uint64_t id, int device = -1);

}  // namespace kiln::cuda
