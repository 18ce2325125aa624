// The CUDA runtime glue: device queries, current streams, a plain device allocator and pinned
// host memory, byte copies. Compiled by the host compiler against cudart (no kernels here).
// The device allocator is the caching allocator (caching_allocator.h), one per device.
#include "kiln/cuda/cuda.h"

#include <atomic>
#include <mutex>
#include <string>

#include "kiln/cuda/caching_allocator.h"
#include "kiln/cuda/device_error.h"
#include "kiln/cuda/stream.h"
#include "kiln/core/error.h"
#include "kiln/core/storage.h"
#include "kiln/core/sync_debug.h"
#include "kiln/config.h"

#if KILN_WITH_CUDA
#include <cuda_runtime.h>

#include "kiln/cuda/check.h"
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

// The caching allocator's view of one device: cudaMalloc/cudaFree and events, each run with
// that device current.
class CudaBackend final : public AllocatorBackend {
 public:
  explicit CudaBackend(int device) : device_(device) {}

  void* raw_alloc(size_t nbytes) override {
    DeviceSwitch sw(device_);
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, nbytes);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear the error so later calls do not report it
      return nullptr;
    }
    if (e != cudaSuccess) fail("cudaMalloc", e);
    return p;
  }
  // Never throws: it runs from destructors, also after the driver has shut down at exit.
  void raw_free(void* ptr) override {
    DeviceSwitch sw(device_, /*nothrow=*/true);
    if (cudaFree(ptr) != cudaSuccess) cudaGetLastError();
  }
  void synchronize_stream(void* stream) override {
    internal::report_sync("the caching allocator waits for a stream before reusing or releasing memory", false);
    KILN_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  }
  bool stream_done(void* stream) override {
    return query(cudaStreamQuery(static_cast<cudaStream_t>(stream)), "cudaStreamQuery");
  }
  void* record_event(void* stream) override {
    DeviceSwitch sw(device_);
    cudaEvent_t ev = nullptr;
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    KILN_CUDA_CHECK(cudaEventRecord(ev, static_cast<cudaStream_t>(stream)));
    return ev;
  }
  bool event_done(void* ev) override { return query(cudaEventQuery(static_cast<cudaEvent_t>(ev)), "cudaEventQuery"); }
  void synchronize_event(void* ev) override {
    internal::report_sync("the caching allocator waits for a cross-stream use before releasing memory", false);
    KILN_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(ev)));
  }
  void release_event(void* ev) override { cudaEventDestroy(static_cast<cudaEvent_t>(ev)); }
  std::string oom_details() override {
    DeviceSwitch sw(device_, /*nothrow=*/true);
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
      cudaGetLastError();
      return {};
    }
    return detail::concat("  device cuda:", device_, ": ", free_b, " bytes free of ", total_b);
  }

 private:
  // Makes `device` current for the scope.
  struct DeviceSwitch {
    DeviceSwitch(int device, bool nothrow = false) {
      if (cudaGetDevice(&prev) != cudaSuccess) {
        cudaGetLastError();
        prev = -1;
        return;
      }
      if (prev != device) {
        cudaError_t e = cudaSetDevice(device);
        if (e != cudaSuccess && !nothrow) fail("cudaSetDevice", e);
        if (e != cudaSuccess) cudaGetLastError();
      }
    }
    ~DeviceSwitch() {
      if (prev >= 0) cudaSetDevice(prev);
    }
    int prev = -1;
  };
  [[noreturn]] static void fail(const char* call, cudaError_t e) {
    cudaGetLastError();
    KILN_FAIL("CUDA error in ", call, ": ", cudaGetErrorName(e), ": ", cudaGetErrorString(e));
  }
  static bool query(cudaError_t e, const char* call) {
    if (e == cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    if (e != cudaSuccess) fail(call, e);
    return true;
  }
  int device_;
};

constexpr int kMaxDevices = 16;

// One CachingAllocator per device, created on first use and never destroyed (storages may
// outlive static destructors).
CachingAllocator* device_caching_allocator(int device) {
  static std::atomic<CachingAllocator*> allocs[kMaxDevices] = {};
  static std::mutex mu;
  KILN_CHECK(device >= 0 && device < kMaxDevices, "CUDA caching allocator: device index ", device, " out of range");
  CachingAllocator* a = allocs[device].load(std::memory_order_acquire);
  if (a) return a;
  std::lock_guard<std::mutex> lock(mu);
  a = allocs[device].load(std::memory_order_relaxed);
  if (!a) {
    a = new CachingAllocator(new CudaBackend(device), detail::concat("cuda:", device));
    allocs[device].store(a, std::memory_order_release);
  }
  return a;
}

