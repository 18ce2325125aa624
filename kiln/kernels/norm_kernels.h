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
