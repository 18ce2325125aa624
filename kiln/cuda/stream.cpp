// Stream pool, cross-stream waits and events (cuda_stream.h). Host code against cudart.
#include "kiln/cuda/stream.h"

#include <array>
#include <atomic>
#include <mutex>

#include "kiln/config.h"
#include "kiln/cuda/cuda.h"
#include "kiln/cuda/device_error.h"
#include "kiln/core/error.h"
#include "kiln/core/tensor.h"

#if KILN_WITH_CUDA
#include <cuda_runtime.h>

#include "kiln/cuda/check.h"
#endif

namespace kiln::cuda {

#if KILN_WITH_CUDA

namespace {

constexpr int kMaxDevices = 16;
constexpr int kStreamsPerDevice = 8;

int resolve(int device) { return device < 0 ? current_device() : device; }

cudaStream_t native(const Stream& s) { return static_cast<cudaStream_t>(s.handle); }

using DeviceScope = internal::DeviceGuard;

struct DevicePool {
  std::once_flag created;
  std::array<cudaStream_t, kStreamsPerDevice> streams{};
  std::atomic<unsigned> next{0};
};

DevicePool& pool_of(int device) {
  static DevicePool pools[kMaxDevices];
  KILN_CHECK(device >= 0 && device < kMaxDevices, "get_stream_from_pool: device index ", device, " out of range");
  DevicePool& p = pools[device];
  std::call_once(p.created, [&] {
    DeviceScope scope(device);
    for (auto& s : p.streams) KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  });
  return p;
}

}  // namespace

Stream get_stream_from_pool(int device) {
  device = resolve(device);
  check_device(Device::cuda(device), "get_stream_from_pool");
  DevicePool& p = pool_of(device);
  unsigned i = p.next.fetch_add(1) % kStreamsPerDevice;
  return Stream{Device::cuda(device), p.streams[i]};
}

void stream_wait(const Stream& waiter, const Stream& other) {
  KILN_CHECK(waiter.device.is_cuda() && other.device.is_cuda(), "stream_wait: both streams must be CUDA streams (got ",
             waiter.device, " and ", other.device, ")");
  if (waiter == other) return;
  DeviceScope scope(other.device.index);
  cudaEvent_t ev = nullptr;
  KILN_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  cudaError_t e = cudaEventRecord(ev, native(other));
  if (e == cudaSuccess) e = cudaStreamWaitEvent(native(waiter), ev, 0);
  cudaEventDestroy(ev);  // safe: destruction is deferred until the event completes
  KILN_CUDA_CHECK(e);
}

void synchronize_stream(const Stream& s) {
  KILN_CHECK(s.device.is_cuda(), "synchronize_stream: not a CUDA stream (", s.device, ")");
  KILN_CUDA_CHECK(cudaStreamSynchronize(native(s)));
  internal::check_device_errors_on(s);
}

bool stream_query(const Stream& s) {
  KILN_CHECK(s.device.is_cuda(), "stream_query: not a CUDA stream (", s.device, ")");
  return internal::query_finished(cudaStreamQuery(native(s)));
}

bool is_capturing(const Stream& s) {
  if (!s.device.is_cuda() || !is_available()) return false;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  KILN_CUDA_CHECK(cudaStreamIsCapturing(native(s), &st));
  return st == cudaStreamCaptureStatusActive;
}

bool current_stream_is_capturing() {
  if (!is_available()) return false;
  return is_capturing(current_stream());
}

void record_stream(const Tensor& t, const Stream& s) {
  if (!t.defined() || !t.device().is_cuda()) return;
  KILN_CHECK(s.device == t.device(), "record_stream: the tensor is on ", t.device(), " but the stream belongs to ",
             s.device);
  record_stream(t.storage()->data(), s);
}

Event::Event(bool enable_timing) : timing_(enable_timing) {}

Event::~Event() {
  if (event_) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
}

Event::Event(Event&& o) noexcept : event_(o.event_), device_(o.device_), timing_(o.timing_) { o.event_ = nullptr; }

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    if (event_) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
    event_ = o.event_;
    device_ = o.device_;
    timing_ = o.timing_;
    o.event_ = nullptr;
  }
  return *this;
}

void Event::record(const Stream& s) {
  KILN_CHECK(s.device.is_cuda(), "Event::record: not a CUDA stream (", s.device, ")");
  KILN_CHECK(!event_ || device_ == s.device.index, "Event::record: the event belongs to cuda:", device_,
             " but the stream to ", s.device);
  DeviceScope scope(s.device.index);
  if (!event_) {
    cudaEvent_t ev = nullptr;
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&ev, timing_ ? cudaEventDefault : cudaEventDisableTiming));
    event_ = ev;
    device_ = s.device.index;
  }
  KILN_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event_), native(s)));
}

void Event::record() { record(current_stream()); }

bool Event::query() const {
  if (!event_) return true;
  return internal::query_finished(cudaEventQuery(static_cast<cudaEvent_t>(event_)));
}

void Event::synchronize() const {
  if (event_) KILN_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)));
}

void Event::wait(const Stream& s) const {
  if (!event_) return;
  KILN_CHECK(s.device.is_cuda(), "Event::wait: not a CUDA stream (", s.device, ")");
  KILN_CUDA_CHECK(cudaStreamWaitEvent(native(s), static_cast<cudaEvent_t>(event_), 0));
}

float Event::elapsed_ms(const Event& end) const {
  KILN_CHECK(timing_ && end.timing_, "Event::elapsed_ms: both events need enable_timing = true");
  KILN_CHECK(event_ && end.event_, "Event::elapsed_ms: both events must have been recorded");
  float ms = 0;
  KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(event_), static_cast<cudaEvent_t>(end.event_)));
  return ms;
}

#else  // !KILN_WITH_CUDA

namespace {
[[noreturn]] void no_cuda(const char* what) {
  KILN_FAIL(what, ": kiln was built without CUDA support (configure with -DKILN_CUDA=ON)");
}
}  // namespace

Stream get_stream_from_pool(int) { no_cuda("cuda::get_stream_from_pool"); }
void stream_wait(const Stream&, const Stream&) { no_cuda("cuda::stream_wait"); }
void synchronize_stream(const Stream&) { no_cuda("cuda::synchronize_stream"); }
bool stream_query(const Stream&) { no_cuda("cuda::stream_query"); }
bool is_capturing(const Stream&) { return false; }
bool current_stream_is_capturing() { return false; }
void record_stream(const Tensor& t, const Stream&) {
  if (t.defined() && t.device().is_cuda()) no_cuda("cuda::record_stream");
}
Event::Event(bool enable_timing) : timing_(enable_timing) {}
Event::~Event() = default;
Event::Event(Event&& o) noexcept : event_(o.event_), device_(o.device_), timing_(o.timing_) {}
Event& Event::operator=(Event&&) noexcept { return *this; }
void Event::record(const Stream&) { no_cuda("cuda::Event::record"); }
void Event::record() { no_cuda("cuda::Event::record"); }
bool Event::query() const { return true; }
void Event::synchronize() const {}
void Event::wait(const Stream&) const { no_cuda("cuda::Event::wait"); }
float Event::elapsed_ms(const Event&) const { no_cuda("cuda::Event::elapsed_ms"); }

#endif

}  // namespace kiln::cuda
