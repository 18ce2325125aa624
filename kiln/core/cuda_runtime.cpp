// The CUDA runtime glue: device queries, current streams, a plain device allocator and pinned
// host memory, byte copies. Compiled by the host compiler against cudart (no kernels here).
// Issue #3 replaces the plain allocator with the caching allocator.
#include "kiln/core/cuda.h"

#include <atomic>

#include "kiln/core/error.h"
#include "kiln/core/storage.h"
#include "kiln/config.h"

#if KILN_WITH_CUDA
#include <cuda_runtime.h>

#include "kiln/core/cuda_check.h"
#endif

namespace kiln::cuda {

bool built_with_cuda() { return KILN_WITH_CUDA != 0; }

namespace {
std::atomic<bool> g_allow_tf32{false};
}
void set_allow_tf32(bool allow) { g_allow_tf32 = allow; }
bool allow_tf32() { return g_allow_tf32; }

#if KILN_WITH_CUDA

namespace {

class CudaDeviceAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, nbytes);
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error state
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      KILN_FAIL("CUDA out of memory: tried to allocate ", nbytes, " bytes on cuda:",
                current_device(), " (", free_b, " bytes free of ", total_b, "): ",
                cudaGetErrorString(e));
    }
    return p;
  }
  // Never throws: it runs from destructors, also after the driver has shut down at exit.
  void deallocate(void* ptr) override { cudaFree(ptr); }
};

class PinnedHostAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    void* p = nullptr;
    KILN_CUDA_CHECK(cudaHostAlloc(&p, nbytes, cudaHostAllocDefault));
    return p;
  }
  void deallocate(void* ptr) override { cudaFreeHost(ptr); }
};

thread_local Stream t_current[16];

// Registers the CUDA allocators before main so allocator_for(cuda) finds them.
struct Registrar {
  Registrar() {
    static CudaDeviceAllocator device_alloc;
    static PinnedHostAllocator pinned_alloc;
    register_allocator(DeviceType::CUDA, &device_alloc);
    register_pinned_allocator(&pinned_alloc);
  }
} g_registrar;

}  // namespace

int device_count() {
  static int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();
      n = 0;
    }
    return n;
  }();
  return count;
}

bool is_available() { return device_count() > 0; }

void check_device(Device device, const char* op) {
  KILN_CHECK(device.is_cuda(), op, ": expected a CUDA device, got ", device);
  int n = device_count();
  KILN_CHECK(n > 0, op, ": no CUDA device is available (", device, " requested)");
  KILN_CHECK(device.index >= 0 && device.index < n, op, ": device ", device,
             " does not exist (", n, " CUDA devices)");
}

int current_device() {
  int d = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

void set_device(int device) {
  check_device(Device::cuda(device), "set_device");
  KILN_CUDA_CHECK(cudaSetDevice(device));
}

void synchronize(int device) {
  KILN_CHECK(is_available(), "cuda::synchronize: no CUDA device is available");
  if (device >= 0) set_device(device);
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
}

Stream current_stream(int device) {
  if (device < 0) device = current_device();
  KILN_CHECK(device < 16, "current_stream: device index ", device, " too large");
  Stream s = t_current[device];
  s.device = Device::cuda(device);
  return s;
}

void set_current_stream(const Stream& s) {
  KILN_CHECK(s.device.is_cuda() && s.device.index < 16, "set_current_stream: bad device ", s.device);
  t_current[s.device.index] = s;
}

void memcpy(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes,
            bool non_blocking) {
  if (nbytes == 0) return;
  cudaMemcpyKind kind = cudaMemcpyDefault;  // unified addressing tells the direction
  Device dev = dst_device.is_cuda() ? dst_device : src_device;
  cudaStream_t stream = static_cast<cudaStream_t>(current_stream(dev.index).handle);
  KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, kind, stream));
  if (!non_blocking) KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
}

#else  // !KILN_WITH_CUDA

namespace {
[[noreturn]] void no_cuda(const char* what) {
  KILN_FAIL(what, ": kiln was built without CUDA support (configure with -DKILN_CUDA=ON)");
}
}  // namespace

int device_count() { return 0; }
bool is_available() { return false; }
void check_device(Device device, const char* op) {
  KILN_FAIL(op, ": device ", device, " requested but kiln was built without CUDA support");
}
int current_device() { no_cuda("cuda::current_device"); }
void set_device(int) { no_cuda("cuda::set_device"); }
void synchronize(int) { no_cuda("cuda::synchronize"); }
Stream current_stream(int) { no_cuda("cuda::current_stream"); }
void set_current_stream(const Stream&) { no_cuda("cuda::set_current_stream"); }
void memcpy(void*, Device, const void*, Device, size_t, bool) { no_cuda("cuda::memcpy"); }

#endif

StreamGuard::StreamGuard(const Stream& s) : prev_(current_stream(s.device.index)) {
  set_current_stream(s);
}
StreamGuard::~StreamGuard() { set_current_stream(prev_); }

}  // namespace kiln::cuda
