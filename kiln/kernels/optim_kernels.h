#pragma once
// Multi-tensor optimizer and gradient-norm kernels (GUIDE-TIPS #5, #14; DESIGN.md §3.2-3.3).
//
// One call updates ALL parameters of a group: the launcher walks the tensor lists in fixed-size
// chunks (the CPU launcher spreads chunks over OpenMP threads and runs each as a vectorizable
// loop; a CUDA launcher maps chunks to blocks, as apex's multi_tensor_apply does). The per-element
// math is kiln/kernels/math/optim.h. Every per-step scalar that changes during training - the
// learning rate, each parameter's step count, the loss scaler's found-inf flag and grad scale - is
// read from a tensor on the parameters' device, so the CUDA launcher can take the same arguments and
// a whole step stays free of host synchronisation (capturable in a CUDA graph).
#include <cstdint>
#include <vector>

#include "kiln/core/tensor.h"
#include "kiln/kernels/math/optim.h"

namespace kiln::math {
// The per-element lerp of multi_tensor_lerp_, shared by both launchers: x + w (y - x).
template <class T>
struct LerpOp {
  T w;
  KILN_INLINE T operator()(T x, T y) const { return x + w * (y - x); }
};
}  // namespace kiln::math

namespace kiln::kernels {

// The tensors one fused step reads and writes. Entry i of every list belongs to parameter i;
// a parameter whose grads[i] is undefined is skipped (its step does not advance).
//   params      any floating dtype; dense (contiguous, or any permutation of contiguous strides)
//   grads       same dtype, sizes and strides as params[i]
//   exp_avgs    Adam/LAMB first moment, SGD/LARS momentum buffer; undefined where unused (SGD
//               without momentum). dtype: f32 for f32/f16/bf16 params, f64 for f64 params; same
//               strides as the param
//   exp_avg_sqs Adam/LAMB second moment (same rules); undefined for SGD/LARS
//   masters     f32 master weights for f16/bf16 params (updated, then rounded into params[i]);
//               undefined for f32/f64 params
//   steps       one-element f64 tensors, each parameter's step count; the call adds 1 (the update
//               uses the incremented value, as PyTorch does)
//   fresh_momentum  optional (empty or one per param): nonzero where the momentum buffer was just
//               created, so SGD/LARS set buf = d instead of blending (PyTorch's first step)
struct MultiTensorLists {
  std::vector<Tensor> params, grads, exp_avgs, exp_avg_sqs, masters, steps;
  std::vector<uint8_t> fresh_momentum;
};

// Scalars read from device tensors. lr: one element (any float dtype, f64 preferred so f64
// parameters get an exact lr). found_inf (optional): one element; when nonzero the call changes
// nothing (no parameter, state or step update). grad_scale (optional): one element; gradients are
// multiplied by 1 / grad_scale before use (the loss scaler's unscale fused into the step).
struct StepScalars {
  Tensor lr;
  Tensor found_inf;
  Tensor grad_scale;
};

// One fused optimizer step over every tensor of the lists (see above).
void fused_optimizer_step(const math::OptimHyper& hyper, const MultiTensorLists& lists,
                          const StepScalars& scalars);

// The p-norm of all tensors together, (sum_i sum_j |t_ij|^p)^(1/p) (max |t_ij| for p = inf), in
// one multi-tensor reduction, returned as a 0-dim tensor on the tensors' device: f64 when any
// tensor is f64, else f32. NaN in any tensor gives NaN. Partial sums are combined in a fixed order,
// so the result does not depend on the thread count. Empty list: 0.
Tensor multi_tensor_norm(const std::vector<Tensor>& tensors, double norm_type);

// tensors[i] *= scale (a one-element tensor on the same device, read where the kernel runs), in
// one multi-tensor pass. The arithmetic is done in each tensor's opmath type.
void multi_tensor_scale_(const std::vector<Tensor>& tensors, const Tensor& scale);

// dst[i] += weight * (src[i] - dst[i]) for every pair, in one multi-tensor pass (the EMA update:
// weight = 1 - decay). dst[i] and src[i] share dtype, sizes and device; the arithmetic is done in
// the opmath type (math::LerpOp). weight is a host value: it changes on the host (EMA warm-up),
// not on the device.
void multi_tensor_lerp_(const std::vector<Tensor>& dst, const std::vector<Tensor>& src, double weight);

namespace cpu {
void fused_optimizer_step(const math::OptimHyper& hyper, const MultiTensorLists& lists,
                          const StepScalars& scalars);
Tensor multi_tensor_norm(const std::vector<Tensor>& tensors, double norm_type);
void multi_tensor_scale_(const std::vector<Tensor>& tensors, const Tensor& scale);
void multi_tensor_lerp_(const std::vector<Tensor>& dst, const std::vector<Tensor>& src, double weight);
}  // namespace cpu

}  // namespace kiln::kernels
