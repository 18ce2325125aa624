#pragma once
// Normalisation kernels behind kiln::nn::functional (no autograd): batch norm (optionally
// with a fused ReLU) and the row norms (layer norm, RMS norm), forward and backward. CPU:
// kernels/cpu/norm.cpp; CUDA: kernels/cuda/norm.cu.
//
// Statistics (mean, invstd, var) are kept in the "stat dtype": f64 for f64 inputs, f32 for every
// other floating dtype. Data operands must be contiguous and share one floating dtype.
#include <cstdint>

#include "kiln/core/tensor.h"
#include "kiln/kernels/dispatch.h"

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
inline Kernel<void(const Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& mean,
                   const Tensor& invstd, const Tensor& var, bool training, double eps, bool relu)>
    batch_norm_forward{"batch_norm"};
// Gradients of batch_norm_forward; dx, dweight, dbias may each be undefined (not wanted).
// training: dx includes the terms through the batch statistics; otherwise dx = g * w * invstd.
// relu: gradients of the fused BatchNorm + ReLU. The ReLU mask is recomputed from x as
// x * a_c + b_c > 0 with the forward's a_c, b_c and expression (so it is the forward's mask
// exactly; `bias` is needed for b_c, undefined meaning 0) and g is masked before the sums and the
// dx pass. bias is unused without relu.
inline Kernel<void(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& g, const Tensor& x,
                   const Tensor& weight, const Tensor& mean, const Tensor& invstd, bool training, bool relu,
                   const Tensor& bias)>
    batch_norm_backward{"batch_norm_backward"};

// ---- row norm (layer norm, and RMS norm when rms): x, y contiguous [R, K], statistics per row;
// weight, bias [K] or undefined (bias unused by rms); mean (undefined for rms) and invstd [R].
inline Kernel<void(const Tensor& y, const Tensor& mean, const Tensor& invstd, const Tensor& x, const Tensor& weight,
                   const Tensor& bias, bool rms, double eps)>
    row_norm_forward{"layer_norm"};
inline Kernel<void(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& g, const Tensor& x,
                   const Tensor& weight, const Tensor& mean, const Tensor& invstd, bool rms)>
    row_norm_backward{"layer_norm_backward"};

}  // namespace kiln::kernels
