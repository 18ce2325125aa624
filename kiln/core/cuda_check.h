#pragma once
// Internal: turns a failed CUDA runtime call or kernel launch into a kiln::Error naming it.
// Only for translation units built with CUDA.
#include <cuda_runtime.h>

#include "kiln/core/error.h"

#define KILN_CUDA_CHECK(call)                                                                \
  do {                                                                                       \
    cudaError_t kiln_err_ = (call);                                                          \
    if (kiln_err_ != cudaSuccess)                                                            \
      throw ::kiln::Error(::kiln::detail::concat("CUDA error in ", #call, ": ",             \
                                                 cudaGetErrorName(kiln_err_), ": ",          \
                                                 cudaGetErrorString(kiln_err_)),             \
                          __FILE__, __LINE__);                                               \
  } while (0)

// After a <<<...>>> launch: reports bad launch configurations at the launch site.
#define KILN_CUDA_CHECK_LAUNCH(name) KILN_CUDA_CHECK(cudaGetLastError())
