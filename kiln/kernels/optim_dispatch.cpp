// Device dispatch for the multi-tensor optimizer kernels (kiln/kernels/optim_kernels.h).
#include "kiln/core/error.h"
#include "kiln/kernels/optim_kernels.h"

namespace kiln::kernels {
namespace {
Device device_of(const std::vector<Tensor>& ts, const char* op) {
  Device dev = Device::cpu();
  bool first = true;
  for (const Tensor& t : ts) {
    if (!t.defined()) continue;
    if (first) { dev = t.device(); first = false; continue; }
    KILN_CHECK(t.device() == dev, op, ": all tensors must be on one device, got ", dev, " and ",
               t.device());
  }
  return dev;
}
}  // namespace

void fused_optimizer_step(const math::OptimHyper& hyper, const MultiTensorLists& lists,
                          const StepScalars& scalars) {
  Device dev = device_of(lists.params, "fused_optimizer_step");
  if (dev.is_cpu()) return cpu::fused_optimizer_step(hyper, lists, scalars);
  // The CUDA launcher (CUDA-backend issue) takes the same arguments: chunk metadata per block,
  // lr / steps / found_inf / grad_scale read on the device.
  KILN_FAIL("fused_optimizer_step: no CUDA launcher yet for parameters on ", dev);
}

Tensor multi_tensor_norm(const std::vector<Tensor>& tensors, double norm_type) {
  Device dev = device_of(tensors, "multi_tensor_norm");
  if (dev.is_cpu()) return cpu::multi_tensor_norm(tensors, norm_type);
  KILN_FAIL("multi_tensor_norm: no CUDA launcher yet for tensors on ", dev);
}

void multi_tensor_scale_(const std::vector<Tensor>& tensors, const Tensor& scale) {
  Device dev = device_of(tensors, "multi_tensor_scale_");
  KILN_CHECK(!scale.defined() || tensors.empty() || scale.device() == dev,
             "multi_tensor_scale_: scale is on ", scale.device(), ", tensors on ", dev);
  if (dev.is_cpu()) return cpu::multi_tensor_scale_(tensors, scale);
  KILN_FAIL("multi_tensor_scale_: no CUDA launcher yet for tensors on ", dev);
}

}  // namespace kiln::kernels
