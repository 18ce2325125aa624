// The conv-block ops (kiln/nn/fused/conv_block.h): batch_norm_relu_max_pool2d and
// conv2d_batch_norm_relu_max_pool2d, on the conv-block kernels of kiln/kernels/conv_block.h, with
// batch_norm's checks and running-statistics update (kiln/nn/functional/detail.h) and conv2d's
// forward hook for the statistics epilogue.
#include "kiln/nn/fused/conv_block.h"

#include <optional>

#include "kiln/core/autocast.h"
#include "kiln/core/autograd.h"
#include "kiln/core/cpu_conv.h"
#include "kiln/kernels/conv_block.h"
#include "kiln/kernels/norm.h"
#include "kiln/nn/functional/detail.h"

namespace kiln::nn::functional {

using autograd::SavedTensor;
using autograd::TensorList;

namespace {

Tensor contig(const Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

// conv2d that also sets batch_mean / batch_var to the batch mean and biased variance of its
// output per channel ([K], the stat dtype) when the CPU NCHW kernel takes them in its epilogue
// (kernels::conv2d_forward_batch_stats); both stay undefined otherwise (other devices,
// channels-last, CPU conv autotuning, which may pick the channels-last kernel, f16/bf16,
// autocast). They carry no gradient: the BatchNorm that uses them differentiates through its
// statistics itself. geometry, when not null, receives the kernel's geometry whenever they were taken.
Tensor conv2d_with_batch_stats(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& params,
                               Tensor& batch_mean, Tensor& batch_var, kernels::ConvGeometry* geometry = nullptr) {
  batch_mean = Tensor();
  batch_var = Tensor();
  const detail::ConvForward with_stats = [&](const Tensor& out, const Tensor& xk, const Tensor& w, const Tensor& b,
                                             const kernels::ConvGeometry& g) {
    if (!kernels::supports_conv2d_batch_stats(xk, g) || cpu_conv_autotune()) return false;
    const TensorOptions st = TensorOptions().dtype(kernels::norm_stat_dtype(xk.dtype()));
    batch_mean = empty({g.K}, st);
    batch_var = empty({g.K}, st);
    kernels::conv2d_forward_batch_stats(out, batch_mean, batch_var, xk, w, b, g);
    if (geometry) *geometry = g;
    return true;
  };
  return detail::conv2d_with_forward(x, weight, bias, params, with_stats);
}

// batch_norm_relu_max_pool2d; batch_mean / batch_var (training only; optional): x's batch
// statistics already taken by the conv that produced x (conv2d_with_batch_stats), so the
// statistics pass over x is skipped.
Tensor bn_relu_pool(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                    const Tensor& bias, bool training, double momentum, double eps, const Tensor& batch_mean = Tensor(),
                    const Tensor& batch_var = Tensor()) {
  const char* op = "batch_norm_relu_max_pool2d";
  KILN_CHECK(x.defined() && is_floating(x.dtype()), op, ": expected a defined floating-point input");
  KILN_CHECK(x.dim() == 4 && x.size(2) >= 2 && x.size(3) >= 2, op,
             ": expected [N, C, H, W] input with H, W >= 2 (a 2x2 window), got sizes ", x.sizes());
  // The fused kernel's preconditions, outside autocast; when they are not met, the unfused ops.
  if (!kernels::supports_batch_norm_relu_max_pool2x2(x) || amp::autocast_dtype())
    return max_pool2d(batch_norm_relu(x, running_mean, running_var, weight, bias, training, momentum, eps), 2);
  const char* node = "BatchNormReluMaxPoolBackward";
  detail::check_batch_norm_args(op, x, x.sizes(), running_mean, running_var, weight, bias, training, eps);
  const int64_t C = x.size(1), M = x.numel() / C;
  const bool record = autograd::any_requires_grad({&x, &weight, &bias});
  Tensor mean, invstd, var, pooled, indices, pooled_x;
  const Tensor wk = weight.defined() ? contig(weight.detach()) : Tensor();
  {
    NoGradGuard ng;
    const Tensor xk = x.detach();
    const bool given_stats = training && batch_mean.defined() && batch_var.defined() &&
                             batch_mean.dtype() == kernels::norm_stat_dtype(x.dtype()) &&
                             batch_var.dtype() == batch_mean.dtype() && batch_mean.numel() == C &&
                             batch_var.numel() == C;
    if (given_stats) {
      mean = batch_mean;
      var = batch_var;
      invstd = (var + eps).rsqrt();
    } else if (training) {  // statistics only: batch_norm_forward with an undefined output
      mean = empty({C}, detail::batch_norm_stat_options(x));
      invstd = empty({C}, detail::batch_norm_stat_options(x));
      var = empty({C}, detail::batch_norm_stat_options(x));
      kernels::batch_norm_forward(Tensor(), xk, wk, Tensor(), mean, invstd, var, true, eps, /*relu=*/true);
    } else {
      // A copy, so that later in-place updates of the running stats cannot change this backward.
      mean = running_mean.detach().to(kernels::norm_stat_dtype(x.dtype())).clone();
      invstd = (running_var.detach().to(kernels::norm_stat_dtype(x.dtype())) + eps).rsqrt();
    }
    const IntList psizes{x.size(0), C, x.size(2) / 2, x.size(3) / 2};
    pooled = empty(psizes, xk.options());
    indices = empty(psizes, TensorOptions().dtype(DType::I32));
    if (record) pooled_x = empty(psizes, xk.options());  // x at each argmax, for the backward's sums
    kernels::batch_norm_relu_max_pool2x2_forward(pooled, indices, pooled_x, xk, wk,
                                                 bias.defined() ? contig(bias.detach()) : Tensor(), mean, invstd);
    if (training && running_mean.defined())
      detail::update_running_stats(running_mean, running_var, mean, var, M, momentum);
  }
  Tensor out = pooled;
  if (record) {
    const bool gx = x.requires_grad(), gw = weight.defined() && weight.requires_grad(),
               gb = bias.defined() && bias.requires_grad();
    const bool has_w = weight.defined();
    SavedTensor sx(x, node), sw = has_w ? SavedTensor(weight, node) : SavedTensor();
    SavedTensor sy = SavedTensor::output(out, node);  // the ReLU mask
    autograd::record_function(node, {&x, &weight, &bias}, {&out}, [=](const TensorList& g) {
      KILN_CHECK(!GradMode::is_enabled(), op,
                 ": double backward (create_graph) is not supported; use "
                 "max_pool2d(batch_norm_relu(...), 2)");
      const Tensor xs = sx.get();
      Tensor dx = gx ? empty(xs.sizes(), xs.options()) : Tensor();
      Tensor dw = gw ? empty({C}, xs.options()) : Tensor();
      Tensor db = gb ? empty({C}, xs.options()) : Tensor();
      kernels::batch_norm_relu_max_pool2x2_backward(dx, dw, db, contig(g[0]), sy.get().detach(), pooled_x, indices,
                                                    contig(xs.detach()), has_w ? contig(sw.get().detach()) : Tensor(),
                                                    mean, invstd, training);
      return TensorList{dx, dw, db};
    });
  }
  return out;
}

// The conv's geometry for well-formed arguments (4-D x and weight with matching channels, two
// strides, paddings and dilations, a non-empty output); std::nullopt otherwise, and the composite
// path then reports the invalid argument.
std::optional<kernels::ConvGeometry> conv_block_geometry(const Tensor& x, const Tensor& conv_weight,
                                                         const Conv2dParams& p) {
  if (x.dim() != 4 || conv_weight.dim() != 4 || p.groups < 1 || p.stride.size() != 2 || p.padding.size() != 2 ||
      p.dilation.size() != 2)
    return std::nullopt;
  kernels::ConvGeometry g;
  g.N = x.size(0);
  g.C = x.size(1);
  g.H = x.size(2);
  g.W = x.size(3);
  g.K = conv_weight.size(0);
  g.kh = conv_weight.size(2);
  g.kw = conv_weight.size(3);
  g.sh = p.stride[0];
  g.sw = p.stride[1];
  g.ph = p.padding[0];
  g.pw = p.padding[1];
  g.dh = p.dilation[0];
  g.dw = p.dilation[1];
  g.groups = p.groups;
  if (conv_weight.size(1) * g.groups != g.C || g.K < 1 || g.kh < 1 || g.kw < 1 || g.sh < 1 || g.sw < 1 || g.ph < 0 ||
      g.pw < 0 || g.dh < 1 || g.dw < 1 || g.N < 1)
    return std::nullopt;
  const int64_t ekh = g.dh * (g.kh - 1) + 1, ekw = g.dw * (g.kw - 1) + 1;
  if (g.H + 2 * g.ph < ekh || g.W + 2 * g.pw < ekw) return std::nullopt;
  g.set_output_size();
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
    y = conv2d_with_batch_stats(x.detach(), conv_weight.detach(), Tensor(), params, batch_mean, batch_var, &g);
  }
  // conv_block_path checked the statistics epilogue's preconditions
  KILN_CHECK(batch_mean.defined() && y.is_contiguous() && batch_mean.dtype() == kernels::norm_stat_dtype(y.dtype()), op,
             ": internal error: the conv's statistics epilogue did not run for input sizes ", x.sizes());
  detail::check_batch_norm_args(op, y, y.sizes(), running_mean, running_var, weight, bias, true, eps);
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
                                                 bias.defined() ? contig(bias.detach()) : Tensor(), batch_mean, invstd);
    if (running_mean.defined())
      detail::update_running_stats(running_mean, running_var, batch_mean, batch_var, M, momentum);
  }
  Tensor out = pooled;
  const char* node = "ConvBatchNormReluMaxPoolGemmBackward";
  const bool gx = x.requires_grad(), gcw = conv_weight.requires_grad(), gw = weight.defined() && weight.requires_grad(),
             gb = bias.defined() && bias.requires_grad();
  const bool has_w = weight.defined();
  SavedTensor sx(x, node), scw(conv_weight, node), sw = has_w ? SavedTensor(weight, node) : SavedTensor();
  SavedTensor sy = SavedTensor::output(out, node);  // the ReLU mask
  const Tensor mean = batch_mean;
  autograd::record_function(node, {&x, &conv_weight, &weight, &bias}, {&out}, [=](const TensorList& gr) {
    KILN_CHECK(!GradMode::is_enabled(), op,
               ": double backward (create_graph) is not supported; use "
               "max_pool2d(batch_norm_relu(conv2d(...)), 2)");
    const Tensor xs = sx.get().detach(), cws = scw.get().detach();
    Tensor dx = gx ? empty(xs.sizes(), xs.options()) : Tensor();
    Tensor dcw = gcw ? empty(cws.sizes(), cws.options()) : Tensor();
    Tensor dw = gw ? empty({C}, xs.options()) : Tensor();
    Tensor db = gb ? empty({C}, xs.options()) : Tensor();
    kernels::conv2d_batch_norm_relu_max_pool2x2_backward(
        dx, dcw, dw, db, contig(gr[0]), sy.get().detach(), pooled_x, indices, y, xs, contig(cws), g,
        has_w ? contig(sw.get().detach()) : Tensor(), mean, invstd, true);
    return TensorList{dx, dcw, dw, db};
  });
  return out;
}

}  // namespace

