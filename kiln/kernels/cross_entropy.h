#pragma once
// Fused softmax + cross-entropy (class-index targets), forward and backward, as raw kernels (no
// autograd): kiln::cross_entropy (kiln/ops/softmax_loss.cpp) is built on them.
//
// Forward, per row r of logits x [R, C] with target t = target[r] and smoothing e:
//   m = max_j x_j,  s = sum_j exp(x_j - m),  lse = m + log s
//   loss = (1 - e) * (lse - x_t) + e * (lse - mean_j x_j)        (0 when t == ignore_index)
// and lse is saved per row, so the backward needs neither the probabilities nor a second
// softmax:
//   dx_j = (exp(x_j - lse) - q_j) * g_r,  q_j = e / C + (j == t) * (1 - e)   (0 for ignored rows)
// One read of x forward, one read of x and one write of dx backward.
//
// kiln/kernels/cross_entropy.cpp checks the operands every backend relies on and dispatches to
// kiln/kernels/cpu/xent.cpp (OpenMP over rows,
// vectorized row loops) or kiln/kernels/cuda/xent.cu (a warp per row for small C, a block per row
// otherwise). The per-row math below is shared by both, so the CPU tests check it.
//
// Targets out of range (t != ignore_index and t < 0 or t >= C):
//   - CPU: cross_entropy_forward throws a kiln::Error naming the target and its position;
//   - CUDA: no host synchronisation; the row's loss (and, in the backward, the row's gradient)
//     is written as NaN, so a bad label shows up as a NaN loss instead of stalling every step.
#include <cmath>
#include <cstdint>

#include "kiln/core/macros.h"
#include "kiln/core/tensor.h"
#include "kiln/kernels/dispatch.h"
#include "kiln/kernels/math/fast_math.h"

namespace kiln::kernels {

// The dtype of the saved lse and of the per-row loss: f64 for f64 logits, f32 otherwise.
inline DType xent_stat_dtype(DType logits) { return logits == DType::F64 ? DType::F64 : DType::F32; }

// logits [R, C] contiguous (f32, f64, f16, bf16); target [R] contiguous int64 or int32;
// loss, lse [R] contiguous in xent_stat_dtype(logits). All on one device.
void cross_entropy_forward(const Tensor& loss, const Tensor& lse, const Tensor& logits, const Tensor& target,
                           int64_t ignore_index, double label_smoothing);

// dx [R, C] contiguous, dtype of logits; grad: the loss gradient per row in the stat dtype,
// contiguous with R elements, or a single element used for every row (the sum/mean reductions;
// a device scalar, so nothing is read on the host); lse from the forward.
void cross_entropy_backward(const Tensor& dx, const Tensor& grad, const Tensor& logits, const Tensor& lse,
                            const Tensor& target, int64_t ignore_index, double label_smoothing);

// The backends' slots behind the two checked entry points above.
namespace backend {
inline Kernel<void(const Tensor& loss, const Tensor& lse, const Tensor& logits, const Tensor& target,
                   int64_t ignore_index, double label_smoothing)>
    cross_entropy_forward{"cross_entropy"};
inline Kernel<void(const Tensor& dx, const Tensor& grad, const Tensor& logits, const Tensor& lse, const Tensor& target,
                   int64_t ignore_index, double label_smoothing)>
    cross_entropy_backward{"cross_entropy_backward"};
}  // namespace backend

// ---- the per-row math both backends use (M: float or double)
namespace xent {

// The float/double log, unqualified below (CUDA's global overloads under nvcc, <cmath>'s on the
// host) and ahead of kiln::log(Tensor).
#if defined(__CUDACC__)
using ::log;
#else
using std::log;
#endif

// What a row's target asks for.
enum TargetKind : int { kClass = 0, kIgnored = 1, kOutOfRange = 2 };

KILN_INLINE int target_kind(int64_t t, int64_t C, int64_t ignore_index) {
  if (t == ignore_index) return kIgnored;
  return (t < 0 || t >= C) ? kOutOfRange : kClass;
}

// Online (max, sum of exp) pair: after pushing x_1..x_n, sum == sum_i exp(x_i - max).
// -inf entries add nothing; a NaN entry makes sum NaN; +inf makes max inf.
template <class M> struct MaxSum {
  M max;
  M sum;
};

template <class M> KILN_INLINE MaxSum<M> maxsum_init() { return MaxSum<M>{-static_cast<M>(INFINITY), M(0)}; }

template <class M> KILN_INLINE void maxsum_push(MaxSum<M>& a, M x) {
  if (x > a.max) {
    a.sum = a.sum * math::exp_(a.max - x) + M(1);  // a.max = -inf: 0 * 0 + 1
    a.max = x;
  } else if (x == x && x != -static_cast<M>(INFINITY)) {
    a.sum += math::exp_(x - a.max);
  } else if (x != x) {
    a.sum = x;  // NaN
  }
}

template <class M> KILN_INLINE MaxSum<M> maxsum_merge(MaxSum<M> a, MaxSum<M> b) {
  if (b.max == -static_cast<M>(INFINITY)) return MaxSum<M>{a.max, a.sum + b.sum};  // b.sum: 0 or NaN
  if (a.max == -static_cast<M>(INFINITY)) return MaxSum<M>{b.max, a.sum + b.sum};
  const M m = a.max > b.max ? a.max : b.max;
  return MaxSum<M>{m, a.sum * math::exp_(a.max - m) + b.sum * math::exp_(b.max - m)};
}

// A row's loss and lse from its statistics: max m (any value; a row of -inf has m = -inf),
// sum s = sum_j exp(x_j - m), sum_x = sum_j x_j, and the target's logit x_t.
// The loss is formed as log(s) - (x_t - m), not lse - x_t, so a confident prediction with large
// logits keeps its small loss accurate.
template <class M> struct RowLoss {
  M loss;
  M lse;
};

template <class M> KILN_INLINE RowLoss<M> row_loss(M m, M s, M sum_x, M x_t, int64_t C, M eps) {
  if (m == -static_cast<M>(INFINITY)) m = M(0);  // a row of -inf: avoid (-inf) - (-inf)
  const M log_s = log(s);
  const M nll = log_s - (x_t - m);
  M loss = nll;
  if (eps != M(0)) {  // skipped without smoothing, so -inf logits (masks) do not make it NaN
    const M smooth = log_s - (sum_x / static_cast<M>(C) - m);
    loss = (M(1) - eps) * nll + eps * smooth;
  }
  return RowLoss<M>{loss, m + log_s};
}

// One element of the gradient: (softmax_j - q_j) * g, with softmax_j = exp(x_j - lse).
template <class M> KILN_INLINE M grad_elem(M x, M lse, M q, M g) { return (math::exp_(x - lse) - q) * g; }

// The smoothed target weight q of a non-target class (e / C); the target gets q + (1 - e).
template <class M> KILN_INLINE M q_other(M eps, int64_t C) { return eps / static_cast<M>(C); }

}  // namespace xent
}  // namespace kiln::kernels
