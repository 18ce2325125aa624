#pragma once
// The loss scaler's kernels.
//
// unscale_and_check_: multiply every gradient by inv_scale in place and set found_inf (a
// one-element f32 tensor; set to 1, never cleared) if any value is Inf or NaN — one pass over all gradients instead
// of a check and a scale per tensor. inv_scale and found_inf live on the gradients' device, so
// nothing is read on the host.
//
// amp_update_scale_: GradScaler.update() as a kernel (one thread on a GPU): the next scale, the
// growth tracker and the count of skipped steps from found_inf, all read and written where they
// live, so a training step
// does not synchronise with the host. The rule is math::update_loss_scale below, shared by the CPU
// and CUDA versions.
//
// Both are registered by kernels/cpu/amp.cpp and kernels/cuda/amp.cu.
#include <cstdint>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/core/macros.h"
#include "kiln/core/tensor.h"
#include "kiln/kernels/dispatch.h"

namespace kiln::math {

// PyTorch's GradScaler update: after an overflow the scale is multiplied by backoff and the
// tracker reset; otherwise the tracker counts clean steps and every growth_interval of them the
// scale is multiplied by growth (and the tracker reset). The scale is computed in double and
// stored by the caller in its tensor's dtype. `skipped` counts the steps an overflow skipped.
KILN_INLINE void update_loss_scale(double& scale, int64_t& tracker, int64_t& skipped, bool found_inf,
                                   double growth_factor, double backoff_factor, int64_t growth_interval) {
  if (found_inf) {
    scale *= backoff_factor;
    tracker = 0;
    ++skipped;
  } else if (++tracker == growth_interval) {
    scale *= growth_factor;
    tracker = 0;
  }
}

}  // namespace kiln::math

namespace kiln::kernels {

// grads, inv_scale (one element) and found_inf (one-element f32) on one device.
inline Kernel<void(const std::vector<Tensor>& grads, const Tensor& inv_scale, const Tensor& found_inf)>
    unscale_and_check_{"unscale_and_check_"};

// scale: one-element f32 (or f64); growth_tracker and skipped: one-element i64; found_inf:
// one-element f32. All on one device.
inline Kernel<void(const Tensor& scale, const Tensor& growth_tracker, const Tensor& skipped, const Tensor& found_inf,
                   double growth_factor, double backoff_factor, int64_t growth_interval)>
    amp_update_scale_{"amp_update_scale_"};

// What both backends' amp_update_scale_ check of their operands.
inline void check_update_scale_args(const Tensor& scale, const Tensor& growth_tracker, const Tensor& skipped,
                                    const Tensor& found_inf) {
  auto one_i64 = [](const Tensor& t) { return t.defined() && t.numel() == 1 && t.dtype() == DType::I64; };
  KILN_CHECK(scale.defined() && found_inf.defined() && scale.numel() == 1 &&
                 (scale.dtype() == DType::F32 || scale.dtype() == DType::F64) && one_i64(growth_tracker) &&
                 one_i64(skipped) && found_inf.numel() == 1 && found_inf.dtype() == DType::F32,
             "amp_update_scale_: expected one-element scale (f32/f64), growth_tracker and skipped (i64) and ",
             "found_inf (f32)");
}

// amp_update_scale_ writes scale, growth_tracker and skipped in place; record it as an in-place
// op would.
inline void bump_scale_versions(const Tensor& scale, const Tensor& growth_tracker, const Tensor& skipped) {
  scale.storage()->bump_version();
  growth_tracker.storage()->bump_version();
  skipped.storage()->bump_version();
}

}  // namespace kiln::kernels
