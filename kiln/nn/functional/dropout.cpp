// dropout: the mask comes from the device's Philox generator. The op reserves numel offsets and
// element i (row-major) keeps its value when uniform(seed, offset + i) >= p. The mask is never
// stored: the backward re-runs the same kernel on the gradient with the same (seed, offset), which
// gives the identical mask (and is itself differentiable, so double backward works).
#include "kiln/core/autograd.h"
#include "kiln/core/generator.h"
#include "kiln/kernels/activation.h"
#include "kiln/kernels/attention.h"
#include "kiln/kernels/dropout.h"
#include "kiln/kernels/norm.h"
#include "kiln/nn/functional.h"

namespace kiln::nn::functional {

using autograd::TensorList;

namespace {

Tensor dropout_with(const Tensor& x, double p, uint64_t seed, uint64_t offset) {
  Tensor out;
  {
    NoGradGuard ng;
    Tensor xc = x.is_contiguous() ? x.detach() : x.detach().contiguous();
    out = empty(x.sizes(), x.options());
    if (p >= 1.0) out.zero_();
    else kernels::dropout(out, xc, p, seed, offset);
  }
  if (autograd::any_requires_grad({&x})) {
    autograd::record_function("DropoutBackward", {&x}, {&out},
                              [=](const TensorList& g) { return TensorList{dropout_with(g[0], p, seed, offset)}; });
  }
  return out;
}

}  // namespace

Tensor dropout(const Tensor& x, double p, bool training) {
  KILN_CHECK(x.defined(), "dropout: input is undefined");
  KILN_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability p must be in [0, 1], got ", p, " (input sizes ", x.sizes(),
             ")");
  if (!training || p == 0.0 || x.numel() == 0) return x;
  KILN_CHECK(is_floating(x.dtype()), "dropout: expected a floating-point input, got ", x.dtype(), " (sizes ", x.sizes(),
             ")");
  uint64_t seed = 0, offset = 0;
  if (p < 1.0) std::tie(seed, offset) = default_generator(x.device()).reserve(static_cast<uint64_t>(x.numel()));
  return dropout_with(x, p, seed, offset);
}

}  // namespace kiln::nn::functional
