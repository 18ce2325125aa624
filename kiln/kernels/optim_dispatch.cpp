// Device dispatch for the multi-tensor optimizer kernels (kiln/kernels/optim_kernels.h) and the
// loss scaler's kernels (kiln/kernels/amp_kernels.h): CPU tensors go to kernels/cpu, CUDA tensors
// to kernels/cuda (multi_tensor.cu, amp.cu) when kiln is built with CUDA.
#include "kiln/config.h"
#include "kiln/core/error.h"
#include "kiln/kernels/amp_kernels.h"
#include "kiln/kernels/optim_kernels.h"
#if KILN_WITH_CUDA
#include "kiln/kernels/cuda/amp_cuda.h"
#include "kiln/kernels/cuda/multi_tensor_cuda.h"
#endif

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

// True when every defined tensor of `ts` is on `dev`.
bool all_on(const std::vector<Tensor>& ts, Device dev) {
  for (const Tensor& t : ts)
    if (t.defined() && t.device() != dev) return false;
  return true;
}

[[noreturn, maybe_unused]] void no_cuda(const char* op, Device dev) {
  KILN_FAIL(op, ": kiln was built without CUDA, but the tensors are on ", dev);
}
}  // namespace

void fused_optimizer_step(const math::OptimHyper& hyper, const MultiTensorLists& lists,
                          const StepScalars& scalars) {
  Device dev = device_of(lists.params, "fused_optimizer_step");
  if (dev.is_cpu()) return cpu::fused_optimizer_step(hyper, lists, scalars);
#if KILN_WITH_CUDA
  return cuda::fused_optimizer_step(hyper, lists, scalars);
#else
  no_cuda("fused_optimizer_step", dev);
#endif
}

Tensor multi_tensor_norm(const std::vector<Tensor>& tensors, double norm_type) {
  Device dev = device_of(tensors, "multi_tensor_norm");
  if (dev.is_cpu()) return cpu::multi_tensor_norm(tensors, norm_type);
#if KILN_WITH_CUDA
  return cuda::multi_tensor_norm(tensors, norm_type);
#else
  no_cuda("multi_tensor_norm", dev);
#endif
}

void multi_tensor_scale_(const std::vector<Tensor>& tensors, const Tensor& scale) {
  Device dev = device_of(tensors, "multi_tensor_scale_");
  KILN_CHECK(!scale.defined() || tensors.empty() || scale.device() == dev,
             "multi_tensor_scale_: scale is on ", scale.device(), ", tensors on ", dev);
  if (dev.is_cpu()) return cpu::multi_tensor_scale_(tensors, scale);
#if KILN_WITH_CUDA
  return cuda::multi_tensor_scale_(tensors, scale);
#else
  no_cuda("multi_tensor_scale_", dev);
#endif
}

void multi_tensor_lerp_(const std::vector<Tensor>& dst, const std::vector<Tensor>& src, double weight) {
  Device dev = device_of(dst, "multi_tensor_lerp_");
  KILN_CHECK(all_on(src, dev),
             "multi_tensor_lerp_: sources and destinations must be on one device");
  if (dev.is_cpu()) return cpu::multi_tensor_lerp_(dst, src, weight);
#if KILN_WITH_CUDA
  return cuda::multi_tensor_lerp_(dst, src, weight);
#else
  no_cuda("multi_tensor_lerp_", dev);
#endif
}

void unscale_and_check_(const std::vector<Tensor>& grads, const Tensor& inv_scale, const Tensor& found_inf) {
  KILN_CHECK(inv_scale.defined() && found_inf.defined(),
             "unscale_and_check_: inv_scale and found_inf must be defined");
  Device dev = found_inf.device();
  KILN_CHECK(inv_scale.device() == dev && all_on(grads, dev),
             "unscale_and_check_: gradients, inv_scale (", inv_scale.device(), ") and found_inf (", dev,
             ") must be on one device");
  if (dev.is_cpu()) return cpu::unscale_and_check_(grads, inv_scale, found_inf);
#if KILN_WITH_CUDA
  return cuda::unscale_and_check_(grads, inv_scale, found_inf);
#else
  no_cuda("unscale_and_check_", dev);
#endif
}

void amp_update_scale_(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                       double growth_factor, double backoff_factor, int64_t growth_interval) {
  KILN_CHECK(scale.defined() && growth_tracker.defined() && found_inf.defined(),
             "amp_update_scale_: scale, growth_tracker and found_inf must be defined");
  Device dev = scale.device();
  KILN_CHECK(growth_tracker.device() == dev && found_inf.device() == dev, "amp_update_scale_: scale (", dev,
             "), growth_tracker (", growth_tracker.device(), ") and found_inf (", found_inf.device(),
             ") must be on one device");
  if (dev.is_cpu())
    return cpu::amp_update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval);
#if KILN_WITH_CUDA
  return cuda::amp_update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval);
#else
  no_cuda("amp_update_scale_", dev);
#endif
}

}  // namespace kiln::kernels
