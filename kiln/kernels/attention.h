#pragma once
// Blocked (online-softmax) scaled dot-product attention, forward and backward. CPU:
// kernels/cpu/attention.cpp; CUDA: kernels/cuda/attention.cu (f16/bf16/f32, head dimension up to
// kernels::cuda::attention_max_head_dim()).
#include <cstdint>

#include "kiln/core/tensor.h"
#include "kiln/kernels/dispatch.h"

namespace kiln::kernels {

// q [B, Tq, D], k [B, Tk, D], v [B, Tk, Dv], out [B, Tq, Dv] contiguous, f32 or
// f64; lse [B, Tq] (stat dtype) receives log(sum(exp(scores))) per query row for the backward.
// The CPU kernel also takes 4-D [B, H, T, D] operands with any strides but a unit one in D (lse
// [B * H, Tq] contiguous), so the op hands it views of a fused projection without copies; the
// CUDA kernel takes the contiguous 3-D form only.
// Causal masking is aligned top-left (query i sees keys j <= i), as PyTorch's is_causal.
inline Kernel<void(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                   double scale, bool causal)>
    attention_forward{"scaled_dot_product_attention"};
// dq, dk, dv like q, k, v (contiguous); g like out.
inline Kernel<void(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& g, const Tensor& q,
                   const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, double scale, bool causal)>
    attention_backward{"scaled_dot_product_attention_backward"};

namespace cpu {
// Query/key rows per block of the CPU kernel (exposed so tests can pick T not a multiple of it).
int64_t attention_block_size();
}  // namespace cpu

namespace cuda {
// The largest head dimension the CUDA kernels take (defined in CUDA builds only).
int64_t attention_max_head_dim();
}  // namespace cuda

}  // namespace kiln::kernels
