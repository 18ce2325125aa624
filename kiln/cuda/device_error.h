#pragma once
// Errors found by kernels on the device (an out-of-range gather or scatter index), raised on the
// host at the next synchronisation point instead of synchronising every call to check first.
//
// A kernel that meets a bad index skips the access (a gather writes 0) and records the first
// such error of the device in a small device-memory record. The record is read - and a
// kiln::Error naming the op, the bad index and the valid range thrown - by:
//   kiln::cuda::synchronize(), kiln::cuda::synchronize_stream(), every blocking copy (item(),
//   to(cpu), a pageable host->device copy) and check_device_errors() itself.
// The record is cleared when it is reported, and the CUDA context stays usable (PyTorch's
// device-side assert, by contrast, poisons the context). See docs/kernels.md, "Index bounds on
// the GPU".
#include <cstdint>

#include "kiln/cuda/cuda.h"  // check_device_errors(), the public entry point
#include "kiln/core/device.h"

namespace kiln::cuda {

namespace internal {

// The record. Kernels set `flag` from 0 to 1 with atomicCAS; the thread that wins fills the rest.
struct DeviceErrorRecord {
  int32_t flag;
  int32_t site;   // error_site() of the op
  int64_t value;  // the offending index
  int64_t bound;  // valid indices are [0, bound)
  int64_t dim;    // the dimension indexed
};

// The record of `device`, created and zeroed on first use (synchronously, on a stream of its own,
// so that a first use inside a graph capture still finds it zeroed).
DeviceErrorRecord* device_error_record(int device);
// A stable small id for the op name `op` (kernels store the id; the host keeps the text).
int32_t error_site(const char* op);
// check_device_errors() reading the record on stream `s` (one that was just synchronised).
void check_device_errors_on(const Stream& s);

}  // namespace internal
}  // namespace kiln::cuda
