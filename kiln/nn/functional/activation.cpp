// leaky_relu: a one-pass CPU kernel forward and backward (kiln/kernels/cpu/activation.cpp); under
// create_graph the backward is the differentiable where(x > 0, g, slope * g).
#include "kiln/core/autograd.h"
#include "kiln/kernels/activation.h"
#include "kiln/kernels/attention.h"
#include "kiln/kernels/dropout.h"
#include "kiln/kernels/norm.h"
#include "kiln/nn/functional.h"

namespace kiln::nn::functional {

using autograd::SavedTensor;
using autograd::TensorList;

Tensor leaky_relu(const Tensor& x, double negative_slope) {
  KILN_CHECK(x.defined(), "leaky_relu: input is undefined");
  KILN_CHECK(is_floating(x.dtype()), "leaky_relu: expected a floating-point input, got ", x.dtype(), " (sizes ",
             x.sizes(), ")");
  Tensor y;
  {
    NoGradGuard ng;
    Tensor xc = x.is_contiguous() ? x.detach() : x.detach().contiguous();
    y = empty(x.sizes(), x.options());
    kernels::leaky_relu(y, xc, negative_slope);
  }
  if (autograd::any_requires_grad({&x})) {
    SavedTensor sx(x, "LeakyReluBackward");
    autograd::record_function("LeakyReluBackward", {&x}, {&y},
                              autograd::fused_or_composite(
                                  [=](const TensorList& g) {
                                    Tensor xs = sx.get();
                                    Tensor gc = g[0].is_contiguous() ? g[0] : g[0].contiguous();
                                    Tensor xc = xs.is_contiguous() ? xs.detach() : xs.detach().contiguous();
                                    Tensor dx = empty(xs.sizes(), xs.options());
                                    kernels::leaky_relu_backward(dx, gc, xc, negative_slope);
                                    return TensorList{dx};
                                  },
                                  [=](const TensorList& g) {
                                    Tensor xs = sx.get();
                                    return TensorList{where(xs > 0.0, g[0], g[0] * negative_slope)};
                                  }));
  }
  return y;
}

}  // namespace kiln::nn::functional
