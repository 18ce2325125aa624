// linear: y = x @ weight^T + bias for x of any leading dims, folded into the rows of one GEMM
// (weight^T is a transposed view, read without a copy). With a bias of the input's dtype the bias
// is the GEMM's epilogue (kernels::linear_epilogue: cuBLASLt's bias epilogue on the GPU, one pass
// after the GEMM on the CPU), not a separate add, and the backward is one node: two GEMMs and the
// bias gradient as the column sum of the output gradient.
#include "kiln/core/autocast.h"
#include "kiln/core/autograd.h"
#include "kiln/kernels/fused.h"
#include "kiln/nn/functional.h"

namespace kiln::nn::functional {

using autograd::SavedTensor;
using autograd::TensorList;

namespace {

Tensor linear_bias_epilogue(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const int64_t K = weight.size(1), N = weight.size(0);
  IntList out_sizes = x.sizes();
  out_sizes.back() = N;
  Tensor out;
  {
    NoGradGuard ng;
    out = empty({x.numel() / K, N}, x.options());
    const Tensor b = bias.is_contiguous() ? bias.detach() : bias.detach().contiguous();
    kernels::linear_epilogue(out, x.detach().reshape({-1, K}), weight.detach(), b, kernels::Epilogue::Bias);
  }
  Tensor y = out.view(out_sizes);
  if (autograd::any_requires_grad({&x, &weight, &bias})) {
    SavedTensor sx(x, "LinearBackward"), sw(weight, "LinearBackward");
    const bool gx = x.requires_grad(), gw = weight.requires_grad(), gb = bias.requires_grad();
    // differentiable ops only, so create_graph needs no second formula
    autograd::record_function("LinearBackward", {&x, &weight, &bias}, {&y}, [=](const TensorList& g) {
      const Tensor xs = sx.get(), ws = sw.get();
      const Tensor g2 = g[0].reshape({-1, N});
      return TensorList{gx ? mm(g2, ws).view(xs.sizes()) : Tensor(), gw ? mm(g2.t(), xs.reshape({-1, K})) : Tensor(),
                        gb ? g2.sum({0}) : Tensor()};
    });
  }
  return y;
}

}  // namespace

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
  if (bias.defined() && is_floating(x.dtype()) && weight.dtype() == x.dtype() && bias.dtype() == x.dtype() &&
      weight.device() == x.device() && bias.device() == x.device() && x.numel() > 0)
    return linear_bias_epilogue(x, weight, bias);
  Tensor y = x.dim() == 2 ? mm(x, weight.t()) : matmul(x, weight.t());
  return bias.defined() ? y + bias : y;
}

}  // namespace kiln::nn::functional
