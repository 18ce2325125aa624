// Softmax / log-softmax over the last dimension of a contiguous tensor, one row per iteration,
// rows spread across threads. Computed in opmath precision with the max subtracted first.
#include <cmath>

#include "kiln/kernels/copy_fill.h"
#include "kiln/kernels/matmul.h"
#include "kiln/kernels/pointwise.h"
#include "kiln/kernels/reduce.h"
#include "kiln/kernels/softmax.h"
#include "kiln/kernels/cpu/loops.h"
#include "kiln/kernels/math/fast_math.h"

namespace kiln::kernels::cpu {

void softmax(const Tensor& out, const Tensor& in, bool log) {
  KILN_CHECK(in.is_contiguous() && out.is_contiguous() && in.dtype() == out.dtype(),
             "softmax: expects contiguous operands of one dtype");
  if (in.numel() == 0) return;
  const int64_t n = in.dim() == 0 ? 1 : in.size(-1);
  const int64_t rows = in.numel() / n;
  dispatch_floating(in.dtype(), log ? "log_softmax" : "softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = opmath_t<T>;
    for_each_contiguous_row(
        static_cast<const T*>(in.data_ptr()), static_cast<T*>(out.data_ptr()), rows, n, [&](const T* x, T* y) {
          M mx = -INFINITY;
#pragma omp simd reduction(max : mx)
          for (int64_t i = 0; i < n; ++i) mx = std::max(mx, static_cast<M>(x[i]));
          if (std::isinf(mx) && mx < 0) mx = 0;  // a row of -inf: avoid (-inf) - (-inf)
          const double sum = blocked_sum(n, [&](int64_t i) { return math::exp_(static_cast<M>(x[i]) - mx); });
          if (log) {
            // (x - max) - log(sum): subtracting the max first keeps large logits exact
            M log_sum = static_cast<M>(std::log(sum));
            for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>((static_cast<M>(x[i]) - mx) - log_sum);
          } else {
            M inv = static_cast<M>(1.0 / sum);
            for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(math::exp_(static_cast<M>(x[i]) - mx) * inv);
          }
        });
  });
}
KILN_REGISTER_KERNEL(kernels::softmax, CPU, softmax);

void softmax_backward(const Tensor& grad_in, const Tensor& grad_out, const Tensor& out, bool log) {
  KILN_CHECK(grad_in.is_contiguous() && grad_out.is_contiguous() && out.is_contiguous(),
             "softmax_backward: expects contiguous operands");
  if (out.numel() == 0) return;
  const int64_t n = out.dim() == 0 ? 1 : out.size(-1);
  const int64_t rows = out.numel() / n;
  dispatch_floating(out.dtype(), "softmax_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = opmath_t<T>;
    const T* g = static_cast<const T*>(grad_out.data_ptr());
    const T* y = static_cast<const T*>(out.data_ptr());
    T* gi = static_cast<T*>(grad_in.data_ptr());
#pragma omp parallel for schedule(static) if (out.numel() >= kParallelGrain)
    for (int64_t r = 0; r < rows; ++r) {
      const T* gr = g + r * n;
      const T* yr = y + r * n;
      T* o = gi + r * n;
      if (log) {
        const M dot = static_cast<M>(blocked_sum(n, [&](int64_t i) { return static_cast<M>(gr[i]); }));
        for (int64_t i = 0; i < n; ++i)
          o[i] = static_cast<T>(static_cast<M>(gr[i]) - math::exp_(static_cast<M>(yr[i])) * dot);
      } else {
        const M dot =
            static_cast<M>(blocked_sum(n, [&](int64_t i) { return static_cast<M>(gr[i]) * static_cast<M>(yr[i]); }));
        for (int64_t i = 0; i < n; ++i) o[i] = static_cast<T>(static_cast<M>(yr[i]) * (static_cast<M>(gr[i]) - dot));
      }
    }
  });
}
KILN_REGISTER_KERNEL(kernels::softmax_backward, CPU, softmax_backward);

}  // namespace kiln::kernels::cpu
