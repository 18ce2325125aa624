#pragma once
// Host staging for a collective that runs on the CPU (Gloo) over CUDA tensors, as PyTorch's Gloo
// backend does: several ranks sharing one GPU cannot use NCCL, but they can exchange through
// page-locked host buffers (docs/distributed.md, "Several ranks on one GPU").
//
// The order of events, for tensors on the GPU:
//   issue (the caller's thread)   an event on the caller's current stream marks the point where
//                                 the tensors hold their values; the tensors are recorded as used
//                                 on the copy stream, so the allocator keeps them until it is done
//   to_host (the group's worker)  the copy stream waits for that event, copies every tensor into
//                                 its pinned buffer, and the worker waits for the copies
//   ... the CPU collective runs on the pinned buffers ...
//   to_device (the worker)        the copy stream copies the results back; the worker waits for
//                                 them before the Work completes, so code after Work::wait() sees
//                                 them on any stream
// CPU tensors are used in place (host() returns them), unless `copy_cpu` asks for separate host
// buffers: the same copies without the events, which is how the CPU tests check this logic.
#include <memory>
#include <vector>

#include "kiln/core/tensor.h"

namespace kiln::distributed {

class HostStaging {
 public:
  // On the caller's thread, when the collective is issued. `tensors`: all CPU or all CUDA.
  explicit HostStaging(std::vector<Tensor> tensors, bool copy_cpu = false);
  ~HostStaging();
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;

  bool staged() const { return staged_; }  // false: host() are the tensors themselves
  const std::vector<Tensor>& host() const { return host_; }

  void to_host();    // on the worker: the tensors' values into host()
  void to_device();  // on the worker: host() back into the tensors, waited for

 private:
  struct CudaState;
  std::vector<Tensor> tensors_, host_;
  bool staged_ = false;
  std::unique_ptr<CudaState> cuda_;  // the event and the copy stream, for CUDA tensors
};

// Whether the gloo group copies CPU tensors through separate host buffers too
// (KILN_GLOO_STAGE_CPU_TENSORS=1; for testing the staging without a GPU).
bool stage_cpu_tensors_for_testing();

}  // namespace kiln::distributed