// The allocator registered for DeviceType::CUDA: routes to the current device's caching
// allocator, on the current stream.
class CudaDeviceAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    int dev = current_device();
    return device_caching_allocator(dev)->allocate(nbytes, current_stream(dev).handle);
  }
  // Never throws: it runs from destructors.
  void deallocate(void* ptr) override {
    if (!ptr) return;
    int n = device_count();
    for (int d = 0; d < n && d < kMaxDevices; ++d) {
      try {
        if (device_caching_allocator(d)->try_free(ptr)) return;
      } catch (...) {
        return;
      }
    }
  }
};

// Pinned (page-locked) host memory for asynchronous copies, cached like device memory: the
// same CachingAllocator over cudaHostAlloc/cudaFreeHost. Host memory is not stream-ordered - the
// CPU may write a reused block at once - so blocks belong to a pseudo "host stream" and every
// asynchronous copy that reads or writes one records its real stream on the block
// (record_host_use); a freed block is reused only after those copies have finished.
char g_host_stream_tag;
void* const kHostStream = &g_host_stream_tag;

class PinnedBackend final : public AllocatorBackend {
 public:
  void* raw_alloc(size_t nbytes) override {
    void* p = nullptr;
    cudaError_t e = cudaHostAlloc(&p, nbytes, cudaHostAllocDefault);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return nullptr;
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      KILN_FAIL("CUDA error in cudaHostAlloc(", nbytes, " bytes): ", cudaGetErrorString(e));
    }
    return p;
  }
  void raw_free(void* ptr) override {
    if (cudaFreeHost(ptr) != cudaSuccess) cudaGetLastError();
  }
  void synchronize_stream(void* stream) override {
    if (stream == kHostStream) return;
    internal::report_sync("the pinned host allocator waits for a copy before reusing memory", false);
    KILN_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  }
  bool stream_done(void* stream) override {
    if (stream == kHostStream) return true;
    return internal::query_finished(cudaStreamQuery(static_cast<cudaStream_t>(stream)));
  }
  void* record_event(void* stream) override {
    if (stream == kHostStream) return stream;
    // The event must be created on the stream's device.
    int dev = 0, prev = 0;
    KILN_CUDA_CHECK(cudaStreamGetDevice(static_cast<cudaStream_t>(stream), &dev));
    KILN_CUDA_CHECK(cudaGetDevice(&prev));
    if (dev != prev) KILN_CUDA_CHECK(cudaSetDevice(dev));
    cudaEvent_t ev = nullptr;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(ev, static_cast<cudaStream_t>(stream));
    if (dev != prev) cudaSetDevice(prev);
    KILN_CUDA_CHECK(e);
    return ev;
  }
  bool event_done(void* ev) override {
    if (ev == kHostStream) return true;
    return internal::query_finished(cudaEventQuery(static_cast<cudaEvent_t>(ev)));
  }
  void synchronize_event(void* ev) override {
    if (ev == kHostStream) return;
    internal::report_sync("the pinned host allocator waits for a copy before releasing memory", false);
    KILN_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(ev)));
  }
  void release_event(void* ev) override {
    if (ev != kHostStream) cudaEventDestroy(static_cast<cudaEvent_t>(ev));
  }
};

CachingAllocator* host_caching_allocator() {
  static CachingAllocator* a = new CachingAllocator(new PinnedBackend(), "pinned host");  // never destroyed
  return a;
}

class PinnedHostAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    return host_caching_allocator()->allocate(nbytes, kHostStream);
  }
  void deallocate(void* ptr) override { host_caching_allocator()->try_free(ptr); }
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
  KILN_CHECK(device.index >= 0 && device.index < n, op, ": device ", device, " does not exist (", n, " CUDA devices)");
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
  check_device_errors(device);
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

namespace {
// Device to device: queued on the destination device's current stream and never waited for on
// the host; stream order makes later work see it (also inside a CUDA graph capture). Between two
// devices the copy first waits for the source device's current stream (which may still be
// writing src), and that stream then waits for the copy (src must not be reused under it).
void copy_device_to_device(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) {
  internal::DeviceGuard guard(dst_device.index);
  const Stream dst_stream = current_stream(dst_device.index);
  cudaStream_t stream = static_cast<cudaStream_t>(dst_stream.handle);
  if (dst_device == src_device) {
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, stream));
    return;
  }
  const Stream src_stream = current_stream(src_device.index);
  stream_wait(dst_stream, src_stream);
  KILN_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device.index, src, src_device.index, nbytes, stream));
  stream_wait(src_stream, dst_stream);
}
}  // namespace

