// CPU version of the loss scaler's unscale + inf check (see kernels/amp_kernels.h): every
// gradient is walked once, scaled in place, and non-finite values are counted per thread.
#include <omp.h>

#include <cmath>

#include "kiln/kernels/amp_kernels.h"
#include "kiln/kernels/cpu/loops.h"

namespace kiln::kernels {

namespace cpu {

void unscale_and_check_(const std::vector<Tensor>& grads, const Tensor& inv_scale, const Tensor& found_inf) {
  KILN_CHECK(inv_scale.numel() == 1 && found_inf.numel() == 1 && found_inf.dtype() == DType::F32,
             "unscale_and_check_: inv_scale and found_inf must be one-element tensors (found_inf f32)");
  const float inv = inv_scale.to(DType::F32).item<float>();  // a host value already on the CPU
  int64_t bad = 0;
  for (const Tensor& g : grads) {
    if (!g.defined() || g.numel() == 0) continue;
    KILN_CHECK(g.is_contiguous(), "unscale_and_check_: gradients must be contiguous");
    const int64_t n = g.numel();
    dispatch_floating(g.dtype(), "unscale_and_check_", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using M = opmath_t<T>;
      T* p = static_cast<T*>(g.data_ptr());
#pragma omp parallel for reduction(+ : bad) schedule(static) if (n >= kParallelGrain)
      for (int64_t i = 0; i < n; ++i) {
        M v = static_cast<M>(p[i]);
        bad += (v - v) != (v - v);  // NaN for Inf and NaN inputs
        p[i] = static_cast<T>(v * static_cast<M>(inv));
      }
    });
    g.storage()->bump_version();
  }
  if (bad > 0) {
    Tensor f = found_inf;
    f.fill_(1.0);
  }
}

}  // namespace cpu

void unscale_and_check_(const std::vector<Tensor>& grads, const Tensor& inv_scale, const Tensor& found_inf) {
  KILN_CHECK(found_inf.device().is_cpu(), "unscale_and_check_: the CUDA kernel is not written yet (issue: CUDA "
             "backend); GradScaler is disabled on the GPU until then");
  cpu::unscale_and_check_(grads, inv_scale, found_inf);
}

}  // namespace kiln::kernels
