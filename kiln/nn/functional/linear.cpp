// linear: y = x @ weight^T + bias for x of any leading dims. kiln::matmul folds the leading dims
// of x into the rows of one GEMM (weight^T is a transposed view, mapped into Eigen without a
// copy); the bias gradient is the sum of the output gradient over the leading dims (sum_to in the
// add's backward, a vectorized "reduce leading dims" kernel).
#include "kiln/core/autocast.h"
#include "kiln/core/autograd.h"
#include "kiln/nn/functional.h"

namespace kiln::nn::functional {

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (auto out = amp::autocast_rerun(amp::Policy::LowPrecision, {x, weight, bias},
                                     [](const auto& a) { return linear(a[0], a[1], a[2]); }))
    return *out;
  KILN_CHECK(x.defined() && weight.defined(), "linear: input and weight must be defined");
  KILN_CHECK(weight.dim() == 2, "linear: weight must be [out_features, in_features], got sizes ", weight.sizes());
  KILN_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), "linear: input sizes ", x.sizes(),
             " do not match weight sizes ", weight.sizes(), " (expected input [..., ", weight.size(1), "])");
  KILN_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)), "linear: bias sizes ",
             bias.defined() ? bias.sizes() : IntList{}, " do not match weight sizes ", weight.sizes(), " (expected [",
             weight.size(0), "])");
  Tensor y = x.dim() == 2 ? mm(x, weight.t()) : matmul(x, weight.t());
  return bias.defined() ? y + bias : y;
}

}  // namespace kiln::nn::functional
