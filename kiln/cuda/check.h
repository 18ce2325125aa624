#pragma once
// Internal: turns a failed CUDA runtime call or kernel launch into a kiln::Error naming it.
// Only for translation units built with CUDA.
#include <cuda_runtime.h>

#include "kiln/cuda/launch_error.h"
#include "kiln/core/error.h"

#define KILN_CUDA_CHECK(call)                                                                                      \
  do {                                                                                                             \
    cudaError_t kiln_err_ = (call);                                                                                \
    if (kiln_err_ != cudaSuccess)                                                                                  \
      throw ::kiln::Error(::kiln::detail::concat("CUDA error in ", #call, ": ", cudaGetErrorName(kiln_err_), ": ", \
                                                 cudaGetErrorString(kiln_err_)),                                   \
                          __FILE__, __LINE__);                                                                     \
  } while (0)

// After a <<<...>>> launch: reports a bad launch configuration at the launch site, naming the
// kernel (`name`, a string).
#define KILN_CUDA_CHECK_LAUNCH(name)                                                                        \
  do {                                                                                                      \
    cudaError_t kiln_err_ = cudaGetLastError();                                                             \
    if (kiln_err_ != cudaSuccess)                                                                           \
      throw ::kiln::Error(::kiln::cuda::internal::launch_error_message((name), cudaGetErrorName(kiln_err_), \
                                                                       cudaGetErrorString(kiln_err_)),      \
                          __FILE__, __LINE__);                                                              \
  } while (0)

namespace kiln::cuda::internal {

// A cudaStreamQuery / cudaEventQuery result: false while the work is still running
// (cudaErrorNotReady, cleared from the last-error slot), true once it has finished; any other
// error throws.
inline bool query_finished(cudaError_t e) {
  if (e == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  KILN_CUDA_CHECK(e);
  return true;
}

// Makes `device` current for a scope and restores the previous device after it (multi-GPU
// processes); the one guard the CUDA code shares.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    KILN_CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != device) KILN_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() {
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur != prev_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

}  // namespace kiln::cuda::internal
