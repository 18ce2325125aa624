#pragma once
// The conv-block kernel family: the fused kernels behind a Conv2d -> BatchNorm2d -> ReLU ->
// 2x2 max-pool chain (kiln::nn::ConvBatchNormReLU2d, F::conv2d_batch_norm_relu_max_pool2d,
// F::batch_norm_relu_max_pool2d). CPU only: the CPU backend registers each one
// (kernels/cpu/conv_bn_relu_pool.cpp, bn_relu_pool.cpp, conv_batch_stats.cpp); no CUDA backend is
// registered, so a CUDA operand reaching one is an error naming the op. The ops never let that
// happen: each checks its kernels' preconditions with the supports_* functions below first and
// runs the unfused ops (conv2d, batch_norm_relu, max_pool2d) when they are not met.
//
// Statistics (mean, invstd, var) are in the stat dtype of kernels::norm_stat_dtype.
#include <cstdint>
#include <functional>

#include "kiln/core/tensor.h"
#include "kiln/kernels/dispatch.h"
#include "kiln/kernels/conv.h"

namespace kiln::kernels {

// ---- preconditions of the fused kernels (shapes, dtypes, layout and device only; the ops
// check autocast and autograd themselves).

// batch_norm_relu_max_pool2x2_*: x a contiguous NCHW floating CPU tensor with H, W >= 2.
bool supports_batch_norm_relu_max_pool2x2(const Tensor& x);

// The largest conv patch (C * kh * kw) the small-patch kernel keeps in registers.
constexpr int64_t kConvBnPoolMaxPatch = 32;
// conv_batch_norm_*: the small-patch fused conv block for conv geometry g: x a contiguous NCHW
// f32/f64 CPU tensor, conv_weight a [K, C, kh, kw] CPU tensor of x's dtype, stride 1, groups 1,
// C * kh * kw <= kConvBnPoolMaxPatch, a conv output of at least 2x2 whose per-sample planes fit
// a thread's cache-sized buffer (8 MB).
bool supports_conv_batch_norm_relu_max_pool2x2(const Tensor& x, const Tensor& conv_weight, const ConvGeometry& g);
// conv2d_forward_batch_stats and conv2d_batch_norm_relu_max_pool2x2_backward: x a contiguous
// NCHW f32/f64 CPU tensor, a conv output with at least one element.
bool supports_conv2d_batch_stats(const Tensor& x, const ConvGeometry& g);

// ---- fused BatchNorm + ReLU + 2x2/2 max pool (kernels/cpu/bn_relu_pool.cpp): x contiguous NCHW
// with H, W >= 2; out, indices, pooled_x [N, C, H/2, W/2] contiguous, indices int32 flat h * W + w
// as max_pool2d's, pooled_x (optional in the forward) the input at the argmax. mean, invstd [C]
// come from batch_norm_forward with an undefined y (statistics only) or from the running
// statistics. The forward pools max(0, fma(x, a_c, b_c)) without writing the normalised tensor;
// the backward takes the pooled gradient, the forward's out, pooled_x and indices, and produces
// batch_norm_backward's dx, dweight, dbias (each may be undefined).
inline Kernel<void(const Tensor& out, const Tensor& indices, const Tensor& pooled_x, const Tensor& x,
                   const Tensor& weight, const Tensor& bias, const Tensor& mean, const Tensor& invstd)>
    batch_norm_relu_max_pool2x2_forward{"batch_norm_relu_max_pool2d"};
inline Kernel<void(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& grad_out,
                   const Tensor& out, const Tensor& pooled_x, const Tensor& indices, const Tensor& x,
                   const Tensor& weight, const Tensor& mean, const Tensor& invstd, bool training)>
    batch_norm_relu_max_pool2x2_backward{"batch_norm_relu_max_pool2d_backward"};

// ---- conv2d (NCHW) with the batch mean and biased variance of its output per channel ([K],
// stat dtype) taken in its epilogue, while each sample's output is in cache (per-sample mean and
// sum of squared deviations, combined in sample order in f64): the statistics pass of the
// BatchNorm that follows. Never autotuned: it always runs the NCHW kernel, through
// cpu::conv2d_forward_epilogue (kernels/cpu/conv_batch_stats.cpp).
inline Kernel<void(const Tensor& out, const Tensor& mean, const Tensor& var, const Tensor& x, const Tensor& weight,
                   const Tensor& bias, const ConvGeometry& g)>
    conv2d_forward_batch_stats{"conv2d_forward_batch_stats"};

// ---- backward of conv2d followed by batch_norm_relu_max_pool2x2 (kernels/cpu/bn_relu_pool.cpp):
// the conv output's gradient is produced one sample at a time in cache and fed to the conv's
// weight- and input-gradient GEMMs (cpu::conv2d_backward_generated), never stored. y is the conv
// output (the BN input), conv_x / conv_w the conv's input and weight; the other operands as in
// batch_norm_relu_max_pool2x2_backward. dconv_x, dconv_w, dweight, dbias may each be undefined.
inline Kernel<void(const Tensor& dconv_x, const Tensor& dconv_w, const Tensor& dweight, const Tensor& dbias,
                   const Tensor& grad_out, const Tensor& out, const Tensor& pooled_x, const Tensor& indices,
                   const Tensor& y, const Tensor& conv_x, const Tensor& conv_w, const ConvGeometry& g,
                   const Tensor& weight, const Tensor& mean, const Tensor& invstd, bool training)>
    conv2d_batch_norm_relu_max_pool2x2_backward{"conv2d_batch_norm_relu_max_pool2d_backward"};

// ---- fused conv2d + BatchNorm + ReLU + 2x2/2 max pool for small-patch convolutions
// (kernels/cpu/conv_bn_relu_pool.cpp): max_pool2d(relu(batch_norm(conv2d(x, conv_weight))), 2)
// without writing the conv output, under supports_conv_batch_norm_relu_max_pool2x2. out, codes
// [N, K, OH/2, OW/2] contiguous, codes uint8 per window: bit 0 the argmax's column in the
// window, bit 1 its row, bit 2 set when out > 0 (its ReLU on).
// conv_batch_norm_stats (training): the batch mean, biased var and invstd = 1/sqrt(var + eps) of
// the conv output per channel ([K]; var may be undefined), from the patch moments patch_sum
// [C*kh*kw] and gram [C*kh*kw, C*kh*kw] (f64, written, needed by the backward). Returns false
// when a channel's variance is too small next to its second moment for the moments' precision
// (an input whose mean dwarfs its spread): a precondition on the data, which only the moments
// reveal; the op then runs the conv and the BatchNorm separately.
// The forward takes mean/invstd from there or from the running statistics; the backward takes the
// pooled gradient and the forward's codes and writes the conv weight's gradient and BatchNorm's
// dweight/dbias (each may be undefined; patch_sum/gram only used when training).
inline Kernel<bool(const Tensor& mean, const Tensor& invstd, const Tensor& var, const Tensor& patch_sum,
                   const Tensor& gram, const Tensor& x, const Tensor& conv_weight, const ConvGeometry& g, double eps)>
    conv_batch_norm_stats{"conv2d_batch_norm_relu_max_pool2d"};
inline Kernel<void(const Tensor& out, const Tensor& codes, const Tensor& x, const Tensor& conv_weight,
                   const ConvGeometry& g, const Tensor& weight, const Tensor& bias, const Tensor& mean,
                   const Tensor& invstd)>
    conv_batch_norm_relu_max_pool2x2_forward{"conv2d_batch_norm_relu_max_pool2d"};
inline Kernel<void(const Tensor& dconv_weight, const Tensor& dweight, const Tensor& dbias, const Tensor& grad_out,
                   const Tensor& codes, const Tensor& x, const Tensor& conv_weight, const ConvGeometry& g,
                   const Tensor& patch_sum, const Tensor& gram, const Tensor& weight, const Tensor& mean,
                   const Tensor& invstd, bool training)>
    conv_batch_norm_relu_max_pool2x2_backward{"conv2d_batch_norm_relu_max_pool2d_backward"};

namespace cpu {
// The NCHW kernel's hooks for fused kernels (kernels/cpu/conv.cpp), general over what is fused.
//
// conv2d (NCHW, CPU) into `out`, calling samples_done(n0, n1) once per block of samples, from the
// thread that computed it, right after their output planes are written, while they are in cache
// (conv_batch_stats.cpp takes a following BatchNorm's statistics there). Never autotuned.
using SamplesDone = std::function<void(int64_t n0, int64_t n1)>;
void conv2d_forward_epilogue(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias,
                             const ConvGeometry& g, const SamplesDone& samples_done);
// conv2d's weight gradient (grad_weight) and input gradient (grad_x) for an output gradient that
// is never stored: make_dy(n, dy) writes sample n's [K, OH, OW] gradient (x's dtype) into a
// per-thread buffer, which goes straight into both GEMMs while it is in cache. NCHW only;
// either output may be undefined; the weight gradient's per-thread sums are combined in thread
// order over a static split of the samples (reproducible for a fixed thread count).
// (Used by the conv-block backward in kernels/cpu/bn_relu_pool.cpp.)
void conv2d_backward_generated(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& x, const Tensor& weight,
                               const ConvGeometry& g, const std::function<void(int64_t n, void* dy)>& make_dy);
}  // namespace cpu

}  // namespace kiln::kernels
