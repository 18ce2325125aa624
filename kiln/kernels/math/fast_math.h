#pragma once
// Vectorizable float exp and erf for the CPU backend. glibc's expf/erff are scalar calls the
// compiler cannot vectorize, which made exp/GELU/softmax compute-bound (5-10x below memory
// bandwidth). These are branch-free (selects only) so `#pragma omp simd` loops vectorize them.
// On the device the CUDA intrinsics are already fast, so device code calls expf/erff directly.
#include <cmath>
#include <cstdint>

#include "kiln/core/half.h"
#include "kiln/core/macros.h"

namespace kiln::math {

// exp(x) for float, within 2 ulp over the normal range (Cephes' polynomial after a two-part
// Cody-Waite reduction by ln 2). Overflow gives inf, underflow 0, NaN stays NaN.
KILN_INLINE float fast_expf(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  float xc = x < -87.33654f ? -87.33654f : (x > 88.72283f ? 88.72283f : x);
  // Round to nearest by adding and subtracting 1.5 * 2^23 (std::floor would not vectorize
  // without -fno-trapping-math).
  const float kRound = 12582912.0f;
  float n = (xc * 1.44269504088896341f + kRound) - kRound;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t e = static_cast<int32_t>(n) + 127;
  float scale = __builtin_bit_cast(float, static_cast<uint32_t>(e) << 23);
  float y = p * scale;
  y = x > 88.72283f ? INFINITY : y;
  y = x < -103.97208f ? 0.0f : y;
  return x != x ? x : y;
#endif
}

// erf(x) for float by Abramowitz & Stegun 7.1.26: absolute error below 1.5e-7 everywhere,
// which is what the GELU's Phi(x) = (1 + erf) / 2 needs. (The erf *op* uses the exact erff.)
KILN_INLINE float fast_erff(float x) {
#if defined(__CUDA_ARCH__)
  return erff(x);
#else
  float a = x < 0 ? -x : x;
  float t = 1.0f / (1.0f + 0.3275911f * a);
  float poly = ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f) * t;
  float y = 1.0f - poly * fast_expf(-a * a);
  y = x < 0 ? -y : y;
  return x != x ? x : y;
#endif
}

// Generic spellings the functors use: fast float paths, exact for double.
KILN_INLINE float exp_(float x) { return fast_expf(x); }
KILN_INLINE double exp_(double x) {
#if defined(__CUDA_ARCH__)
  return ::exp(x);
#else
  return std::exp(x);
#endif
}
KILN_INLINE float gelu_erf_(float x) { return fast_erff(x); }
KILN_INLINE double gelu_erf_(double x) {
#if defined(__CUDA_ARCH__)
  return ::erf(x);
#else
  return std::erf(x);
#endif
}

}  // namespace kiln::math
