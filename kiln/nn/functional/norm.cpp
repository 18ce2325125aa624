// batch_norm (and batch_norm_relu, the same kernels with a ReLU), layer_norm, group_norm, rms_norm:
// argument checks,
// the fused kernels of kiln/kernels/norm.h, running-statistics updates, and the recorded
// backward.
// Backward uses the fused backward kernels; when a graph of the backward itself is being recorded
// (create_graph) it uses a composite formula of differentiable ops instead, so second
// derivatives work.
#include <numeric>

#include "kiln/core/autocast.h"
#include "kiln/core/autograd.h"
#include "kiln/core/shape.h"
#include "kiln/kernels/activation.h"
#include "kiln/kernels/attention.h"
#include "kiln/kernels/dropout.h"
#include "kiln/kernels/norm.h"
#include "kiln/nn/functional.h"
#include "kiln/nn/functional/detail.h"

namespace kiln::nn::functional {

using autograd::SavedTensor;
using autograd::TensorList;

namespace {

Tensor contig(const Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

int64_t prod(const IntList& s) { return std::accumulate(s.begin(), s.end(), int64_t{1}, std::multiplies<int64_t>()); }

void check_input(const char* op, const Tensor& x) {
  KILN_CHECK(x.defined(), op, ": input is undefined");
  KILN_CHECK(is_floating(x.dtype()), op, ": expected a floating-point input, got ", x.dtype(), " (sizes ", x.sizes(),
             ")");
}

// weight / bias / running stats: defined => same device and dtype family as x, `numel` elements.
void check_param(const char* op, const char* what, const Tensor& p, const Tensor& x, const IntList& expected,
                 bool same_dtype) {
  if (!p.defined()) return;
  KILN_CHECK(p.device() == x.device(), op, ": ", what, " is on ", p.device(), " but input (sizes ", x.sizes(),
             ") is on ", x.device());
  KILN_CHECK(p.sizes() == expected || (expected.size() == 1 && p.numel() == expected[0] && p.dim() == 1), op, ": ",
             what, " has sizes ", p.sizes(), " but expected ", expected, " for input sizes ", x.sizes());
  KILN_CHECK(!same_dtype || p.dtype() == x.dtype(), op, ": ", what, " has dtype ", p.dtype(), " but input has dtype ",
             x.dtype());
}

TensorOptions stat_opts(const Tensor& x) {
  return TensorOptions().dtype(kernels::norm_stat_dtype(x.dtype())).device(x.device());
}

// A channels-last strided [N, C, *] tensor: permuting C last makes it contiguous.
bool is_channels_last(const Tensor& x) {
  if (x.dim() < 3 || x.is_contiguous()) return false;
  IntList perm{0};
  for (int64_t d = 2; d < x.dim(); ++d) perm.push_back(d);
  perm.push_back(1);
  return x.permute(perm).is_contiguous();
}

IntList channels_last_perm(int64_t ndim) {
  IntList perm{0};
  for (int64_t d = 2; d < ndim; ++d) perm.push_back(d);
  perm.push_back(1);
  return perm;
}
IntList inverse_perm(const IntList& p) {
  IntList inv(p.size());
  for (size_t i = 0; i < p.size(); ++i) inv[p[i]] = static_cast<int64_t>(i);
  return inv;
}

// The [N, C, S] (or, channels-last, [N*S, C]) operand the batch-norm kernel runs on, and how to
// bring a kernel result back to x's shape and layout.
struct BnLayout {
  bool cl = false;
  IntList perm, inv;
  IntList permuted_sizes;
  Tensor to_kernel(const Tensor& t) const {  // t has x's shape
    if (!cl) return contig(t);
    Tensor p = t.permute(perm);
    return contig(p).reshape({-1, p.size(-1)});
  }
  Tensor from_kernel(const Tensor& t) const {  // t in kernel layout
    if (!cl) return t;
    return t.view(permuted_sizes).permute(inv);
  }
};

BnLayout bn_layout(const Tensor& x) {
  BnLayout l;
  l.cl = is_channels_last(x);
  if (l.cl) {
    l.perm = channels_last_perm(x.dim());
    l.inv = inverse_perm(l.perm);
    l.permuted_sizes = x.permute(l.perm).sizes();
  }
  return l;
}

}  // namespace

// batch_norm's argument checks for an input of `sizes` ([N, C, *]) on like's device with like's
// dtype (like: the input itself, or the input of the conv that produces it).
void detail::check_batch_norm_args(const char* op, const Tensor& like, const IntList& sizes, const Tensor& running_mean,
                                   const Tensor& running_var, const Tensor& weight, const Tensor& bias, bool training,
                                   double eps) {
  const int64_t C = sizes[1];
  check_param(op, "weight", weight, like, {C}, true);
  check_param(op, "bias", bias, like, {C}, true);
  check_param(op, "running_mean", running_mean, like, {C}, false);
  check_param(op, "running_var", running_var, like, {C}, false);
  KILN_CHECK(running_mean.defined() == running_var.defined(), op,
             ": pass both running_mean and running_var or neither");
  KILN_CHECK(training || running_mean.defined(), op,
             ": eval mode (training = false) needs running_mean and running_var (input sizes ", sizes, ")");
  KILN_CHECK(eps > 0 || !training, op, ": eps must be positive, got ", eps);
  int64_t M = 1;
  for (size_t d = 0; d < sizes.size(); ++d)
    if (d != 1) M *= sizes[d];
  KILN_CHECK(!training || M > 1, op, ": expected more than 1 value per channel when training, got input sizes ", sizes);
}

// running = (1 - momentum) * running + momentum * batch, with the unbiased batch variance of
// M values per channel.
void detail::update_running_stats(const Tensor& running_mean, const Tensor& running_var, const Tensor& mean,
                                  const Tensor& var, int64_t M, double momentum) {
  Tensor unbiased = var * (static_cast<double>(M) / static_cast<double>(M - 1));
  Tensor rm = running_mean, rv = running_var;  // handles to the same tensors
  rm.mul_(1.0 - momentum).add_(mean.to(rm.dtype()), momentum);
  rv.mul_(1.0 - momentum).add_(unbiased.to(rv.dtype()), momentum);
}

TensorOptions detail::batch_norm_stat_options(const Tensor& x) { return stat_opts(x); }

// ------------------------------------------------------------------------------ batch_norm

namespace {

// batch_norm(_relu)'s backward as differentiable ops (the create_graph backward): the input,
// weight and bias gradients for the output gradient gy.
TensorList batch_norm_grad_composite(const Tensor& gy_in, const Tensor& xs, const Tensor& w, const Tensor& b,
                                     const Tensor& mean, const Tensor& invstd, bool training, double eps, bool relu,
                                     bool gx, bool gw, bool gb) {
  const int64_t C = xs.size(1);
  const bool has_w = w.defined(), has_b = b.defined();
  IntList dims{0};
  IntList bshape(xs.dim(), 1);
  bshape[1] = C;
  for (int64_t d = 2; d < xs.dim(); ++d) dims.push_back(d);
  Tensor m, is;
  if (training) {
    m = xs.mean(dims, true);
    Tensor xc = xs - m;
    is = ((xc * xc).mean(dims, true) + eps).rsqrt();
  } else {
    m = mean.view(bshape).to(xs.dtype());
    is = invstd.view(bshape).to(xs.dtype());
  }
  Tensor xhat = (xs - m) * is;
  Tensor gy = gy_in;
  if (relu) {  // relu's backward: g where the batch-norm output is positive (a constant mask)
    Tensor pre = has_w ? xhat.detach() * w.detach().view(bshape) : xhat.detach();
    if (has_b) pre = pre + b.detach().view(bshape);
    gy = gy * pre.gt(0.0).to(gy.dtype());
  }
  Tensor gwt = has_w ? gy * w.view(bshape) : gy;
  Tensor dx;
  if (gx) dx = training ? is * (gwt - gwt.mean(dims, true) - xhat * (gwt * xhat).mean(dims, true)) : gwt * is;
  return TensorList{dx, gw ? (gy * xhat).sum(dims) : Tensor(), gb ? gy.sum(dims) : Tensor()};
}

// batch_norm; with relu the fused batch_norm_relu: relu(batch_norm(...)) in the same kernels,
// whose backward recomputes the ReLU mask from the saved input.
Tensor batch_norm_impl(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                       const Tensor& bias, bool training, double momentum, double eps, bool relu) {
  const char* op = relu ? "batch_norm_relu" : "batch_norm";
  if (auto out = amp::autocast_rerun(amp::Policy::F32, {x}, [&](const auto& a) {
        return batch_norm_impl(a[0], running_mean, running_var, weight, bias, training, momentum, eps, relu);
      }))
    return *out;
  const char* node = relu ? "BatchNormReluBackward" : "BatchNormBackward";
  check_input(op, x);
  KILN_CHECK(x.dim() >= 2, op, ": expected input of shape [N, C] or [N, C, *], got sizes ", x.sizes());
  detail::check_batch_norm_args(op, x, x.sizes(), running_mean, running_var, weight, bias, training, eps);
  const int64_t C = x.size(1);
  const int64_t M = x.numel() / std::max<int64_t>(C, 1);

  const BnLayout lay = bn_layout(x);
  Tensor xk, y, mean, invstd, var;
  {
    NoGradGuard ng;
    xk = lay.to_kernel(x.detach());
    y = empty(xk.sizes(), xk.options());
    if (training) {
      mean = empty({C}, stat_opts(x));
      invstd = empty({C}, stat_opts(x));
      var = empty({C}, stat_opts(x));
    } else {
      // A copy, so that later in-place updates of the running stats cannot change this backward.
      mean = running_mean.detach().to(kernels::norm_stat_dtype(x.dtype())).clone();
      invstd = (running_var.detach().to(kernels::norm_stat_dtype(x.dtype())) + eps).rsqrt();
    }
    const Tensor wk = weight.defined() ? contig(weight.detach()) : Tensor();
    const Tensor bk = bias.defined() ? contig(bias.detach()) : Tensor();
    kernels::batch_norm_forward(y, xk, wk, bk, mean, invstd, var, training, eps, relu);
    if (training && running_mean.defined())
      detail::update_running_stats(running_mean, running_var, mean, var, M, momentum);
  }
  Tensor out = lay.from_kernel(y);
  if (autograd::any_requires_grad({&x, &weight, &bias})) {
    const bool gx = x.requires_grad(), gw = weight.defined() && weight.requires_grad(),
               gb = bias.defined() && bias.requires_grad();
    // (an undefined weight or bias is saved as undefined; the ReLU mask needs the bias)
    SavedTensor sx(x, node), sw(weight, node), sb(relu ? bias : Tensor(), node);
    autograd::record_function(
        node, {&x, &weight, &bias}, {&out},
        autograd::fused_or_composite(
            [=](const TensorList& g) {
              Tensor xs = sx.get(), w = sw.get(), b = sb.get();
              Tensor gk = lay.to_kernel(g[0]);
              Tensor xk2 = lay.to_kernel(xs.detach());
              Tensor dx = gx ? empty(xk2.sizes(), xk2.options()) : Tensor();
              Tensor dw = gw ? empty({C}, xs.options()) : Tensor();
              Tensor db = gb ? empty({C}, xs.options()) : Tensor();
              kernels::batch_norm_backward(dx, dw, db, gk, xk2, w.defined() ? contig(w.detach()) : Tensor(), mean,
                                           invstd, training, relu, b.defined() ? contig(b.detach()) : Tensor());
              return TensorList{gx ? lay.from_kernel(dx) : Tensor(), dw, db};
            },
            [=](const TensorList& g) {
              Tensor xs = sx.get(), w = sw.get(), b = sb.get();
              return batch_norm_grad_composite(g[0], xs, w, b, mean, invstd, training, eps, relu, gx, gw, gb);
            }));
  }
  return out;
}

}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum, double eps) {
  return batch_norm_impl(x, running_mean, running_var, weight, bias, training, momentum, eps, /*relu=*/false);
}

Tensor batch_norm_relu(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                       const Tensor& bias, bool training, double momentum, double eps) {
  return batch_norm_impl(x, running_mean, running_var, weight, bias, training, momentum, eps, /*relu=*/true);
}

// ------------------------------------------------------------------------------ row norms

namespace {

// Normalises x over its trailing elements in groups of K (rows = numel / K), then applies the
// flat [K] weight/bias (either may be undefined; rms ignores bias).
Tensor row_norm(const char* name, const Tensor& x, int64_t K, const Tensor& weight, const Tensor& bias, bool rms,
                double eps) {
  const int64_t R = K > 0 ? x.numel() / K : 0;
  Tensor wf = weight.defined() ? weight.reshape({K}) : Tensor();
  Tensor bf = bias.defined() ? bias.reshape({K}) : Tensor();
  Tensor xc, y, mean, invstd;
  {
    NoGradGuard ng;
    xc = contig(x.detach());
    y = empty(x.sizes(), x.options());
    mean = rms ? Tensor() : empty({R}, stat_opts(x));
    invstd = empty({R}, stat_opts(x));
    kernels::row_norm_forward(y, mean, invstd, xc, wf.defined() ? contig(wf.detach()) : Tensor(),
                              bf.defined() ? contig(bf.detach()) : Tensor(), rms, eps);
  }
  if (autograd::any_requires_grad({&x, &wf, &bf})) {
    const bool gx = x.requires_grad(), gw = wf.defined() && wf.requires_grad(), gb = bf.defined() && bf.requires_grad();
    SavedTensor sx(x, name), sw(wf, name);  // an undefined weight is saved as undefined
    const IntList xsizes = x.sizes();
    autograd::record_function(
        name, {&x, &wf, &bf}, {&y},
        autograd::fused_or_composite(
            [=](const TensorList& g) {
              Tensor xs = sx.get(), w = sw.get();
              Tensor gc = contig(g[0]);
              Tensor xk = contig(xs.detach());
              Tensor dx = gx ? empty(xsizes, xs.options()) : Tensor();
              Tensor dw = gw ? empty({K}, xs.options()) : Tensor();
              Tensor db = gb ? empty({K}, xs.options()) : Tensor();
              kernels::row_norm_backward(dx, dw, db, gc, xk, w.defined() ? contig(w.detach()) : Tensor(), mean, invstd,
                                         rms);
              return TensorList{dx, dw, db};
            },
            [=](const TensorList& g) {
              Tensor xs = sx.get(), w = sw.get();
              // create_graph: composite formula on [R, K]
              Tensor x2 = xs.reshape({R, K}), g2 = g[0].reshape({R, K});
              Tensor xhat, is;
              if (rms) {
                is = ((x2 * x2).mean({1}, true) + eps).rsqrt();
                xhat = x2 * is;
              } else {
                Tensor xc2 = x2 - x2.mean({1}, true);
                is = ((xc2 * xc2).mean({1}, true) + eps).rsqrt();
                xhat = xc2 * is;
              }
              Tensor gwt = w.defined() ? g2 * w : g2;
              Tensor dx;
              if (gx) {
                Tensor inner = gwt - xhat * (gwt * xhat).mean({1}, true);
                if (!rms) inner = inner - gwt.mean({1}, true);
                dx = (is * inner).reshape(xsizes);
              }
              return TensorList{dx, gw ? (g2 * xhat).sum({0}) : Tensor(), gb ? g2.sum({0}) : Tensor()};
            }));
  }
  return y;
}

// Checks that normalized_shape names x's trailing dims; returns their product.
int64_t check_normalized_shape(const char* op, const Tensor& x, const IntList& normalized_shape) {
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  bool ok = k >= 1 && x.dim() >= k;
  for (int64_t i = 0; ok && i < k; ++i) ok = x.size(x.dim() - k + i) == normalized_shape[i];
  KILN_CHECK(ok, op, ": normalized_shape ", normalized_shape,
             " must match the trailing dimensions of the input, got input sizes ", x.sizes());
  return prod(normalized_shape);
}

}  // namespace

Tensor layer_norm(const Tensor& x, const IntList& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  if (auto out = amp::autocast_rerun(
          amp::Policy::F32, {x}, [&](const auto& a) { return layer_norm(a[0], normalized_shape, weight, bias, eps); }))
    return *out;
  const char* op = "layer_norm";
  check_input(op, x);
  const int64_t K = check_normalized_shape(op, x, normalized_shape);
  check_param(op, "weight", weight, x, normalized_shape, true);
  check_param(op, "bias", bias, x, normalized_shape, true);
  return row_norm("LayerNormBackward", x, K, weight, bias, false, eps);
}

Tensor rms_norm(const Tensor& x, const IntList& normalized_shape, const Tensor& weight, double eps) {
  if (auto out = amp::autocast_rerun(amp::Policy::F32, {x},
                                     [&](const auto& a) { return rms_norm(a[0], normalized_shape, weight, eps); }))
    return *out;
  const char* op = "rms_norm";
  check_input(op, x);
  const int64_t K = check_normalized_shape(op, x, normalized_shape);
  check_param(op, "weight", weight, x, normalized_shape, true);
  return row_norm("RmsNormBackward", x, K, weight, Tensor(), true, eps);
}

Tensor group_norm(const Tensor& x, int64_t num_groups, const Tensor& weight, const Tensor& bias, double eps) {
  if (auto out = amp::autocast_rerun(amp::Policy::F32, {x},
                                     [&](const auto& a) { return group_norm(a[0], num_groups, weight, bias, eps); }))
    return *out;
  const char* op = "group_norm";
  check_input(op, x);
  KILN_CHECK(x.dim() >= 2, op, ": expected input of shape [N, C, *], got sizes ", x.sizes());
  const int64_t N = x.size(0), C = x.size(1);
  KILN_CHECK(num_groups > 0 && C % num_groups == 0, op, ": the number of channels (", C, ", input sizes ", x.sizes(),
             ") must be divisible by num_groups (", num_groups, ")");
  check_param(op, "weight", weight, x, {C}, true);
  check_param(op, "bias", bias, x, {C}, true);
  // Statistics per (sample, group): rows of [N * G, C / G * S]; the per-channel affine follows.
  const int64_t K = N > 0 ? x.numel() / (N * num_groups) : 0;
  Tensor xr = x.reshape({N * num_groups, K});
  Tensor y = row_norm("GroupNormBackward", xr, K, Tensor(), Tensor(), false, eps).reshape(x.sizes());
  if (!weight.defined() && !bias.defined()) return y;
  IntList bshape(x.dim(), 1);
  bshape[1] = C;
  if (weight.defined()) y = y * weight.view(bshape);
  if (bias.defined()) y = y + bias.view(bshape);
  return y;
}

}  // namespace kiln::nn::functional
