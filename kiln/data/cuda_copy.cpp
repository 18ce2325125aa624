#include "kiln/data/cuda_copy.h"

#include "kiln/config.h"
#include "kiln/core/error.h"

#if KILN_WITH_CUDA
#include <cuda_runtime.h>

#include "kiln/core/cuda_check.h"
#endif

namespace kiln::data::detail {

#if KILN_WITH_CUDA

namespace {
struct DeviceGuard {
  int prev = 0;
  explicit DeviceGuard(int d) {
    cudaGetDevice(&prev);
    if (prev != d) KILN_CUDA_CHECK(cudaSetDevice(d));
  }
  ~DeviceGuard() { cudaSetDevice(prev); }
};
}  // namespace

CudaEvent::CudaEvent(int device) : device_(device) {
  DeviceGuard g(device);
  cudaEvent_t e;
  KILN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  ev_ = e;
}
CudaEvent::~CudaEvent() {
  if (ev_) cudaEventDestroy(static_cast<cudaEvent_t>(ev_));
}
void CudaEvent::record(const Stream& s) {
  KILN_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(ev_), static_cast<cudaStream_t>(s.handle)));
}
bool CudaEvent::done() const {
  cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(ev_));
  if (e == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  KILN_CUDA_CHECK(e);
  return true;
}
void CudaEvent::block_stream(const Stream& s) {
  KILN_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(s.handle),
                                      static_cast<cudaEvent_t>(ev_), 0));
}
void CudaEvent::synchronize() const {
  KILN_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(ev_)));
}

CudaStream::CudaStream(int device) : device_(device) {
  DeviceGuard g(device);
  cudaStream_t s;
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  handle_ = s;
}
CudaStream::~CudaStream() {
  if (handle_) cudaStreamDestroy(static_cast<cudaStream_t>(handle_));
}

#else

namespace {
[[noreturn]] void no_cuda(const char* what) {
  KILN_FAIL(what, ": kiln was built without CUDA support (configure with -DKILN_CUDA=ON)");
}
}  // namespace

CudaEvent::CudaEvent(int) { no_cuda("DataLoader (CUDA event)"); }
CudaEvent::~CudaEvent() = default;
void CudaEvent::record(const Stream&) { no_cuda("DataLoader (CUDA event)"); }
bool CudaEvent::done() const { return true; }
void CudaEvent::block_stream(const Stream&) { no_cuda("DataLoader (CUDA event)"); }
void CudaEvent::synchronize() const {}
CudaStream::CudaStream(int) { no_cuda("DataLoader (copy stream)"); }
CudaStream::~CudaStream() = default;

#endif

}  // namespace kiln::data::detail
