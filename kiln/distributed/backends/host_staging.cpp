#include "kiln/distributed/backends/host_staging.h"

#include <cstdlib>
#include <cstring>

#include "kiln/core/autograd.h"
#include "kiln/cuda/cuda.h"
#include "kiln/cuda/stream.h"
#include "kiln/core/error.h"

namespace kiln::distributed {

struct HostStaging::CudaState {
  cuda::Event ready;   // the tensors' values are complete on the caller's stream
  Stream copy_stream;  // the copies both ways
};

HostStaging::HostStaging(std::vector<Tensor> tensors, bool copy_cpu) : tensors_(std::move(tensors)) {
  const bool on_gpu = !tensors_.empty() && tensors_[0].defined() && tensors_[0].is_cuda();
  staged_ = on_gpu || copy_cpu;
  if (!staged_) {
    host_ = tensors_;
    return;
  }
  for (const Tensor& t : tensors_) {
    KILN_CHECK(t.is_cuda() == on_gpu,
               "host staging: the tensors of one collective must all be on "
               "the GPU or all on the CPU");
    host_.push_back(empty(t.sizes(), TensorOptions().dtype(t.dtype()).pinned_memory(on_gpu)));
  }
  if (!on_gpu) return;
  const int device = tensors_[0].device().index;
  cuda_ = std::make_unique<CudaState>();
  cuda_->copy_stream = cuda::get_stream_from_pool(device);
  cuda_->ready.record(cuda::current_stream(device));
  for (const Tensor& t : tensors_) cuda::record_stream(t, cuda_->copy_stream);
}

HostStaging::~HostStaging() = default;

void HostStaging::to_host() {
  if (!staged_) return;
  NoGradGuard no_grad;  // the worker copies values; gradients and leaves are not its business
  if (!cuda_) {
    for (size_t i = 0; i < tensors_.size(); ++i) host_[i].copy_(tensors_[i]);
    return;
  }
  cuda::StreamGuard on_copy_stream(cuda_->copy_stream);
  cuda_->ready.wait(cuda_->copy_stream);
  for (size_t i = 0; i < tensors_.size(); ++i) host_[i].copy_(tensors_[i], /*non_blocking=*/true);
  cuda::synchronize_stream(cuda_->copy_stream);
}

void HostStaging::to_device() {
  if (!staged_) return;
  NoGradGuard no_grad;
  if (!cuda_) {
    for (size_t i = 0; i < tensors_.size(); ++i) tensors_[i].copy_(host_[i]);
    return;
  }
  cuda::StreamGuard on_copy_stream(cuda_->copy_stream);
  for (size_t i = 0; i < tensors_.size(); ++i) tensors_[i].copy_(host_[i], /*non_blocking=*/true);
  cuda::synchronize_stream(cuda_->copy_stream);
}

bool stage_cpu_tensors_for_testing() {
  static const bool on = [] {
    const char* v = std::getenv("KILN_GLOO_STAGE_CPU_TENSORS");
    return v && std::strcmp(v, "1") == 0;
  }();
  return on;
}

}  // namespace kiln::distributed
