#pragma once
// Raw kernels behind kiln::nn::functional (no autograd): fused batch/layer/RMS norm forward and
// backward (batch norm optionally with a fused ReLU), the Philox dropout mask, blocked
// (online-softmax) attention, leaky ReLU.
// Routed by kiln/kernels/norm_dispatch.cpp to the CPU backend (kiln/kernels/cpu/norm.cpp,
// attention.cpp, dropout.cpp); CUDA tensors get a clear kiln::Error until the CUDA backend exists.
//
// Statistics (mean, invstd, var, lse) are kept in the "stat dtype": f64 for f64 inputs, f32 for
// every other floating dtype. Data operands must be contiguous and share one floating dtype.
#include <cstdint>

#include "kiln/core/tensor.h"
#include "kiln/kernels/conv.h"
#include "kiln/kernels/norm.h"

namespace kiln::kernels {

// ---- fused BatchNorm + ReLU + 2x2/2 max pool (CPU only; kiln/kernels/cpu/bn_relu_pool.cpp):
// x contiguous NCHW with H, W >= 2; out, indices, pooled_x [N, C, H/2, W/2] contiguous, indices
// int32 flat h * W + w as max_pool2d's, pooled_x (optional in the forward) the input at the
// argmax. mean, invstd [C] (stat dtype) come from batch_norm_forward with an undefined y
// (statistics only, CPU) or from the running statistics. The forward pools max(0, fma(x, a_c,
// b_c)) without writing the normalised tensor; the backward takes the pooled gradient, the
// forward's out, pooled_x and indices, and produces batch_norm_backward's dx, dweight, dbias
// (each may be undefined).
void batch_norm_relu_max_pool2x2_forward(const Tensor& out, const Tensor& indices,
                                         const Tensor& pooled_x, const Tensor& x,
                                         const Tensor& weight, const Tensor& bias,
                                         const Tensor& mean, const Tensor& invstd);
void batch_norm_relu_max_pool2x2_backward(const Tensor& dx, const Tensor& dweight,
                                          const Tensor& dbias, const Tensor& grad_out,
                                          const Tensor& out, const Tensor& pooled_x,
                                          const Tensor& indices, const Tensor& x,
                                          const Tensor& weight, const Tensor& mean,
                                          const Tensor& invstd, bool training);

// ---- backward of conv2d (CPU, NCHW, f32/f64) followed by batch_norm_relu_max_pool2x2: the
// conv output's gradient is produced one sample at a time in cache and fed to the conv's weight-
// and input-gradient GEMMs (cpu::conv2d_backward_generated), never stored. y is the conv output
// (the BN input), conv_x / conv_w the conv's input and weight; the other operands as in
// batch_norm_relu_max_pool2x2_backward. dconv_x, dconv_w, dweight, dbias may each be undefined.
void conv2d_batch_norm_relu_max_pool2x2_backward(
    const Tensor& dconv_x, const Tensor& dconv_w, const Tensor& dweight, const Tensor& dbias,
    const Tensor& grad_out, const Tensor& out, const Tensor& pooled_x, const Tensor& indices,
    const Tensor& y, const Tensor& conv_x, const Tensor& conv_w, const ConvGeometry& g,
    const Tensor& weight, const Tensor& mean, const Tensor& invstd, bool training);

// ---- fused conv2d + BatchNorm + ReLU + 2x2/2 max pool for small-patch convolutions (CPU only;
// kiln/kernels/cpu/conv_bn_relu_pool.cpp): max_pool2d(relu(batch_norm(conv2d(x, conv_weight))), 2)
// without writing the conv output. Conditions (checked): x contiguous NCHW f32/f64, conv_weight
// contiguous [K, C, kh, kw] of x's dtype, stride 1, groups 1, C * kh * kw <= kConvBnPoolMaxPatch,
// conv output at least 2x2; out, codes [N, K, OH/2, OW/2] contiguous, codes uint8 per window:
// bit 0 the argmax's column in the window, bit 1 its row, bit 2 set when out > 0 (its ReLU on).
// conv_batch_norm_stats (training): the batch mean, biased var and invstd = 1/sqrt(var + eps) of
// the conv output per channel ([K], stat dtype; var may be undefined), from the patch moments
// patch_sum [C*kh*kw] and gram [C*kh*kw, C*kh*kw] (f64, written, needed by the backward).
// Returns false when a channel's variance is too small next to its second moment for the
// moments' precision (an input whose mean dwarfs its spread): use conv2d + batch norm instead.
// The forward takes mean/invstd from there or from the running statistics; the backward takes the
// pooled gradient and the forward's codes and writes the conv weight's gradient and
// BatchNorm's dweight/dbias (each may be undefined; patch_sum/gram only used when training).
constexpr int64_t kConvBnPoolMaxPatch = 32;
bool conv_batch_norm_stats(const Tensor& mean, const Tensor& invstd, const Tensor& var,
                           const Tensor& patch_sum, const Tensor& gram, const Tensor& x,
                           const Tensor& conv_weight, const ConvGeometry& g, double eps);
void conv_batch_norm_relu_max_pool2x2_forward(const Tensor& out, const Tensor& codes,
                                              const Tensor& x, const Tensor& conv_weight,
                                              const ConvGeometry& g, const Tensor& weight,
                                              const Tensor& bias, const Tensor& mean,
                                              const Tensor& invstd);
void conv_batch_norm_relu_max_pool2x2_backward(
    const Tensor& dconv_weight, const Tensor& dweight, const Tensor& dbias, const Tensor& grad_out,
    const Tensor& codes, const Tensor& x, const Tensor& conv_weight,
    const ConvGeometry& g, const Tensor& patch_sum, const Tensor& gram, const Tensor& weight,
    const Tensor& mean, const Tensor& invstd, bool training);

}  // namespace kiln::kernels

