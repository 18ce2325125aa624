// Fused ops: one kernel where the plain composition runs several.
//   bias_gelu(x, b)               gelu(x + b)                       1 pass instead of 2
//   bias_dropout_add(x, b, r, p)  r + dropout(x + b, p)             1 pass instead of 3
//   fused_gelu(x)                 x * 0.5 * (1 + erf(x / sqrt 2))   1 pass instead of 5
//   linear_gelu(x, W, b)          gelu(x W^T + b)                   the cuBLASLt GELU epilogue
// Each backward is one fused kernel too (gradient and bias gradient in one pass; the dropout mask
// regenerated from its Philox (seed, offset), never stored). Under create_graph the backward is
// the composite formula of differentiable ops instead, so double backward works.
//
// Dtypes follow the unfused chain: operands are promoted together (x + b promotes), and the
// casts are differentiable, so an f32 bias still receives an f32 gradient.
#include "kiln/core/autocast.h"
#include "kiln/core/autograd.h"
#include "kiln/core/generator.h"
#include "kiln/core/shape.h"
#include "kiln/kernels/fused.h"
#include "kiln/nn/functional.h"

namespace kiln::nn::functional {

using autograd::SavedTensor;
using autograd::TensorList;
using kernels::GeluApprox;

namespace {

GeluApprox parse_approx(const char* op, const std::string& approximate) {
  KILN_CHECK(approximate == "none" || approximate == "tanh", op, ": approximate must be 'none' or 'tanh', got '",
             approximate, "'");
  return approximate == "tanh" ? GeluApprox::Tanh : GeluApprox::None;
}

Tensor contiguous_data(const Tensor& t) {
  if (!t.defined()) return t;
  return t.is_contiguous() ? t.detach() : t.detach().contiguous();
}

Tensor as_dtype(const Tensor& t, DType d) { return !t.defined() || t.dtype() == d ? t : t.to(d); }

// g * gelu'(pre) as differentiable ops (the create_graph backward).
Tensor gelu_grad_composite(const Tensor& g, const Tensor& pre, GeluApprox approx) {
  if (approx == GeluApprox::Tanh) {
    const double k = 0.79788456080286535588, c = 0.044715;
    Tensor t = kiln::tanh((pre + pre * pre * pre * c) * k);
    return g * ((1.0 + t) * 0.5 + pre * 0.5 * (1.0 - t * t) * ((pre * pre * (3.0 * c) + 1.0) * k));
  }
  Tensor cdf = (1.0 + kiln::erf(pre * 0.70710678118654752440)) * 0.5;
  Tensor pdf = kiln::exp(pre * pre * -0.5) * 0.39894228040143267794;
  return g * (cdf + pre * pdf);
}

void check_bias(const char* op, const Tensor& x, const Tensor& bias) {
  if (!bias.defined()) return;
  KILN_CHECK(x.dim() >= 1 && bias.dim() == 1 && bias.size(0) == x.size(-1), op, ": bias must be [",
             x.dim() >= 1 ? x.size(-1) : 0, "] (the input's last dimension), got bias sizes ", bias.sizes(),
             " for input sizes ", x.sizes());
  KILN_CHECK(bias.device() == x.device(), op, ": input is on ", x.device(), " but bias on ", bias.device());
  KILN_CHECK(is_floating(bias.dtype()), op, ": bias must be floating-point, got ", bias.dtype());
}

// The dropout mask applied to g (g * mask / (1 - p)); differentiable (its backward is itself),
// like dropout's.
Tensor apply_dropout_mask(const Tensor& g, double p, uint64_t seed, uint64_t offset) {
  Tensor out;
  {
    NoGradGuard ng;
    Tensor gc = contiguous_data(g);
    out = empty(g.sizes(), g.options());
    kernels::bias_dropout_add_backward(out, Tensor(), gc, p, seed, offset);
  }
  if (autograd::any_requires_grad({&g})) {
    autograd::record_function("DropoutMaskBackward", {&g}, {&out}, [=](const TensorList& gs) {
      return TensorList{apply_dropout_mask(gs[0], p, seed, offset)};
    });
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------- bias + GELU

Tensor bias_gelu(const Tensor& x_in, const Tensor& bias_in, const std::string& approximate) {
  const char* op = "bias_gelu";
  const GeluApprox approx = parse_approx(op, approximate);
  KILN_CHECK(x_in.defined(), op, ": input is undefined");
  KILN_CHECK(is_floating(x_in.dtype()), op, ": expected a floating-point input, got ", x_in.dtype(), " (sizes ",
             x_in.sizes(), ")");
  check_bias(op, x_in, bias_in);
  const DType dt = bias_in.defined() ? promote_types(x_in.dtype(), bias_in.dtype()) : x_in.dtype();
  const Tensor x = as_dtype(x_in, dt), bias = as_dtype(bias_in, dt);
  Tensor y;
  {
    NoGradGuard ng;
    y = empty(x.sizes(), x.options());
    kernels::bias_gelu(y, contiguous_data(x), contiguous_data(bias), approx);
  }
  if (autograd::any_requires_grad({&x, &bias})) {
    SavedTensor sx(x, "BiasGeluBackward");
    SavedTensor sb = bias.defined() ? SavedTensor(bias, "BiasGeluBackward") : SavedTensor();
    const bool want_db = bias.defined() && bias.requires_grad();
    autograd::record_function("BiasGeluBackward", {&x, &bias}, {&y},
                              autograd::fused_or_composite(
                                  [=](const TensorList& g) {
                                    Tensor xs = sx.get();
                                    Tensor bs = sb.defined() ? sb.get() : Tensor();
                                    Tensor dx = empty(xs.sizes(), xs.options());
                                    Tensor db = want_db ? empty(bs.sizes(), bs.options()) : Tensor();
                                    kernels::bias_gelu_backward(dx, db, contiguous_data(g[0]), contiguous_data(xs),
                                                                contiguous_data(bs), approx);
                                    return TensorList{dx, db};
                                  },
                                  [=](const TensorList& g) {
                                    Tensor xs = sx.get();
                                    Tensor bs = sb.defined() ? sb.get() : Tensor();
                                    // create_graph: composite formula
                                    Tensor dpre = gelu_grad_composite(g[0], bs.defined() ? xs + bs : xs, approx);
                                    return TensorList{dpre, want_db ? sum_to(dpre, bs.sizes()) : Tensor()};
                                  }));
  }
  return y;
}

// ---------------------------------------------------------------- bias + dropout + residual

Tensor bias_dropout_add(const Tensor& x_in, const Tensor& bias_in, const Tensor& residual_in, double p, bool training) {
  const char* op = "bias_dropout_add";
  KILN_CHECK(x_in.defined() && residual_in.defined(), op, ": input and residual must be defined");
  KILN_CHECK(p >= 0.0 && p <= 1.0, op, ": probability p must be in [0, 1], got ", p, " (input sizes ", x_in.sizes(),
             ")");
  KILN_CHECK(is_floating(x_in.dtype()) && is_floating(residual_in.dtype()), op,
             ": expected floating-point input and residual, got ", x_in.dtype(), " and ", residual_in.dtype());
  KILN_CHECK(residual_in.sizes() == x_in.sizes(), op, ": residual sizes ", residual_in.sizes(),
             " differ from input sizes ", x_in.sizes());
  KILN_CHECK(residual_in.device() == x_in.device(), op, ": input is on ", x_in.device(), " but residual on ",
             residual_in.device());
  check_bias(op, x_in, bias_in);
  DType dt = promote_types(x_in.dtype(), residual_in.dtype());
  if (bias_in.defined()) dt = promote_types(dt, bias_in.dtype());
  const Tensor x = as_dtype(x_in, dt), bias = as_dtype(bias_in, dt), residual = as_dtype(residual_in, dt);

  // The mask: exactly dropout's (same generator, same reservation of numel offsets), so
  // bias_dropout_add(x, b, r, p) == r + dropout(x + b, p) for the same seed. Nothing is drawn
  // in eval mode or for p == 0 (or p == 1, where everything is dropped), as in dropout.
  const double p_eff = training ? p : 0.0;
  uint64_t seed = 0, offset = 0;
  if (p_eff > 0.0 && p_eff < 1.0 && x.numel() > 0)
    std::tie(seed, offset) = default_generator(x.device()).reserve(static_cast<uint64_t>(x.numel()));

  Tensor y;
  {
    NoGradGuard ng;
    y = empty(x.sizes(), x.options());
    kernels::bias_dropout_add(y, contiguous_data(x), contiguous_data(bias), contiguous_data(residual), p_eff, seed,
                              offset);
  }
  if (autograd::any_requires_grad({&x, &bias, &residual})) {
    const bool want_dx = x.requires_grad();
    const bool want_db = bias.defined() && bias.requires_grad();
    const IntList bias_sizes = bias.defined() ? bias.sizes() : IntList{};
    autograd::record_function(
        "BiasDropoutAddBackward", {&x, &bias, &residual}, {&y},
        autograd::fused_or_composite(
            [=](const TensorList& g) {
              if (!want_dx && !want_db) return TensorList{Tensor(), Tensor(), g[0]};
              // nothing dropped (eval, p = 0): dx is g itself, no pass over memory
              if (p_eff <= 0.0)
                return TensorList{want_dx ? g[0] : Tensor(), want_db ? sum_to(g[0], bias_sizes) : Tensor(), g[0]};
              Tensor gc = contiguous_data(g[0]);
              Tensor dx = empty(gc.sizes(), gc.options());
              Tensor db = want_db ? empty(bias_sizes, gc.options()) : Tensor();
              kernels::bias_dropout_add_backward(dx, db, gc, p_eff, seed, offset);
              return TensorList{want_dx ? dx : Tensor(), db, g[0]};
            },
            [=](const TensorList& g) {
              if (!want_dx && !want_db) return TensorList{Tensor(), Tensor(), g[0]};
              // create_graph: differentiable mask application
              Tensor dx = apply_dropout_mask(g[0], p_eff, seed, offset);
              return TensorList{dx, want_db ? sum_to(dx, bias_sizes) : Tensor(), g[0]};
            }));
  }
  return y;
}

// ---------------------------------------------------------------- fused GELU

// The guide's x * 0.5 * (1 + erf(x / 1.41421)) as one kernel: kiln's GELU op is already the
// single fused kernel (the GeluErf functor, forward and backward), so this is that op under the
// guide's name; bench/cuda/fused.cu and bench/cpu/fused.cpp compare it with the 5-op chain.
Tensor fused_gelu(const Tensor& x) {
  KILN_CHECK(x.defined(), "fused_gelu: input is undefined");
  KILN_CHECK(is_floating(x.dtype()), "fused_gelu: expected a floating-point input, got ", x.dtype(), " (sizes ",
             x.sizes(), ")");
  return kiln::gelu(x, "none");
}

// ---------------------------------------------------------------- linear + bias + GELU

Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias, const std::string& approximate) {
  const char* op = "linear_gelu";
  const GeluApprox approx = parse_approx(op, approximate);
  if (auto out = amp::autocast_rerun(amp::Policy::LowPrecision, {x, weight, bias},
                                     [&](const auto& a) { return linear_gelu(a[0], a[1], a[2], approximate); }))
    return *out;
  KILN_CHECK(x.defined() && weight.defined(), op, ": input and weight must be defined");
  KILN_CHECK(weight.dim() == 2, op, ": weight must be [out_features, in_features], got sizes ", weight.sizes());
  KILN_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), op, ": input sizes ", x.sizes(),
             " do not match weight sizes ", weight.sizes(), " (expected input [..., ", weight.size(1), "])");
  if (!bias.defined()) return kiln::gelu(linear(x, weight), approximate);  // no bias: nothing to fuse it with
  KILN_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), op, ": bias sizes ", bias.sizes(),
             " do not match weight sizes ", weight.sizes(), " (expected [", weight.size(0), "])");
  KILN_CHECK(is_floating(x.dtype()) && weight.dtype() == x.dtype() && bias.dtype() == x.dtype(), op,
             ": input, weight and bias must share one floating dtype, got ", x.dtype(), ", ", weight.dtype(), ", ",
             bias.dtype());
  KILN_CHECK(weight.device() == x.device() && bias.device() == x.device(), op,
             ": tensors on different devices: ", x.device(), ", ", weight.device(), ", ", bias.device());

  const int64_t K = weight.size(1), N = weight.size(0);
  IntList out_sizes = x.sizes();
  out_sizes.back() = N;
  const bool needs_grad = autograd::any_requires_grad({&x, &weight, &bias});
  Tensor x2, out, pre;
  {
    NoGradGuard ng;
    x2 = x.detach().reshape({-1, K});
    out = empty({x2.size(0), N}, x.options());
    if (needs_grad) pre = empty({x2.size(0), N}, x.options());
    kernels::linear_epilogue(out, x2, weight.detach(), contiguous_data(bias), kernels::Epilogue::BiasGelu, pre, approx);
  }
  Tensor y = out.view(out_sizes);
  if (needs_grad) {
    SavedTensor sx(x, "LinearGeluBackward"), sw(weight, "LinearGeluBackward"), sb(bias, "LinearGeluBackward");
    const bool gx = x.requires_grad(), gw = weight.requires_grad(), gb = bias.requires_grad();
    autograd::record_function(
        "LinearGeluBackward", {&x, &weight, &bias}, {&y},
        autograd::fused_or_composite(
            [=](const TensorList& g) {
              Tensor xs = sx.get(), ws = sw.get(), bs = sb.get();
              // dpre = g * gelu'(pre) and the bias gradient in one pass, then two GEMMs.
              Tensor g2 = contiguous_data(g[0]).view({-1, N});
              Tensor dpre = empty(g2.sizes(), g2.options());
              Tensor db = gb ? empty({N}, g2.options()) : Tensor();
              kernels::bias_gelu_backward(dpre, db, g2, pre, Tensor(), approx);
              Tensor dx = gx ? mm(dpre, ws.detach()).view(xs.sizes()) : Tensor();
              Tensor dw = gw ? mm(dpre.t(), xs.detach().reshape({-1, K})) : Tensor();
              return TensorList{dx, dw, db};
            },
            [=](const TensorList& g) {
              Tensor xs = sx.get(), ws = sw.get(), bs = sb.get();
              // create_graph: composite formula on the saved inputs
              Tensor xf = xs.reshape({-1, K});
              Tensor dpre = gelu_grad_composite(g[0].reshape({-1, N}), mm(xf, ws.t()) + bs, approx);
              return TensorList{gx ? mm(dpre, ws).view(xs.sizes()) : Tensor(), gw ? mm(dpre.t(), xf) : Tensor(),
                                gb ? dpre.sum({0}) : Tensor()};
            }));
  }
  return y;
}

}  // namespace kiln::nn::functional
