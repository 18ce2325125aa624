#pragma once
// The CUDA runtime as the rest of kiln sees it. Every function exists whether or not kiln was
// built with CUDA; without it is_available() is false and the others throw a clear Error.
#include <cstddef>

#include "kiln/core/device.h"

namespace kiln::cuda {

bool is_available();     // built with CUDA and at least one device present
int device_count();      // 0 without CUDA or without a device
bool built_with_cuda();  // compiled with KILN_CUDA on
void synchronize(int device = -1);  // -1: the current device
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
void memcpy(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes,
            bool non_blocking);

}  // namespace kiln::cuda
