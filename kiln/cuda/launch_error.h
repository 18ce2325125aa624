#pragma once
// The text of a failed kernel launch (KILN_CUDA_CHECK_LAUNCH in cuda_check.h), kept free of CUDA
// types so that the CPU tests can check it.
#include <string>

#include "kiln/core/error.h"

namespace kiln::cuda::internal {

// "CUDA kernel launch failed: row_reduce_kernel: cudaErrorInvalidConfiguration: invalid ..."
inline std::string launch_error_message(const char* kernel, const char* error_name, const char* error_text) {
  return ::kiln::detail::concat("CUDA kernel launch failed: ", kernel, ": ", error_name, ": ", error_text);
}

}  // namespace kiln::cuda::internal
