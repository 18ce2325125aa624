// Fused softmax + cross-entropy on the CPU (contract and formulas: kiln/kernels/cross_entropy.h).
//
// Forward: rows are spread over OpenMP threads; each row is read twice while it sits in cache
// (max and sum of x in one vectorized pass, then the sum of exp(x - max) with the vectorizable
// fast exp), and only two numbers per row are written (loss, lse).
// Backward: one vectorized pass per row writes dx = (exp(x - lse) - e/C) * g, then the target
// element is rewritten with its extra -(1 - e) * g. No probabilities are stored between passes.
// Targets are range-checked before any work, so a bad label is a clear error (the CUDA kernel
// writes NaN instead, to avoid a host synchronisation).
#include <algorithm>
#include <cmath>
#include <limits>

#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/kernels/cpu/loops.h"
#include "kiln/kernels/cross_entropy.h"
#include "kiln/kernels/math/xent_dispatch.h"

namespace kiln::kernels::cpu {

namespace {

template <class I> void check_targets(const I* t, int64_t R, int64_t C, int64_t ignore_index) {
  for (int64_t r = 0; r < R; ++r) {
    const int64_t v = static_cast<int64_t>(t[r]);
    KILN_CHECK(xent::target_kind(v, C, ignore_index) != xent::kOutOfRange, "cross_entropy: target ", v, " at position ",
               r, " is out of range for ", C, " classes (ignore_index is ", ignore_index, ")");
  }
}

template <class T, class I>
void forward_rows(opmath_t<T>* loss, opmath_t<T>* lse, const T* logits, const I* target, int64_t R, int64_t C,
                  int64_t ignore_index, double label_smoothing) {
  using M = opmath_t<T>;
  const M eps = static_cast<M>(label_smoothing);
#pragma omp parallel for schedule(static) if (R * C >= kParallelGrain)
  for (int64_t r = 0; r < R; ++r) {
    const T* x = logits + r * C;
    // The max and the sum of x in one pass, the sums blocked as blocked_sum does (loops.h): the
    // same on every ISA, at full vector width.
    M mx = -std::numeric_limits<M>::infinity();
    double sx_sum = 0;
    for (int64_t b = 0; b < C; b += kSumBlock) {
      const int64_t e = std::min(C, b + kSumBlock);
      M bs = 0;
#pragma omp simd reduction(max : mx) reduction(+ : bs)
      for (int64_t j = b; j < e; ++j) {
        const M v = static_cast<M>(x[j]);
        mx = std::max(mx, v);
        bs += v;
      }
      sx_sum += static_cast<double>(bs);
    }
    const M m = (std::isinf(mx) && mx < 0) ? M(0) : mx;  // the same shift row_loss uses
    const M sx = static_cast<M>(sx_sum);
    const M s = static_cast<M>(blocked_sum(C, [&](int64_t j) { return math::exp_(static_cast<M>(x[j]) - m); }));
    const int64_t t = static_cast<int64_t>(target[r]);
    const int kind = xent::target_kind(t, C, ignore_index);
    const M x_t = kind == xent::kClass ? static_cast<M>(x[t]) : M(0);
    const xent::RowLoss<M> rl = xent::row_loss(mx, s, sx, x_t, C, eps);
    lse[r] = rl.lse;
    loss[r] = kind == xent::kClass ? rl.loss : kind == xent::kIgnored ? M(0) : std::numeric_limits<M>::quiet_NaN();
  }
}

template <class T, class I>
void backward_rows(T* dx, const opmath_t<T>* grad, int64_t grad_stride, const T* logits, const opmath_t<T>* lse,
                   const I* target, int64_t R, int64_t C, int64_t ignore_index, double label_smoothing) {
  using M = opmath_t<T>;
  const M eps = static_cast<M>(label_smoothing);
  const M q = xent::q_other(eps, C);
#pragma omp parallel for schedule(static) if (R * C >= kParallelGrain)
  for (int64_t r = 0; r < R; ++r) {
    const T* x = logits + r * C;
    T* d = dx + r * C;
    const int64_t t = static_cast<int64_t>(target[r]);
    const int kind = xent::target_kind(t, C, ignore_index);
    if (kind == xent::kIgnored) {
      std::fill(d, d + C, T(0));
      continue;
    }
    const M g = kind == xent::kClass ? grad[r * grad_stride] : std::numeric_limits<M>::quiet_NaN();
    const M l = lse[r];
#pragma omp simd
    for (int64_t j = 0; j < C; ++j) d[j] = static_cast<T>(xent::grad_elem(static_cast<M>(x[j]), l, q, g));
    if (kind == xent::kClass) d[t] = static_cast<T>(xent::grad_elem(static_cast<M>(x[t]), l, q + (M(1) - eps), g));
  }
}

}  // namespace

void cross_entropy_forward(const Tensor& loss, const Tensor& lse, const Tensor& logits, const Tensor& target,
                           int64_t ignore_index, double label_smoothing) {
  const int64_t R = logits.size(0), C = logits.size(1);
  xent::dispatch_logits_targets(logits, target, "cross_entropy", [&](auto tag, auto itag) {
    using T = typename decltype(tag)::type;
    using M = opmath_t<T>;
    using I = typename decltype(itag)::type;
    const I* tp = static_cast<const I*>(target.data_ptr());
    check_targets(tp, R, C, ignore_index);
    forward_rows<T, I>(static_cast<M*>(loss.data_ptr()), static_cast<M*>(lse.data_ptr()),
                       static_cast<const T*>(logits.data_ptr()), tp, R, C, ignore_index, label_smoothing);
  });
}
KILN_REGISTER_KERNEL(kernels::backend::cross_entropy_forward, CPU, cross_entropy_forward);

void cross_entropy_backward(const Tensor& dx, const Tensor& grad, const Tensor& logits, const Tensor& lse,
                            const Tensor& target, int64_t ignore_index, double label_smoothing) {
  const int64_t R = logits.size(0), C = logits.size(1);
  const int64_t grad_stride = grad.numel() == 1 ? 0 : 1;
  xent::dispatch_logits_targets(logits, target, "cross_entropy_backward", [&](auto tag, auto itag) {
    using T = typename decltype(tag)::type;
    using M = opmath_t<T>;
    using I = typename decltype(itag)::type;
    backward_rows<T, I>(static_cast<T*>(dx.data_ptr()), static_cast<const M*>(grad.data_ptr()), grad_stride,
                        static_cast<const T*>(logits.data_ptr()), static_cast<const M*>(lse.data_ptr()),
                        static_cast<const I*>(target.data_ptr()), R, C, ignore_index, label_smoothing);
  });
}
KILN_REGISTER_KERNEL(kernels::backend::cross_entropy_backward, CPU, cross_entropy_backward);

}  // namespace kiln::kernels::cpu
