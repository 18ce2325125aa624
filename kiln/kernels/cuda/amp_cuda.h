#pragma once
// CUDA versions of the loss scaler's kernels (kernels/cuda/amp.cu), same contracts as
// kiln/kernels/amp_kernels.h. Only declared when kiln is built with CUDA.
#include "kiln/kernels/amp_kernels.h"

namespace kiln::kernels::cuda {

void unscale_and_check_(const std::vector<Tensor>& grads, const Tensor& inv_scale, const Tensor& found_inf);
void amp_update_scale_(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                       double growth_factor, double backoff_factor, int64_t growth_interval);

}  // namespace kiln::kernels::cuda
