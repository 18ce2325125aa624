// The operand check and the errors of the dispatch mechanism (kiln/kernels/dispatch.h): one
// wording for every kernel family.
#include "kiln/kernels/dispatch.h"

#include "kiln/config.h"
#include "kiln/core/cpu_isa.h"

namespace kiln::kernels::detail {

static_assert(kNumCpuLevels == kNumCpuIsas, "one CPU slot per CPU level");

void OperandDevices::add(const Tensor& t) {
  if (!t.defined()) return;
  if (!first) {
    first = &t;
    return;
  }
  KILN_CHECK(t.device() == first->device(), op, ": expected all tensors on one device, got ", first->device(),
             " (sizes ", first->sizes(), ") and ", t.device(), " (sizes ", t.sizes(), ")");
}

void no_operand(const char* op) { KILN_FAIL(op, ": every tensor operand is undefined"); }

void no_backend(const char* op, Device device) {
#if KILN_WITH_CUDA
  KILN_FAIL(op, ": no kernel for tensors on ", device, " in this build");
#else
  if (device.is_cuda())
    KILN_FAIL(op, ": kiln was built without CUDA, so this op cannot run on tensors on ", device,
              "; move them to the CPU with .cpu()");
  KILN_FAIL(op, ": no kernel for tensors on ", device, " in this build");
#endif
}

}  // namespace kiln::kernels::detail
