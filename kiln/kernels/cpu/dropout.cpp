// Dropout on the CPU: out[i] = u_i >= p ? in[i] / (1 - p) : 0, where u_i is the Philox uniform of
// element i (philox::uniform_f(seed, offset, i)) - the same bits a CUDA thread for element i will
// draw, so masks agree across backends and thread counts. The backward of dropout is this kernel
// applied to the gradient with the same (seed, offset): the mask is regenerated, not stored.
// The decisions come from dropout_keep (kernels/cpu/dropout_keep.h), defined here.
#include <algorithm>
#include <cstdint>

#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/core/philox.h"
#include "kiln/kernels/cpu/dropout_keep.h"
#include "kiln/kernels/dropout.h"
#include "kiln/kernels/activation.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define KILN_DROPOUT_KEEP_AVX512 1
#else
#define KILN_DROPOUT_KEEP_AVX512 0
#endif

namespace kiln::kernels::cpu {

#if KILN_DROPOUT_KEEP_AVX512
namespace {
// lo, hi = the low and high words of a * b per 32-bit lane.
inline void mulhilo(__m512i a, __m512i b, __m512i& lo, __m512i& hi) {
  const __m512i even = _mm512_mul_epu32(a, b);
  const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), _mm512_srli_epi64(b, 32));
  lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
  hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
}
}  // namespace
#endif

void dropout_keep(uint64_t seed, uint64_t offset, float p, uint64_t i0, int64_t n, uint8_t* keep) {
  int64_t j = 0;
#if KILN_DROPOUT_KEEP_AVX512
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i m0 = _mm512_set1_epi32(static_cast<int>(0xD2511F53u));
  const __m512i m1 = _mm512_set1_epi32(static_cast<int>(0xCD9E8D57u));
  const __m512 pv = _mm512_set1_ps(p), unit = _mm512_set1_ps(1.0f / 16777216.0f);
  for (; j + 16 <= n; j += 16) {
    // the counters offset + i0 + j + l as (c0, c1) = (low, high) words, carrying where the low wraps
    const uint64_t start = offset + i0 + static_cast<uint64_t>(j);
    const __m512i lo_start = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(start)));
    __m512i c0 = _mm512_add_epi32(lo_start, iota);
    const __mmask16 wrapped = _mm512_cmplt_epu32_mask(c0, lo_start);
    const __m512i hi_start = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(start >> 32)));
    __m512i c1 = _mm512_mask_add_epi32(hi_start, wrapped, hi_start, _mm512_set1_epi32(1));
    __m512i c2 = _mm512_setzero_si512(), c3 = _mm512_setzero_si512();
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    for (int round = 0; round < 10; ++round) {  // philox::block, lane by lane
      __m512i lo0, hi0, lo1, hi1;
      mulhilo(m0, c0, lo0, hi0);
      mulhilo(m1, c2, lo1, hi1);
      c0 = _mm512_xor_si512(_mm512_xor_si512(hi1, c1), _mm512_set1_epi32(static_cast<int>(k0)));
      c1 = lo1;
      c2 = _mm512_xor_si512(_mm512_xor_si512(hi0, c3), _mm512_set1_epi32(static_cast<int>(k1)));
      c3 = lo0;
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    // philox::to_unit_float: (v >> 8) * 2^-24, exact in f32
    const __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(c0, 8)), unit);
    const __mmask16 kept = _mm512_cmp_ps_mask(u, pv, _CMP_GE_OQ);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(keep + j), _mm_maskz_set1_epi8(kept, 1));
  }
#endif
  for (; j < n; ++j) keep[j] = philox::uniform_f(seed, offset, i0 + static_cast<uint64_t>(j)) >= p;
}

void dropout(const Tensor& out, const Tensor& in, double p, uint64_t seed, uint64_t offset) {
  KILN_CHECK(out.is_contiguous() && in.is_contiguous() && out.dtype() == in.dtype() &&
                 out.numel() == in.numel(),
             "dropout: kernel expects contiguous operands of one dtype and size, got sizes ",
             in.sizes(), " and ", out.sizes());
  KILN_CHECK(p >= 0.0 && p < 1.0, "dropout: kernel expects 0 <= p < 1, got ", p);
  const int64_t n = in.numel();
  const float pf = static_cast<float>(p);
  dispatch_floating(in.dtype(), "dropout", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using O = opmath_t<T>;
    const O scale = static_cast<O>(1.0 / (1.0 - p));
    const T* ip = static_cast<const T*>(in.data_ptr());
    T* op = static_cast<T*>(out.data_ptr());
    const int64_t spans = (n + kDropoutKeepSpan - 1) / kDropoutKeepSpan;
#pragma omp parallel for schedule(static) if (n >= 8192)
    for (int64_t s = 0; s < spans; ++s) {
      const int64_t i0 = s * kDropoutKeepSpan, m = std::min(kDropoutKeepSpan, n - i0);
      uint8_t keep[kDropoutKeepSpan];
      dropout_keep(seed, offset, pf, static_cast<uint64_t>(i0), m, keep);
#pragma omp simd
      for (int64_t j = 0; j < m; ++j) op[i0 + j] = static_cast<T>(keep[j] ? static_cast<O>(ip[i0 + j]) * scale : O(0));
    }
  });
}
KILN_REGISTER_KERNEL(kernels::dropout, CPU, dropout);

}  // namespace kiln::kernels::cpu
