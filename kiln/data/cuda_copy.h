#pragma once
// The few CUDA runtime calls the DataLoader's asynchronous host->device path needs that
// kiln/core does not expose yet: a dedicated copy stream and events. Private to kiln/data
// (not installed in the umbrella header); without CUDA every function throws a clear Error and
// is never reached, because the loader refuses a CUDA device first.
// TODO(core): move to kiln/core once it has Stream creation and Event (the CUDA-backend issue).
#include <memory>

#include "kiln/core/device.h"

namespace kiln::data::detail {

// A CUDA event (timing disabled). Recorded on a stream; queried or waited on.
class CudaEvent {
 public:
  explicit CudaEvent(int device);
  ~CudaEvent();
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  void record(const Stream& s);
  bool done() const;                      // the work recorded before it has finished
  void block_stream(const Stream& s);     // s waits for it (no host sync)
  void synchronize() const;               // the host waits for it

 private:
  void* ev_ = nullptr;
  int device_ = 0;
};

// A non-blocking stream owned by this object.
class CudaStream {
 public:
  explicit CudaStream(int device);
  ~CudaStream();
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  Stream stream() const { return Stream{Device::cuda(device_), handle_}; }

 private:
  void* handle_ = nullptr;
  int device_ = 0;
};

}  // namespace kiln::data::detail
