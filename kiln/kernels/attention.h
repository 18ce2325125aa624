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

// cuDNN's fused attention (kernels/cuda/attention_cudnn.cpp, registered in CUDA builds with
// cudnn-frontend; the rules in kiln/cuda/cudnn_graph.h): f16/bf16 q, k, v [B, H, T, D] and out
// [B, H, Tq, Dv] with any strides that graph::sdpa_operand_ok accepts, lse [B * H, Tq] f32
// contiguous (the same values as attention_forward's). Returns false, having written nothing,
// when cuDNN does not take the case; the caller then runs attention_forward. The profiler shows
// these calls under their own names.
inline Kernel<bool(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                   double scale, bool causal)>
    attention_forward_cudnn{"scaled_dot_product_attention_cudnn"};
// dq, dk, dv (all three defined, like q, k, v, any accepted strides) are written; g like out. The
// backward is deterministic when kiln::deterministic_algorithms() or kiln::cudnn::deterministic()
// is on.
inline Kernel<bool(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& g, const Tensor& q,
                   const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, double scale, bool causal)>
    attention_backward_cudnn{"scaled_dot_product_attention_backward_cudnn"};

namespace cpu {
// Query/key rows per block of the CPU kernel (exposed so tests can pick T not a multiple of it).
int64_t attention_block_size();
}  // namespace cpu

namespace cuda {
// The largest head dimension the CUDA kernels take (defined in CUDA builds only).
int64_t attention_max_head_dim();
}  // namespace cuda

}  // namespace kiln::kernels
