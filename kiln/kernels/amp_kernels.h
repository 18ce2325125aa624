#pragma once
// The loss scaler's fused kernel: multiply every gradient by inv_scale in place and set
// found_inf (a one-element f32 tensor, 0 or 1) if any value is Inf or NaN — one pass over all
// gradients instead of a check and a scale per tensor. inv_scale and found_inf live on the
// gradients' device, so nothing is read on the host.
#include <vector>

#include "kiln/core/tensor.h"

namespace kiln::kernels {

void unscale_and_check_(const std::vector<Tensor>& grads, const Tensor& inv_scale, const Tensor& found_inf);

namespace cpu {
void unscale_and_check_(const std::vector<Tensor>& grads, const Tensor& inv_scale, const Tensor& found_inf);
}

}  // namespace kiln::kernels
