#pragma once
// Gradient clipping, as torch.nn.utils.clip_grad_norm_ / clip_grad_value_.
//
//   loss.backward();
//   kiln::Tensor norm = kiln::optim::clip_grad_norm(net.parameters(), 1.0);  // a 0-dim tensor
//   opt.step();
//
// clip_grad_norm computes the total norm of all gradients in one multi-tensor reduction, then
// scales every gradient by clip_coef = min(1, max_norm / (norm + 1e-6)), computed as a tensor on the
// gradients' device and applied by one multi-tensor kernel: nothing is read back to the host, so the
// step stays asynchronous. Read the returned norm with item() only when logging.
#include <limits>
#include <vector>

#include "kiln/core/tensor.h"

namespace kiln::optim {

constexpr double kInfNorm = std::numeric_limits<double>::infinity();

// Parameters without a gradient are skipped. norm_type: any p > 0, or kInfNorm (max |g|).
// Returns the total norm (before clipping) as a 0-dim tensor: f64 if any gradient is f64, else f32;
// 0 when no parameter has a gradient. error_if_nonfinite = true reads the norm on the host (a sync)
// and throws kiln::Error when it is NaN or infinite, leaving the gradients unchanged.
Tensor clip_grad_norm(const std::vector<Tensor>& parameters, double max_norm, double norm_type = 2.0,
                      bool error_if_nonfinite = false);

// Clamps every gradient to [-clip_value, clip_value] in place.
void clip_grad_value(const std::vector<Tensor>& parameters, double clip_value);

}  // namespace kiln::optim
