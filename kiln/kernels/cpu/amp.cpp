// CPU versions of the loss scaler's kernels (see kernels/amp_kernels.h): the unscale + inf check
// walks every gradient once, scales it in place and counts non-finite values per thread; the
// scale update runs math::update_loss_scale on the host values.
#include <omp.h>

#include <cmath>

#include "kiln/kernels/copy_fill.h"
#include "kiln/kernels/amp_kernels.h"
#include "kiln/kernels/cpu/loops.h"

namespace kiln::kernels::cpu {
namespace {

void unscale_and_check(const std::vector<Tensor>& grads, const Tensor& inv_scale, const Tensor& found_inf) {
  KILN_CHECK(inv_scale.defined() && found_inf.defined() && inv_scale.numel() == 1 && found_inf.numel() == 1 &&
                 found_inf.dtype() == DType::F32,
             "unscale_and_check_: inv_scale and found_inf must be one-element tensors (found_inf f32)");
  const float inv = to_dtype(inv_scale, DType::F32).item<float>();  // a host value already on the CPU
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
    fill(found_inf, 1.0);
    found_inf.storage()->bump_version();
  }
}

void amp_update_scale(const Tensor& scale, const Tensor& growth_tracker, const Tensor& skipped, const Tensor& found_inf,
                      double growth_factor, double backoff_factor, int64_t growth_interval) {
  check_update_scale_args(scale, growth_tracker, skipped, found_inf);
  double s = scale.item<double>();
  int64_t t = growth_tracker.item<int64_t>(), k = skipped.item<int64_t>();
  math::update_loss_scale(s, t, k, found_inf.item<float>() != 0.0f, growth_factor, backoff_factor, growth_interval);
  if (scale.dtype() == DType::F32) *scale.data_ptr<float>() = static_cast<float>(s);
  else *scale.data_ptr<double>() = s;
  *growth_tracker.data_ptr<int64_t>() = t;
  *skipped.data_ptr<int64_t>() = k;
  bump_scale_versions(scale, growth_tracker, skipped);
}

}  // namespace

KILN_REGISTER_KERNEL(unscale_and_check_, CPU, unscale_and_check);
KILN_REGISTER_KERNEL(amp_update_scale_, CPU, amp_update_scale);

}  // namespace kiln::kernels::cpu
