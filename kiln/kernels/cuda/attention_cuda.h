#pragma once
// The CUDA backend's fused scaled-dot-product attention (kiln/kernels/cuda/attention.cu). Same
// contracts as kiln::kernels::attention_forward / attention_backward in norm_kernels.h, for CUDA
// tensors only; kiln/kernels/norm_dispatch.cpp routes to them in a CUDA build.
//
// Supported: q, k, v, out (and g, dq, dk, dv) contiguous, all of one dtype: float32, float16,
// bfloat16 (read natively, accumulated in float32) or float64 (computed in double); lse in the
// stat dtype (float32, float64 for float64 data); head dims D and Dv up to
// attention_max_head_dim(). Anything else is a kiln::Error naming the operands.
#include <cstdint>

#include "kiln/core/tensor.h"

namespace kiln::kernels::cuda {

void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                       const Tensor& v, double scale, bool causal);
// dq, dk, dv may each be undefined (not wanted).
void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& g,
                        const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, double scale, bool causal);
// The largest head dimension (D and Dv) the kernels take: 128.
int64_t attention_max_head_dim();

}  // namespace kiln::kernels::cuda