// The CPU backend's entry points (same contracts, CPU tensors only).
namespace kiln::kernels::cpu {
void batch_norm_relu_max_pool2x2_forward(const Tensor& out, const Tensor& indices,
                                         const Tensor& pooled_x, const Tensor& x,
                                         const Tensor& weight, const Tensor& bias,
                                         const Tensor& mean, const Tensor& invstd);
void batch_norm_relu_max_pool2x2_backward(const Tensor& dx, const Tensor& dweight,
                                          const Tensor& dbias, const Tensor& grad_out,
                                          const Tensor& out, const Tensor& pooled_x,
                                          const Tensor& indices, const Tensor& x,
                                          const Tensor& weight, const Tensor& mean,
                                          const Tensor& invstd, bool training);
void conv2d_batch_norm_relu_max_pool2x2_backward(
    const Tensor& dconv_x, const Tensor& dconv_w, const Tensor& dweight, const Tensor& dbias,
    const Tensor& grad_out, const Tensor& out, const Tensor& pooled_x, const Tensor& indices,
    const Tensor& y, const Tensor& conv_x, const Tensor& conv_w, const ConvGeometry& g,
    const Tensor& weight, const Tensor& mean, const Tensor& invstd, bool training);
bool conv_batch_norm_stats(const Tensor& mean, const Tensor& invstd, const Tensor& var,
                           const Tensor& patch_sum, const Tensor& gram, const Tensor& x,
                           const Tensor& conv_weight, const ConvGeometry& g, double eps);
void conv_batch_norm_relu_max_pool2x2_forward(const Tensor& out, const Tensor& codes,
                                              const Tensor& x, const Tensor& conv_weight,
                                              const ConvGeometry& g, const Tensor& weight,
                                              const Tensor& bias, const Tensor& mean,
                                              const Tensor& invstd);
void conv_batch_norm_relu_max_pool2x2_backward(
    const Tensor& dconv_weight, const Tensor& dweight, const Tensor& dbias, const Tensor& grad_out,
    const Tensor& codes, const Tensor& x, const Tensor& conv_weight,
    const ConvGeometry& g, const Tensor& patch_sum, const Tensor& gram, const Tensor& weight,
    const Tensor& mean, const Tensor& invstd, bool training);
}  // namespace kiln::kernels::cpu
