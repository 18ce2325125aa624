// batch_norm (and the fused batch_norm_relu), layer_norm, group_norm, rms_norm: argument checks,
// the fused kernels of kiln/kernels/norm.h, running-statistics updates, and the recorded
// backward.
// Backward uses the fused backward kernels; when a graph of the backward itself is being recorded
// (create_graph) it uses a composite formula of differentiable ops instead, so second
// derivatives work.
#include <numeric>
#include <optional>

#include "kiln/core/autocast.h"
#include "kiln/core/autograd.h"
#include "kiln/core/cpu_conv.h"
#include "kiln/core/shape.h"
#include "kiln/kernels/activation.h"
#include "kiln/kernels/attention.h"
#include "kiln/kernels/dropout.h"
#include "kiln/kernels/norm.h"
#include "kiln/kernels/conv_block.h"
#include "kiln/nn/functional.h"
#include "kiln/nn/functional/detail.h"

namespace kiln::nn::functional {

using autograd::SavedTensor;
using autograd::TensorList;

namespace {

Tensor contig(const Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

int64_t prod(const IntList& s) {
  return std::accumulate(s.begin(), s.end(), int64_t{1}, std::multiplies<int64_t>());
}

void check_input(const char* op, const Tensor& x) {
  KILN_CHECK(x.defined(), op, ": input is undefined");
  KILN_CHECK(is_floating(x.dtype()), op, ": expected a floating-point input, got ", x.dtype(),
             " (sizes ", x.sizes(), ")");
}

// weight / bias / running stats: defined => same device and dtype family as x, `numel` elements.
void check_param(const char* op, const char* what, const Tensor& p, const Tensor& x,
                 const IntList& expected, bool same_dtype) {
  if (!p.defined()) return;
  KILN_CHECK(p.device() == x.device(), op, ": ", what, " is on ", p.device(), " but input (sizes ",
             x.sizes(), ") is on ", x.device());
  KILN_CHECK(p.sizes() == expected || (expected.size() == 1 && p.numel() == expected[0] && p.dim() == 1),
             op, ": ", what, " has sizes ", p.sizes(), " but expected ", expected, " for input sizes ",
             x.sizes());
  KILN_CHECK(!same_dtype || p.dtype() == x.dtype(), op, ": ", what, " has dtype ", p.dtype(),
             " but input has dtype ", x.dtype());
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

// batch_norm's argument checks for an input of `sizes` ([N, C, *]) on like's device with like's
// dtype (like: the input itself, or the input of the conv that produces it).
void check_batch_norm_args(const char* op, const Tensor& like, const IntList& sizes,
                           const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                           const Tensor& bias, bool training, double eps) {
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
  KILN_CHECK(!training || M > 1, op, ": expected more than 1 value per channel when training, got input sizes ",
             sizes);
}

// running = (1 - momentum) * running + momentum * batch, with the unbiased batch variance of
// M values per channel.
void update_running_stats(const Tensor& running_mean, const Tensor& running_var, const Tensor& mean,
                          const Tensor& var, int64_t M, double momentum) {
  Tensor unbiased = var * (static_cast<double>(M) / static_cast<double>(M - 1));
  Tensor rm = running_mean, rv = running_var;  // handles to the same tensors
  rm.mul_(1.0 - momentum).add_(mean.to(rm.dtype()), momentum);
  rv.mul_(1.0 - momentum).add_(unbiased.to(rv.dtype()), momentum);
}

}  // namespace

// ------------------------------------------------------------------------------ batch_norm

namespace {

// What follows the normalisation in the same kernel.
enum class BnEpilogue { None, Relu, ReluMaxPool2x2 };

// batch_norm; with Relu the fused batch_norm_relu: relu(batch_norm(...)) in one kernel whose
// backward recomputes the ReLU mask from the saved input; with ReluMaxPool2x2 the fused
// batch_norm_relu_max_pool2d (kiln/kernels/conv_block.h).
// batch_mean / batch_var (training with the fused pool only; optional): x's batch statistics
// already taken by the op that produced x (detail::conv2d_with_batch_stats), so the statistics
// pass over x is skipped.
Tensor batch_norm_impl(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight, const Tensor& bias, bool training, double momentum,
                       double eps, BnEpilogue epi, const Tensor& batch_mean = Tensor(),
                       const Tensor& batch_var = Tensor()) {
  const bool pool = epi == BnEpilogue::ReluMaxPool2x2, relu = epi != BnEpilogue::None;
  const char* op = pool ? "batch_norm_relu_max_pool2d" : relu ? "batch_norm_relu" : "batch_norm";
  if (pool) {
    check_input(op, x);
    KILN_CHECK(x.dim() == 4 && x.size(2) >= 2 && x.size(3) >= 2, op,
               ": expected [N, C, H, W] input with H, W >= 2 (a 2x2 window), got sizes ", x.sizes());
    // The fused kernel's preconditions (kiln/kernels/conv_block.h), outside autocast; when they
    // are not met, the unfused ops.
    if (!kernels::supports_batch_norm_relu_max_pool2x2(x) || amp::autocast_dtype())
      return max_pool2d(batch_norm_impl(x, running_mean, running_var, weight, bias, training,
                                        momentum, eps, BnEpilogue::Relu),
                        2);
  }
  if (amp::autocast_dtype()) {  // autocast: f32 (kiln/core/autocast.h)
    Tensor x2 = amp::to_autocast_f32(x);
    if (!x2.is_same(x))
      return batch_norm_impl(x2, running_mean, running_var, weight, bias, training, momentum, eps, epi);
  }
  const char* node = pool ? "BatchNormReluMaxPoolBackward"
                          : relu ? "BatchNormReluBackward" : "BatchNormBackward";
  check_input(op, x);
  KILN_CHECK(x.dim() >= 2, op, ": expected input of shape [N, C] or [N, C, *], got sizes ", x.sizes());
  check_batch_norm_args(op, x, x.sizes(), running_mean, running_var, weight, bias, training, eps);
  const int64_t C = x.size(1);
  const int64_t M = x.numel() / std::max<int64_t>(C, 1);

  const BnLayout lay = bn_layout(x);
  const bool record = autograd::any_requires_grad({&x, &weight, &bias});
  Tensor xk, y, mean, invstd, var, pooled, indices, pooled_x;
  {
    NoGradGuard ng;
    xk = lay.to_kernel(x.detach());
    if (!pool) y = empty(xk.sizes(), xk.options());  // pool: statistics only, then the fused kernel
    const bool given_stats = training && pool && batch_mean.defined() && batch_var.defined() &&
                             batch_mean.dtype() == kernels::norm_stat_dtype(x.dtype()) &&
                             batch_var.dtype() == batch_mean.dtype() && batch_mean.numel() == C &&
                             batch_var.numel() == C;
    if (given_stats) {
      mean = batch_mean;
      var = batch_var;
      invstd = (var + eps).rsqrt();
    } else if (training) {
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
    if ((training && !given_stats) || !pool)
      kernels::batch_norm_forward(y, xk, wk, bk, mean, invstd, var, training, eps, relu);
    if (pool) {
      const IntList psizes{x.size(0), C, x.size(2) / 2, x.size(3) / 2};
      pooled = empty(psizes, xk.options());
      indices = empty(psizes, TensorOptions().dtype(DType::I32));
      // x at each argmax, for the backward's sums (only when a backward will run)
      if (record) pooled_x = empty(psizes, xk.options());
      kernels::batch_norm_relu_max_pool2x2_forward(pooled, indices, pooled_x, xk, wk, bk, mean, invstd);
    }
    if (training && running_mean.defined()) update_running_stats(running_mean, running_var, mean, var, M, momentum);
  }
  Tensor out = pool ? pooled : lay.from_kernel(y);
  if (record) {
    const bool gx = x.requires_grad(), gw = weight.defined() && weight.requires_grad(),
               gb = bias.defined() && bias.requires_grad();
    // the bias only for batch_norm_relu's mask (the fused pool takes its mask from the output)
    const bool has_w = weight.defined(), has_b = relu && !pool && bias.defined();
    SavedTensor sx(x, node), sw, sb, sy;
    if (pool) sy = SavedTensor::output(out, node);  // the ReLU mask of the fused pool's backward
    if (has_w) sw = SavedTensor(weight, node);
    if (has_b) sb = SavedTensor(bias, node);  // the ReLU mask needs the bias
    autograd::record_function(node, {&x, &weight, &bias}, {&out}, [=](const TensorList& g) {
      Tensor xs = sx.get();
      Tensor w = has_w ? sw.get() : Tensor();
      Tensor b = has_b ? sb.get() : Tensor();
      if (pool) {
        KILN_CHECK(!GradMode::is_enabled(), "batch_norm_relu_max_pool2d: double backward "
                   "(create_graph) is not supported; use max_pool2d(batch_norm_relu(...), 2)");
        Tensor dx = gx ? empty(xs.sizes(), xs.options()) : Tensor();
        Tensor dw = gw ? empty({C}, xs.options()) : Tensor();
        Tensor db = gb ? empty({C}, xs.options()) : Tensor();
        kernels::batch_norm_relu_max_pool2x2_backward(
            dx, dw, db, contig(g[0]), sy.get().detach(), pooled_x, indices, contig(xs.detach()),
            has_w ? contig(w.detach()) : Tensor(), mean, invstd, training);
        return TensorList{dx, dw, db};
      }
      if (GradMode::is_enabled()) {  // create_graph: differentiable composite formula
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
        Tensor gy = g[0];
        if (relu) {  // relu's backward: g where the batch-norm output is positive (a constant mask)
          Tensor pre = has_w ? xhat.detach() * w.detach().view(bshape) : xhat.detach();
          if (has_b) pre = pre + b.detach().view(bshape);
          gy = gy * pre.gt(0.0).to(gy.dtype());
        }
        Tensor gwt = has_w ? gy * w.view(bshape) : gy;
        Tensor dx;
        if (gx) {
          dx = training ? is * (gwt - gwt.mean(dims, true) - xhat * (gwt * xhat).mean(dims, true))
                        : gwt * is;
        }
        return TensorList{dx, gw ? (gy * xhat).sum(dims) : Tensor(), gb ? gy.sum(dims) : Tensor()};
      }
      Tensor gk = lay.to_kernel(g[0]);
      Tensor xk2 = lay.to_kernel(xs.detach());
      Tensor dx = gx ? empty(xk2.sizes(), xk2.options()) : Tensor();
      Tensor dw = gw ? empty({C}, xs.options()) : Tensor();
      Tensor db = gb ? empty({C}, xs.options()) : Tensor();
      kernels::batch_norm_backward(dx, dw, db, gk, xk2, has_w ? contig(w.detach()) : Tensor(), mean,
                                   invstd, training, relu, has_b ? contig(b.detach()) : Tensor());
      return TensorList{gx ? lay.from_kernel(dx) : Tensor(), dw, db};
    });
  }
  return out;
}

}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight, const Tensor& bias, bool training, double momentum,
                  double eps) {
  return batch_norm_impl(x, running_mean, running_var, weight, bias, training, momentum, eps,
                         BnEpilogue::None);
}

Tensor batch_norm_relu(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight, const Tensor& bias, bool training, double momentum,
                       double eps) {
  return batch_norm_impl(x, running_mean, running_var, weight, bias, training, momentum, eps,
                         BnEpilogue::Relu);
}

Tensor batch_norm_relu_max_pool2d(const Tensor& x, const Tensor& running_mean,
                                  const Tensor& running_var, const Tensor& weight,
                                  const Tensor& bias, bool training, double momentum, double eps) {
  return batch_norm_impl(x, running_mean, running_var, weight, bias, training, momentum, eps,
                         BnEpilogue::ReluMaxPool2x2);
}

// ------------------------------------------------------------------ conv2d + batch_norm_relu + pool

namespace {

// The conv's geometry for well-formed arguments (4-D x and weight with matching channels, two
// strides, paddings and dilations, a non-empty output); std::nullopt otherwise, and the composite
// path then reports the invalid argument.
std::optional<kernels::ConvGeometry> conv_block_geometry(const Tensor& x, const Tensor& conv_weight,
                                                         const Conv2dParams& p) {
  if (x.dim() != 4 || conv_weight.dim() != 4 || p.groups < 1 || p.stride.size() != 2 ||
      p.padding.size() != 2 || p.dilation.size() != 2)
    return std::nullopt;
  kernels::ConvGeometry g;
  g.N = x.size(0); g.C = x.size(1); g.H = x.size(2); g.W = x.size(3);
  g.K = conv_weight.size(0); g.kh = conv_weight.size(2); g.kw = conv_weight.size(3);
  g.sh = p.stride[0]; g.sw = p.stride[1];
  g.ph = p.padding[0]; g.pw = p.padding[1]; g.dh = p.dilation[0]; g.dw = p.dilation[1];
  g.groups = p.groups;
  if (conv_weight.size(1) * g.groups != g.C || g.K < 1 || g.kh < 1 || g.kw < 1 || g.sh < 1 || g.sw < 1 ||
      g.ph < 0 || g.pw < 0 || g.dh < 1 || g.dw < 1 || g.N < 1)
    return std::nullopt;
  const int64_t ekh = g.dh * (g.kh - 1) + 1, ekw = g.dw * (g.kw - 1) + 1;
  if (g.H + 2 * g.ph < ekh || g.W + 2 * g.pw < ekw) return std::nullopt;
  g.OH = (g.H + 2 * g.ph - ekh) / g.sh + 1;
  g.OW = (g.W + 2 * g.pw - ekw) / g.sw + 1;
  return g;
}

// How conv2d_batch_norm_relu_max_pool2d runs, from the preconditions of the fused kernels
// (kiln/kernels/conv_block.h) and of autograd:
//   SmallPatch    one kernel for the whole block, the conv output never written: the kernel's
//                 preconditions, no conv bias, no gradient wanted for x (the kernel has no input
//                 gradient), outside autocast;
//   GemmBackward  (training with gradients) conv2d with the BatchNorm's statistics taken in its
//                 epilogue + the fused BN + ReLU + pool kernel, one node whose backward feeds the
//                 conv output's gradient to the conv's GEMMs sample by sample: the statistics
//                 epilogue's preconditions and a poolable output, no conv bias, outside autocast
//                 and CPU conv autotuning;
//   Composite     everything else: conv2d, then batch_norm_relu_max_pool2d (which itself runs
//                 the fused BN + ReLU + pool kernel or the unfused ops).
enum class ConvBlockPath { SmallPatch, GemmBackward, Composite };

bool gemm_backward_applies(const Tensor& x, const Tensor& conv_weight, const Tensor& conv_bias,
                           const std::optional<kernels::ConvGeometry>& g, bool training, bool wants_grad) {
  return g && training && wants_grad && !conv_bias.defined() && !amp::autocast_dtype() && !cpu_conv_autotune() &&
         kernels::supports_conv2d_batch_stats(x, *g) && conv_weight.device().is_cpu() &&
         conv_weight.dtype() == x.dtype() && g->OH >= 2 && g->OW >= 2;
}

ConvBlockPath conv_block_path(const Tensor& x, const Tensor& conv_weight, const Tensor& conv_bias,
                              const std::optional<kernels::ConvGeometry>& g, bool training, bool wants_grad) {
  // a conv bias before BatchNorm is a no-op anyway, so the fused kernels do not take one
  const bool x_grad = x.requires_grad() && GradMode::is_enabled();
  if (g && !conv_bias.defined() && !amp::autocast_dtype() && !x_grad &&
      kernels::supports_conv_batch_norm_relu_max_pool2x2(x, conv_weight, *g))
    return ConvBlockPath::SmallPatch;
  if (gemm_backward_applies(x, conv_weight, conv_bias, g, training, wants_grad)) return ConvBlockPath::GemmBackward;
  return ConvBlockPath::Composite;
}

// The GemmBackward path of conv_block_path: conv2d (statistics in its epilogue) + the fused BN +
// ReLU + pool kernel in training, recorded as one node whose backward never stores the conv
// output's gradient: it is produced one sample at a time and fed to the conv's GEMMs
// (kernels::conv2d_batch_norm_relu_max_pool2x2_backward).
Tensor conv_block_gemm_backward(const Tensor& x, const Tensor& conv_weight, const Conv2dParams& params,
                                const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                                const Tensor& bias, double momentum, double eps) {
  const char* op = "conv2d_batch_norm_relu_max_pool2d";
  Tensor y, batch_mean, batch_var;
  kernels::ConvGeometry g;
  {
    NoGradGuard ng;  // recorded below as part of this op's node
    y = detail::conv2d_with_batch_stats(x.detach(), conv_weight.detach(), Tensor(), params, batch_mean,
                                        batch_var, &g);
  }
  // conv_block_path checked the statistics epilogue's preconditions
  KILN_CHECK(batch_mean.defined() && y.is_contiguous() && batch_mean.dtype() == kernels::norm_stat_dtype(y.dtype()),
             op, ": internal error: the conv's statistics epilogue did not run for input sizes ", x.sizes());
  check_batch_norm_args(op, y, y.sizes(), running_mean, running_var, weight, bias, true, eps);
  const int64_t C = y.size(1), M = y.numel() / C;
  Tensor pooled, indices, pooled_x, invstd;
  const Tensor wk = weight.defined() ? contig(weight.detach()) : Tensor();
  {
    NoGradGuard ng;
    invstd = (batch_var + eps).rsqrt();
    const IntList psizes{y.size(0), C, y.size(2) / 2, y.size(3) / 2};
    pooled = empty(psizes, y.options());
    indices = empty(psizes, TensorOptions().dtype(DType::I32));
    pooled_x = empty(psizes, y.options());
    kernels::batch_norm_relu_max_pool2x2_forward(pooled, indices, pooled_x, y, wk,
                                                 bias.defined() ? contig(bias.detach()) : Tensor(), batch_mean,
                                                 invstd);
    if (running_mean.defined()) update_running_stats(running_mean, running_var, batch_mean, batch_var, M, momentum);
  }
  Tensor out = pooled;
  const char* node = "ConvBatchNormReluMaxPoolGemmBackward";
  const bool gx = x.requires_grad(), gcw = conv_weight.requires_grad(),
             gw = weight.defined() && weight.requires_grad(), gb = bias.defined() && bias.requires_grad();
  const bool has_w = weight.defined();
  SavedTensor sx(x, node), scw(conv_weight, node), sw = has_w ? SavedTensor(weight, node) : SavedTensor();
  SavedTensor sy = SavedTensor::output(out, node);  // the ReLU mask
  const Tensor mean = batch_mean;
  autograd::record_function(node, {&x, &conv_weight, &weight, &bias}, {&out}, [=](const TensorList& gr) {
    KILN_CHECK(!GradMode::is_enabled(), op, ": double backward (create_graph) is not supported; use "
               "max_pool2d(batch_norm_relu(conv2d(...)), 2)");
    const Tensor xs = sx.get().detach(), cws = scw.get().detach();
    Tensor dx = gx ? empty(xs.sizes(), xs.options()) : Tensor();
    Tensor dcw = gcw ? empty(cws.sizes(), cws.options()) : Tensor();
    Tensor dw = gw ? empty({C}, xs.options()) : Tensor();
    Tensor db = gb ? empty({C}, xs.options()) : Tensor();
    kernels::conv2d_batch_norm_relu_max_pool2x2_backward(dx, dcw, dw, db, contig(gr[0]), sy.get().detach(), pooled_x,
                                                         indices, y, xs, contig(cws), g,
                                                         has_w ? contig(sw.get().detach()) : Tensor(), mean, invstd,
                                                         true);
    return TensorList{dx, dcw, dw, db};
  });
  return out;
}

}  // namespace

Tensor conv2d_batch_norm_relu_max_pool2d(const Tensor& x, const Tensor& conv_weight,
                                         const Tensor& conv_bias, const Conv2dParams& params,
                                         const Tensor& running_mean, const Tensor& running_var,
                                         const Tensor& weight, const Tensor& bias, bool training,
                                         double momentum, double eps) {
  const char* op = "conv2d_batch_norm_relu_max_pool2d";
  KILN_CHECK(x.defined() && conv_weight.defined(), op, ": input and conv weight must be defined");
  const auto geometry = conv_block_geometry(x, conv_weight, params);
  const bool wants_grad = autograd::any_requires_grad({&x, &conv_weight, &weight, &bias});
  const ConvBlockPath path = conv_block_path(x, conv_weight, conv_bias, geometry, training, wants_grad);
  // The paths other than SmallPatch; SmallPatch falls back to them when the input's moments lack
  // the precision for its statistics (see kernels::conv_batch_norm_stats).
  auto without_small_patch = [&] {
    if (gemm_backward_applies(x, conv_weight, conv_bias, geometry, training, wants_grad))
      return conv_block_gemm_backward(x, conv_weight, params, running_mean, running_var, weight, bias, momentum,
                                      eps);
    // conv2d then the fused BN + ReLU + pool, with the BN statistics taken in the conv's epilogue
    // where the CPU kernel can (detail::conv2d_with_batch_stats): one pass less over its output
    Tensor batch_mean, batch_var;
    Tensor y = training ? detail::conv2d_with_batch_stats(x, conv_weight, conv_bias, params, batch_mean, batch_var)
                        : conv2d(x, conv_weight, conv_bias, params);
    return batch_norm_impl(y, running_mean, running_var, weight, bias, training, momentum, eps,
                           BnEpilogue::ReluMaxPool2x2, batch_mean, batch_var);
  };
  if (path != ConvBlockPath::SmallPatch) return without_small_patch();
  const kernels::ConvGeometry g = *geometry;
  const int64_t K = g.K, Ckk = g.C * g.kh * g.kw, M = g.N * g.OH * g.OW;
  // BatchNorm's argument checks, against the conv output ([N, K, OH, OW], x's dtype and device)
  check_batch_norm_args(op, x, {g.N, K, g.OH, g.OW}, running_mean, running_var, weight, bias, training, eps);

  const bool record = autograd::any_requires_grad({&conv_weight, &weight, &bias});
  Tensor mean, invstd, var, patch_sum, gram, pooled, codes, cw;
  bool precise = true;
  {
    NoGradGuard ng;
    cw = contig(conv_weight.detach());
    if (training) {
      mean = empty({K}, stat_opts(x));
      invstd = empty({K}, stat_opts(x));
      var = empty({K}, stat_opts(x));
      patch_sum = empty({Ckk}, TensorOptions().dtype(DType::F64));
      gram = empty({Ckk, Ckk}, TensorOptions().dtype(DType::F64));
      // false: the moments lack the precision for this input (its mean dwarfs its spread)
      precise = kernels::conv_batch_norm_stats(mean, invstd, var, patch_sum, gram, x.detach(), cw, g, eps);
    } else {
      mean = running_mean.detach().to(kernels::norm_stat_dtype(x.dtype())).clone();
      invstd = (running_var.detach().to(kernels::norm_stat_dtype(x.dtype())) + eps).rsqrt();
    }
  }
  if (!precise) return without_small_patch();  // nothing has been changed yet
  {
    NoGradGuard ng;
    const IntList psizes{g.N, K, g.OH / 2, g.OW / 2};
    pooled = empty(psizes, x.options());
    codes = empty(psizes, TensorOptions().dtype(DType::U8));  // argmax + ReLU mask, a byte per window
    kernels::conv_batch_norm_relu_max_pool2x2_forward(pooled, codes, x.detach(), cw, g,
                                                      weight.defined() ? contig(weight.detach()) : Tensor(),
                                                      bias.defined() ? contig(bias.detach()) : Tensor(), mean,
                                                      invstd);
    if (training && running_mean.defined()) update_running_stats(running_mean, running_var, mean, var, M, momentum);
  }
  Tensor out = pooled;
  if (record) {
    const char* node = "ConvBatchNormReluMaxPoolBackward";
    const bool gcw = conv_weight.requires_grad(), gw = weight.defined() && weight.requires_grad(),
               gb = bias.defined() && bias.requires_grad();
    const bool has_w = weight.defined();
    SavedTensor sx(x, node), scw(conv_weight, node), sw = has_w ? SavedTensor(weight, node) : SavedTensor();
    autograd::record_function(node, {&x, &conv_weight, &weight, &bias}, {&out}, [=](const TensorList& gr) {
      KILN_CHECK(!GradMode::is_enabled(), op, ": double backward (create_graph) is not supported; use "
                 "max_pool2d(batch_norm_relu(conv2d(...)), 2)");
      Tensor dcw = gcw ? empty(scw.get().sizes(), scw.get().options()) : Tensor();
      Tensor dw = gw ? empty({K}, sx.get().options()) : Tensor();
      Tensor db = gb ? empty({K}, sx.get().options()) : Tensor();
      kernels::conv_batch_norm_relu_max_pool2x2_backward(
          dcw, dw, db, contig(gr[0]), codes, contig(sx.get().detach()),
          contig(scw.get().detach()), g, patch_sum, gram, has_w ? contig(sw.get().detach()) : Tensor(), mean,
          invstd, training);
      return TensorList{Tensor(), dcw, dw, db};
    });
  }
  return out;
}

// ------------------------------------------------------------------------------ row norms

namespace {

// Normalises x over its trailing elements in groups of K (rows = numel / K), then applies the
// flat [K] weight/bias (either may be undefined; rms ignores bias).
Tensor row_norm(const char* name, const Tensor& x, int64_t K, const Tensor& weight,
                const Tensor& bias, bool rms, double eps) {
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
    const bool gx = x.requires_grad(), gw = wf.defined() && wf.requires_grad(),
               gb = bf.defined() && bf.requires_grad();
    SavedTensor sx(x, name), sw;
    if (wf.defined()) sw = SavedTensor(wf, name);
    const bool has_w = wf.defined();
    const IntList xsizes = x.sizes();
    autograd::record_function(name, {&x, &wf, &bf}, {&y}, [=](const TensorList& g) {
      Tensor xs = sx.get();
      Tensor w = has_w ? sw.get() : Tensor();
      if (GradMode::is_enabled()) {  // create_graph: composite formula on [R, K]
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
        Tensor gwt = has_w ? g2 * w : g2;
        Tensor dx;
        if (gx) {
          Tensor inner = gwt - xhat * (gwt * xhat).mean({1}, true);
          if (!rms) inner = inner - gwt.mean({1}, true);
          dx = (is * inner).reshape(xsizes);
        }
        return TensorList{dx, gw ? (g2 * xhat).sum({0}) : Tensor(), gb ? g2.sum({0}) : Tensor()};
      }
      Tensor gc = contig(g[0]);
      Tensor xk = contig(xs.detach());
      Tensor dx = gx ? empty(xsizes, xs.options()) : Tensor();
      Tensor dw = gw ? empty({K}, xs.options()) : Tensor();
      Tensor db = gb ? empty({K}, xs.options()) : Tensor();
      kernels::row_norm_backward(dx, dw, db, gc, xk, has_w ? contig(w.detach()) : Tensor(), mean,
                                 invstd, rms);
      return TensorList{dx, dw, db};
    });
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

Tensor layer_norm(const Tensor& x, const IntList& normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps) {
  if (amp::autocast_dtype()) {  // autocast: f32 (kiln/core/autocast.h)
    Tensor x2 = amp::to_autocast_f32(x);
    if (!x2.is_same(x)) return layer_norm(x2, normalized_shape, weight, bias, eps);
  }
  const char* op = "layer_norm";
  check_input(op, x);
  const int64_t K = check_normalized_shape(op, x, normalized_shape);
  check_param(op, "weight", weight, x, normalized_shape, true);
  check_param(op, "bias", bias, x, normalized_shape, true);
  return row_norm("LayerNormBackward", x, K, weight, bias, false, eps);
}

Tensor rms_norm(const Tensor& x, const IntList& normalized_shape, const Tensor& weight, double eps) {
  if (amp::autocast_dtype()) {  // autocast: f32 (kiln/core/autocast.h)
    Tensor x2 = amp::to_autocast_f32(x);
    if (!x2.is_same(x)) return rms_norm(x2, normalized_shape, weight, eps);
  }
  const char* op = "rms_norm";
  check_input(op, x);
  const int64_t K = check_normalized_shape(op, x, normalized_shape);
  check_param(op, "weight", weight, x, normalized_shape, true);
  return row_norm("RmsNormBackward", x, K, weight, Tensor(), true, eps);
}

Tensor group_norm(const Tensor& x, int64_t num_groups, const Tensor& weight, const Tensor& bias,
                  double eps) {
  if (amp::autocast_dtype()) {  // autocast: f32 (kiln/core/autocast.h)
    Tensor x2 = amp::to_autocast_f32(x);
    if (!x2.is_same(x)) return group_norm(x2, num_groups, weight, bias, eps);
  }
  const char* op = "group_norm";
  check_input(op, x);
  KILN_CHECK(x.dim() >= 2, op, ": expected input of shape [N, C, *], got sizes ", x.sizes());
  const int64_t N = x.size(0), C = x.size(1);
  KILN_CHECK(num_groups > 0 && C % num_groups == 0, op, ": the number of channels (", C,
             ", input sizes ", x.sizes(), ") must be divisible by num_groups (", num_groups, ")");
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
