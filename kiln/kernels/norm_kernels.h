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
#include "kiln/kernels/nn_kernels.h"

namespace kiln::kernels {

// The dtype statistics are stored in for data of dtype `t`.
inline DType norm_stat_dtype(DType t) { return t == DType::F64 ? DType::F64 : DType::F32; }

// ---- batch norm: x, y contiguous, viewed as [N, C, S] (S = product of the spatial dims, 1 for
// [N, C]); weight, bias [C] or undefined; mean, invstd [C] in the stat dtype.
// training: computes the batch mean, the biased variance (into var, [C]) and invstd = 1/sqrt(var
// + eps) in one pass over x, then writes y in a second pass.
// !training: mean and invstd are inputs (from the running statistics); var is unused.
// y undefined (CPU): statistics only, for kernels that consume x themselves.
// relu: fused BatchNorm + ReLU, y = max(0, x * a_c + b_c) written in the same pass
// (a_c = invstd_c * w_c, b_c = bias_c - mean_c * a_c); the pre-activation is not stored.
void batch_norm_forward(const Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias,
                        const Tensor& mean, const Tensor& invstd, const Tensor& var, bool training,
                        double eps, bool relu = false);
// Gradients of batch_norm_forward; dx, dweight, dbias may each be undefined (not wanted).
// training: dx includes the terms through the batch statistics; otherwise dx = g * w * invstd.
// relu: gradients of the fused BatchNorm + ReLU. The ReLU mask is recomputed from x as
// x * a_c + b_c > 0 with the forward's a_c, b_c and expression (so it is the forward's mask
// exactly; `bias` is needed for b_c, undefined meaning 0) and g is masked before the sums and the
// dx pass. bias is unused without relu.
void batch_norm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                         const Tensor& g, const Tensor& x, const Tensor& weight,
                         const Tensor& mean, const Tensor& invstd, bool training,
                         bool relu = false, const Tensor& bias = Tensor());

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

// ---- row norm (layer norm, and RMS norm when rms): x, y contiguous [R, K], statistics per row;
// weight, bias [K] or undefined (bias unused by rms); mean (undefined for rms) and invstd [R].
void row_norm_forward(const Tensor& y, const Tensor& mean, const Tensor& invstd, const Tensor& x,
                      const Tensor& weight, const Tensor& bias, bool rms, double eps);
void row_norm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                       const Tensor& g, const Tensor& x, const Tensor& weight, const Tensor& mean,
                       const Tensor& invstd, bool rms);

// ---- dropout: out[i] = u_i >= p ? in[i] / (1 - p) : 0 with u_i = philox::uniform_f(seed,
// offset, i), i the element's index in row-major order. in, out contiguous, 0 <= p < 1.
void dropout(const Tensor& out, const Tensor& in, double p, uint64_t seed, uint64_t offset);

// ---- attention: q [B, Tq, D], k [B, Tk, D], v [B, Tk, Dv], out [B, Tq, Dv] contiguous, f32 or
// f64; lse [B, Tq] (stat dtype) receives log(sum(exp(scores))) per query row for the backward.
// Causal masking is aligned top-left (query i sees keys j <= i), as PyTorch's is_causal.
void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                       const Tensor& v, double scale, bool causal);
// dq, dk, dv like q, k, v (contiguous); g like out.
void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& g,
                        const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, double scale, bool causal);
// Query/key rows per block of the CPU kernel (exposed so tests can pick T not a multiple of it).
int64_t attention_block_size();

// ---- leaky ReLU: y = x > 0 ? x : slope * x; dx = g * (x > 0 ? 1 : slope). Contiguous operands.
void leaky_relu(const Tensor& y, const Tensor& x, double slope);
void leaky_relu_backward(const Tensor& dx, const Tensor& g, const Tensor& x, double slope);

}  // namespace kiln::kernels

// The CPU backend's entry points (same contracts, CPU tensors only).
namespace kiln::kernels::cpu {
void batch_norm_forward(const Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias,
                        const Tensor& mean, const Tensor& invstd, const Tensor& var, bool training,
                        double eps, bool relu);
void batch_norm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                         const Tensor& g, const Tensor& x, const Tensor& weight,
                         const Tensor& mean, const Tensor& invstd, bool training, bool relu,
                         const Tensor& bias);
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
void row_norm_forward(const Tensor& y, const Tensor& mean, const Tensor& invstd, const Tensor& x,
                      const Tensor& weight, const Tensor& bias, bool rms, double eps);
void row_norm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                       const Tensor& g, const Tensor& x, const Tensor& weight, const Tensor& mean,
                       const Tensor& invstd, bool rms);
void dropout(const Tensor& out, const Tensor& in, double p, uint64_t seed, uint64_t offset);
void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                       const Tensor& v, double scale, bool causal);
void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& g,
                        const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, double scale, bool causal);
int64_t attention_block_size();
void leaky_relu(const Tensor& y, const Tensor& x, double slope);
void leaky_relu_backward(const Tensor& dx, const Tensor& g, const Tensor& x, double slope);
}  // namespace kiln::kernels::cpu
