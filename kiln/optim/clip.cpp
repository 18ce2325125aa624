#include "kiln/optim/clip.h"

#include <cmath>

#include "kiln/core/autograd.h"
#include "kiln/core/error.h"
#include "kiln/kernels/multi_tensor.h"

namespace kiln::optim {

namespace {
std::vector<Tensor> grads_of(const std::vector<Tensor>& parameters) {
  std::vector<Tensor> grads;
  for (const Tensor& p : parameters)
    if (p.defined() && p.grad().defined()) grads.push_back(p.grad());
  return grads;
}
}  // namespace

Tensor clip_grad_norm(const std::vector<Tensor>& parameters, double max_norm, double norm_type,
                      bool error_if_nonfinite) {
  KILN_CHECK(norm_type > 0.0, "clip_grad_norm: norm_type must be positive or inf, got ", norm_type);
  KILN_CHECK(max_norm >= 0.0, "clip_grad_norm: max_norm must be >= 0, got ", max_norm);
  NoGradGuard no_grad;
  std::vector<Tensor> grads = grads_of(parameters);
  if (grads.empty()) return zeros({});
  Tensor total = kernels::multi_tensor_norm(grads, norm_type);
  if (error_if_nonfinite) {
    double v = total.item<double>();
    KILN_CHECK(std::isfinite(v), "clip_grad_norm: the total norm of order ", norm_type,
               " of the gradients is non-finite (", v, "), so it cannot be clipped");
  }
  // clip_coef = min(max_norm / (norm + 1e-6), 1), a device tensor; NaN propagates like PyTorch.
  Tensor coef = (max_norm / (total + 1e-6)).clamp_max(1.0);
  kernels::multi_tensor_scale_(grads, coef);
  return total;
}

void clip_grad_value(const std::vector<Tensor>& parameters, double clip_value) {
  KILN_CHECK(clip_value >= 0.0, "clip_grad_value: clip_value must be >= 0, got ", clip_value);
  NoGradGuard no_grad;
  for (Tensor& g : grads_of(parameters)) g.clamp_(-clip_value, clip_value);
}

}  // namespace kiln::optim