Tensor batch_norm_relu_max_pool2d(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                                  const Tensor& weight, const Tensor& bias, bool training, double momentum,
                                  double eps) {
  return bn_relu_pool(x, running_mean, running_var, weight, bias, training, momentum, eps);
}

Tensor conv2d_batch_norm_relu_max_pool2d(const Tensor& x, const Tensor& conv_weight, const Tensor& conv_bias,
                                         const Conv2dParams& params, const Tensor& running_mean,
                                         const Tensor& running_var, const Tensor& weight, const Tensor& bias,
                                         bool training, double momentum, double eps) {
  const char* op = "conv2d_batch_norm_relu_max_pool2d";
  KILN_CHECK(x.defined() && conv_weight.defined(), op, ": input and conv weight must be defined");
  const auto geometry = conv_block_geometry(x, conv_weight, params);
  const bool wants_grad = autograd::any_requires_grad({&x, &conv_weight, &weight, &bias});
  const ConvBlockPath path = conv_block_path(x, conv_weight, conv_bias, geometry, training, wants_grad);
  // The paths other than SmallPatch; SmallPatch falls back to them when the input's moments lack
  // the precision for its statistics (see kernels::conv_batch_norm_stats).
  auto without_small_patch = [&] {
    if (gemm_backward_applies(x, conv_weight, conv_bias, geometry, training, wants_grad))
      return conv_block_gemm_backward(x, conv_weight, params, running_mean, running_var, weight, bias, momentum, eps);
    // conv2d then the fused BN + ReLU + pool, with the BN statistics taken in the conv's epilogue
    // where the CPU kernel can (conv2d_with_batch_stats): one pass less over its output
    Tensor batch_mean, batch_var;
    Tensor y = training ? conv2d_with_batch_stats(x, conv_weight, conv_bias, params, batch_mean, batch_var)
                        : conv2d(x, conv_weight, conv_bias, params);
    return bn_relu_pool(y, running_mean, running_var, weight, bias, training, momentum, eps, batch_mean, batch_var);
  };
  if (path != ConvBlockPath::SmallPatch) return without_small_patch();
  const kernels::ConvGeometry g = *geometry;
  const int64_t K = g.K, Ckk = g.C * g.kh * g.kw, M = g.N * g.OH * g.OW;
  // BatchNorm's argument checks, against the conv output ([N, K, OH, OW], x's dtype and device)
  detail::check_batch_norm_args(op, x, {g.N, K, g.OH, g.OW}, running_mean, running_var, weight, bias, training, eps);

  const bool record = autograd::any_requires_grad({&conv_weight, &weight, &bias});
  Tensor mean, invstd, var, patch_sum, gram, pooled, codes, cw;
  bool precise = true;
  {
    NoGradGuard ng;
    cw = contig(conv_weight.detach());
    if (training) {
      mean = empty({K}, detail::batch_norm_stat_options(x));
      invstd = empty({K}, detail::batch_norm_stat_options(x));
      var = empty({K}, detail::batch_norm_stat_options(x));
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
                                                      bias.defined() ? contig(bias.detach()) : Tensor(), mean, invstd);
    if (training && running_mean.defined())
      detail::update_running_stats(running_mean, running_var, mean, var, M, momentum);
  }
  Tensor out = pooled;
  if (record) {
    const char* node = "ConvBatchNormReluMaxPoolBackward";
    const bool gcw = conv_weight.requires_grad(), gw = weight.defined() && weight.requires_grad(),
               gb = bias.defined() && bias.requires_grad();
    const bool has_w = weight.defined();
    SavedTensor sx(x, node), scw(conv_weight, node), sw = has_w ? SavedTensor(weight, node) : SavedTensor();
    autograd::record_function(node, {&x, &conv_weight, &weight, &bias}, {&out}, [=](const TensorList& gr) {
      KILN_CHECK(!GradMode::is_enabled(), op,
                 ": double backward (create_graph) is not supported; use "
                 "max_pool2d(batch_norm_relu(conv2d(...)), 2)");
      Tensor dcw = gcw ? empty(scw.get().sizes(), scw.get().options()) : Tensor();
      Tensor dw = gw ? empty({K}, sx.get().options()) : Tensor();
      Tensor db = gb ? empty({K}, sx.get().options()) : Tensor();
      kernels::conv_batch_norm_relu_max_pool2x2_backward(
          dcw, dw, db, contig(gr[0]), codes, contig(sx.get().detach()), contig(scw.get().detach()), g, patch_sum, gram,
          has_w ? contig(sw.get().detach()) : Tensor(), mean, invstd, training);
      return TensorList{Tensor(), dcw, dw, db};
    });
  }
  return out;
}

}  // namespace kiln::nn::functional