void memcpy(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes, bool non_blocking) {
  if (nbytes == 0) return;
  if (dst_device.is_cuda() && src_device.is_cuda())
    return copy_device_to_device(dst, dst_device, src, src_device, nbytes);
  cudaMemcpyKind kind = cudaMemcpyDefault;  // unified addressing tells the direction
  Device dev = dst_device.is_cuda() ? dst_device : src_device;
  cudaStream_t stream = static_cast<cudaStream_t>(current_stream(dev.index).handle);
  if (!non_blocking) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    KILN_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    KILN_CHECK(capture != cudaStreamCaptureStatusActive, "cuda::memcpy: a blocking copy of ", nbytes,
               " bytes (item(), to(cpu), a pageable host->device copy) inside a CUDA graph capture; "
               "it would synchronise with the host, which a captured region cannot do");
  }
  if (!non_blocking && sync_debug_mode() != SyncDebugMode::Off)
    internal::report_sync(kiln::detail::concat("blocking ", dst_device.is_cuda() ? "host-to-device" : "device-to-host",
                                               " copy of ", nbytes, " bytes"));
  KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, kind, stream));
  if (!non_blocking) {
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
    internal::check_device_errors_on(current_stream(dev.index));  // docs/kernels.md, "Index bounds on the GPU"
  }
}

// ------------------------------------------------------------------- caching allocator API

namespace {
std::atomic<bool> g_record_history{false};
CachingAllocator* allocator_of(int device, const char* op) {
  if (device < 0) device = current_device();
  check_device(Device::cuda(device), op);
  CachingAllocator* a = device_caching_allocator(device);
  if (g_record_history && !a->recording_history()) a->record_history(true);
  return a;
}
}  // namespace

void empty_cache() {
  int n = device_count();
  for (int d = 0; d < n && d < kMaxDevices; ++d) device_caching_allocator(d)->empty_cache();
}
AllocatorStats memory_stats(int device) { return allocator_of(device, "cuda::memory_stats")->stats(); }
void reset_peak_memory_stats(int device) { allocator_of(device, "cuda::reset_peak_memory_stats")->reset_peak_stats(); }
std::string memory_summary(int device) { return allocator_of(device, "cuda::memory_summary")->summary(); }
void set_per_process_memory_fraction(double fraction, int device) {
  KILN_CHECK(fraction > 0 && fraction <= 1,
             "cuda::set_per_process_memory_fraction: the fraction must be in (0, 1], got ", fraction);
  CachingAllocator* a = allocator_of(device, "cuda::set_per_process_memory_fraction");
  if (device < 0) device = current_device();
  internal::DeviceGuard guard(device);
  size_t free_b = 0, total_b = 0;
  KILN_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  a->set_memory_limit(fraction >= 1 ? 0 : static_cast<size_t>(fraction * static_cast<double>(total_b)));
}
void record_memory_history(bool enabled) {
  KILN_CHECK(is_available(), "cuda::record_memory_history: no CUDA device is available");
  g_record_history = enabled;
  int n = device_count();
  for (int d = 0; d < n && d < kMaxDevices; ++d) device_caching_allocator(d)->record_history(enabled);
}
std::vector<MemoryEvent> memory_history(int device) { return allocator_of(device, "cuda::memory_history")->history(); }
void record_stream(void* data, const Stream& s) {
  if (!data) return;
  allocator_of(s.device.index, "cuda::record_stream")->record_stream(data, s.handle);
}
void record_host_use(void* data, const Stream& s) {
  if (!data || !s.device.is_cuda()) return;
  CachingAllocator* a = host_caching_allocator();
  if (a->owns(data)) a->record_stream(data, s.handle);
}
void empty_host_cache() { host_caching_allocator()->empty_cache(); }
AllocatorStats host_memory_stats() { return host_caching_allocator()->stats(); }
void begin_private_pool(uint64_t id, int device) {
  allocator_of(device, "cuda::begin_private_pool")->begin_private_pool(id);
}
void end_private_pool(int device) { allocator_of(device, "cuda::end_private_pool")->end_private_pool(); }
void release_private_pool(uint64_t id, int device) {
  allocator_of(device, "cuda::release_private_pool")->release_pool(id);
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
void empty_cache() {}  // nothing is cached without CUDA
AllocatorStats memory_stats(int) { no_cuda("cuda::memory_stats"); }
void reset_peak_memory_stats(int) { no_cuda("cuda::reset_peak_memory_stats"); }
std::string memory_summary(int) { no_cuda("cuda::memory_summary"); }
void set_per_process_memory_fraction(double, int) { no_cuda("cuda::set_per_process_memory_fraction"); }
void record_memory_history(bool) { no_cuda("cuda::record_memory_history"); }
std::vector<MemoryEvent> memory_history(int) { no_cuda("cuda::memory_history"); }
void record_stream(void*, const Stream&) { no_cuda("cuda::record_stream"); }
void record_host_use(void*, const Stream&) {}
void empty_host_cache() {}
AllocatorStats host_memory_stats() { return {}; }
void begin_private_pool(uint64_t, int) { no_cuda("cuda::begin_private_pool"); }
void end_private_pool(int) { no_cuda("cuda::end_private_pool"); }
void release_private_pool(uint64_t, int) { no_cuda("cuda::release_private_pool"); }

#endif

StreamGuard::StreamGuard(const Stream& s) : prev_(current_stream(s.device.index)) { set_current_stream(s); }
StreamGuard::~StreamGuard() { set_current_stream(prev_); }

}  // namespace kiln::cuda
