// The device error record (cuda_device_error.h): one per device, in device memory.
#include "kiln/cuda/device_error.h"

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/config.h"
#include "kiln/cuda/cuda.h"
#include "kiln/cuda/stream.h"
#include "kiln/core/error.h"

#if KILN_WITH_CUDA
#include <cuda_runtime.h>

#include "kiln/cuda/check.h"
#endif

namespace kiln::cuda {

namespace internal {

namespace {
// The op names behind error_site() ids.
struct SiteTable {
  std::mutex mu;
  std::vector<std::string> names;
};
SiteTable& sites() {
  static SiteTable t;
  return t;
}
// Read by the CUDA build's error reports only.
[[maybe_unused]] std::string site_name(int32_t site) {
  SiteTable& t = sites();
  std::lock_guard<std::mutex> lock(t.mu);
  if (site < 0 || static_cast<size_t>(site) >= t.names.size()) return "an indexing op";
  return t.names[static_cast<size_t>(site)];
}
}  // namespace

int32_t error_site(const char* op) {
  SiteTable& t = sites();
  std::lock_guard<std::mutex> lock(t.mu);
  for (size_t i = 0; i < t.names.size(); ++i)
    if (t.names[i] == op) return static_cast<int32_t>(i);
  t.names.emplace_back(op);
  return static_cast<int32_t>(t.names.size() - 1);
}

}  // namespace internal

#if KILN_WITH_CUDA

namespace {
constexpr int kMaxDevices = 16;
std::atomic<internal::DeviceErrorRecord*> g_records[kMaxDevices] = {};
}  // namespace

namespace internal {

DeviceErrorRecord* device_error_record(int device) {
  KILN_CHECK(device >= 0 && device < kMaxDevices, "device error record: device index ", device, " out of range");
  DeviceErrorRecord* r = g_records[device].load(std::memory_order_acquire);
  if (r) return r;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  r = g_records[device].load(std::memory_order_relaxed);
  if (!r) {
    DeviceGuard guard(device);
    KILN_CUDA_CHECK(cudaMalloc(&r, sizeof(DeviceErrorRecord)));
    // Zeroed now, on a stream of its own, and waited for: on the current stream a capture in
    // progress would only record the memset into its graph, and a check before the first replay
    // would read garbage (Graph::capture_begin also creates the record before capturing).
    cudaStream_t zeroing = nullptr;
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&zeroing, cudaStreamNonBlocking));
    cudaError_t e = cudaMemsetAsync(r, 0, sizeof(DeviceErrorRecord), zeroing);
    if (e == cudaSuccess) e = cudaStreamSynchronize(zeroing);
    cudaStreamDestroy(zeroing);
    KILN_CUDA_CHECK(e);
    g_records[device].store(r, std::memory_order_release);
  }
  return r;
}

void check_device_errors_on(const Stream& s) {
  const int device = s.device.index;
  if (device < 0 || device >= kMaxDevices) return;
  DeviceErrorRecord* r = g_records[device].load(std::memory_order_acquire);
  if (!r) return;  // no kernel of this device could have recorded anything
  DeviceGuard guard(device);
  cudaStream_t stream = static_cast<cudaStream_t>(s.handle);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  KILN_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return;  // nothing can be read back while capturing
  DeviceErrorRecord host{};
  // Called right after `s` was synchronised: this small copy waits for nothing else.
  KILN_CUDA_CHECK(cudaMemcpyAsync(&host, r, sizeof(host), cudaMemcpyDeviceToHost, stream));
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (host.flag == 0) return;
  KILN_CUDA_CHECK(cudaMemsetAsync(r, 0, sizeof(host), stream));  // reported once
  KILN_FAIL(site_name(host.site), ": index ", host.value, " is out of range for dimension ", host.dim, " with size ",
            host.bound, host.value < 0 ? " (negative indices are not allowed)" : "",
            "; found by a kernel on cuda:", device,
            " and reported at this synchronisation (docs/kernels.md, \"Index bounds on the GPU\")");
}

}  // namespace internal

void check_device_errors(int device) {
  if (!is_available()) return;  // nothing ran on a device
  if (device < 0) device = current_device();
  internal::check_device_errors_on(current_stream(device));
}

#else  // !KILN_WITH_CUDA

void check_device_errors(int) {}  // nothing runs on a device

namespace internal {
DeviceErrorRecord* device_error_record(int) { KILN_FAIL("device error record: kiln was built without CUDA support"); }
void check_device_errors_on(const Stream&) {}
}  // namespace internal

#endif

}  // namespace kiln::cuda
