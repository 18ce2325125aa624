#pragma once
// The 2x2, stride-2 max-pool row kernel shared by max_pool2d (kiln/kernels/cpu/pool.cpp) and the
// fused batch_norm_relu_max_pool2d (bn_relu_pool.cpp). Internal to the CPU backend.
//
// Each window is scanned in row order (r0[2ow], r0[2ow+1], r1[2ow], r1[2ow+1]) with take_max's
// rule -- strict ">" keeps the first of equal maxima, a NaN is always taken -- so the winner and
// its index are PyTorch's. The values are first passed through a per-element transform: the
// identity for max_pool2d, y = max(0, x * a + b) for the fused BatchNorm + ReLU.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace kiln::kernels::cpu::pool2x2 {

// Branch-free "take v if it beats best". Random data would mispredict a branch half the time.
template <class T> inline void take_max(T v, int32_t i, T& best, int32_t& bi) {
  const bool take = (v > best) | (v != v);
  best = take ? v : best;
  bi = take ? i : bi;
}

struct Identity {
  template <class T> T operator()(T v) const { return v; }
#if defined(__AVX512F__)
  __m512 operator()(__m512 v) const { return v; }
#endif
#if defined(__AVX2__)
  __m256 operator()(__m256 v) const { return v; }
#endif
};

// y = relu(x * a + b), always as one fused multiply-add, so that the scalar and vector paths
// (and a backward that recomputes the ReLU mask from x) agree bit for bit. A NaN stays NaN, as
// in kiln::relu (math::Relu).
template <class O> struct AffineRelu {
  O a, b;
  template <class T> O pre(T v) const { return std::fma(static_cast<O>(v), a, b); }
  template <class T> O operator()(T v) const {
    const O p = pre(v);
    return p <= O(0) ? O(0) : p;
  }
#if defined(__AVX512F__)
  __m512 operator()(__m512 v) const {  // keep p where !(p <= 0): positives and NaN
    const __m512 p = _mm512_fmadd_ps(v, _mm512_set1_ps(static_cast<float>(a)), _mm512_set1_ps(static_cast<float>(b)));
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(p, _mm512_setzero_ps(), _CMP_NLE_UQ), p);
  }
#endif
#if defined(__AVX2__)
  __m256 operator()(__m256 v) const {
    const __m256 p = _mm256_fmadd_ps(v, _mm256_set1_ps(static_cast<float>(a)), _mm256_set1_ps(static_cast<float>(b)));
    return _mm256_and_ps(_mm256_cmp_ps(p, _mm256_setzero_ps(), _CMP_NLE_UQ), p);
  }
#endif
};

#if defined(__AVX2__) && !defined(__AVX512F__)
// max_2x2_row_pair's 8-outputs-per-step body at AVX2 (same contract, see below): even and odd
// columns split with in-lane shuffles and a cross-lane permute, masks as vectors, the window
// codes assembled from the compare bits with pdep.
template <class F>
inline int64_t max_2x2_rows_avx2(const float* r0, const float* r1, float* out, int32_t* idx, int64_t OW, int32_t base,
                                 int32_t W, F f, float* raw, uint8_t* code) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i even = _mm256_slli_epi32(lane, 1);
  auto mask_of = [&](int64_t k) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::clamp<int64_t>(k, 0, 8))), lane);
  };
  auto beats = [](__m256 v, __m256 best) {  // take_max's rule
    return _mm256_or_ps(_mm256_cmp_ps(v, best, _CMP_GT_OQ), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  };
  // columns 0, 2, .., 14 and 1, 3, .., 15 of the 16 floats lo:hi
  auto split = [](__m256 lo, __m256 hi, __m256& ev, __m256& od) {
    ev = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0x88)), 0xD8));
    od = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0xDD)), 0xD8));
  };
  for (int64_t ow = 0; ow < OW; ow += 8) {
    const int64_t n = std::min<int64_t>(OW - ow, 8);
    const __m256i m_out = mask_of(n), m_lo = mask_of(2 * n), m_hi = mask_of(2 * n - 8);
    const float* p0 = r0 + 2 * ow;
    const float* p1 = r1 + 2 * ow;
    __m256 ra0, rb0, ra1, rb1;
    split(_mm256_maskload_ps(p0, m_lo), _mm256_maskload_ps(p0 + 8, m_hi), ra0, rb0);
    split(_mm256_maskload_ps(p1, m_lo), _mm256_maskload_ps(p1 + 8, m_hi), ra1, rb1);
    const __m256 a0 = f(ra0), b0 = f(rb0), a1 = f(ra1), b1 = f(rb1);
    const __m256 t0 = beats(b0, a0), t1 = beats(b1, a1);
    const __m256 m0 = _mm256_blendv_ps(a0, b0, t0), m1 = _mm256_blendv_ps(a1, b1, t1);
    const __m256 t = beats(m1, m0);
    const __m256 best = _mm256_blendv_ps(m0, m1, t);
    _mm256_maskstore_ps(out + ow, m_out, best);
    if (idx) {
      const __m256i i = _mm256_add_epi32(_mm256_set1_epi32(base + 2 * static_cast<int32_t>(ow)), even);
      const __m256i j0 = _mm256_sub_epi32(i, _mm256_castps_si256(t0));  // + 1 where the odd column won
      const __m256i j1 = _mm256_add_epi32(_mm256_sub_epi32(i, _mm256_castps_si256(t1)), _mm256_set1_epi32(W));
      _mm256_maskstore_epi32(
          idx + ow, m_out, _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(j0), _mm256_castsi256_ps(j1), t)));
    }
    if (code) {
      const unsigned tb = static_cast<unsigned>(_mm256_movemask_ps(t));
      const unsigned col =
          (tb & static_cast<unsigned>(_mm256_movemask_ps(t1))) | (~tb & static_cast<unsigned>(_mm256_movemask_ps(t0)));
      const unsigned on =
          static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(best, _mm256_setzero_ps(), _CMP_NLE_UQ)));
      const uint64_t bytes = _pdep_u64(col, 0x0101010101010101ull) | _pdep_u64(tb, 0x0202020202020202ull) |
                             _pdep_u64(on, 0x0404040404040404ull);
      for (int64_t l = 0; l < n; ++l) code[ow + l] = static_cast<uint8_t>(bytes >> (8 * l));
    }
    if (raw) {
      const __m256 x0 = _mm256_blendv_ps(ra0, rb0, t0), x1 = _mm256_blendv_ps(ra1, rb1, t1);
      _mm256_maskstore_ps(raw + ow, m_out, _mm256_blendv_ps(x0, x1, t));
    }
  }
  return OW;
}
#endif

// One output row: out[ow] = max of f() over window ow and idx[ow] its flat index, for ow < OW;
// r0, r1 are unit-stride input rows, base the flat index of r0[0], W the plane's width. raw, when
// not null, receives the untransformed input at the argmax. code, when not null, receives a byte
// per window instead of (or besides) idx, which may then be null: bit 0 the argmax's column in
// the window, bit 1 its row, bit 2 !(out <= 0), the ReLU's gradient mask, on for a NaN as in
// PyTorch's relu backward (the fused conv block's backward reads only that).
template <class T, class Out, class F>
inline void max_2x2_row_pair(const T* r0, const T* r1, Out* out, int32_t* idx, int64_t OW, int32_t base, int32_t W, F f,
                             T* raw = nullptr, uint8_t* code = nullptr) {
  int64_t ow = 0;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float> && std::is_same_v<Out, float>) {
    // 16 outputs per step: a two-register permute splits each row into its even and odd
    // columns, each row's pair is reduced, then the rows are compared. Masked loads and stores
    // handle the tail. ~6x the scalar loop (bench_conv's max_pool2d rows).
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i even = _mm512_slli_epi32(lane, 1);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    const __m512i one = _mm512_set1_epi32(1);
    auto beats = [](__m512 v, __m512 best) {  // take_max's rule
      return static_cast<__mmask16>(_mm512_cmp_ps_mask(v, best, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q));
    };
    auto mask_of = [](int64_t k) { return static_cast<__mmask16>(k >= 16 ? 0xFFFF : k <= 0 ? 0 : (1u << k) - 1); };
    for (; ow < OW; ow += 16) {
      const int64_t n = std::min<int64_t>(OW - ow, 16);
      const __mmask16 m_out = mask_of(n), m_lo = mask_of(2 * n), m_hi = mask_of(2 * n - 16);
      const float* p0 = r0 + 2 * ow;
      const float* p1 = r1 + 2 * ow;
      const __m512 lo0 = _mm512_maskz_loadu_ps(m_lo, p0), hi0 = _mm512_maskz_loadu_ps(m_hi, p0 + 16);
      const __m512 lo1 = _mm512_maskz_loadu_ps(m_lo, p1), hi1 = _mm512_maskz_loadu_ps(m_hi, p1 + 16);
      const __m512 ra0 = _mm512_permutex2var_ps(lo0, even, hi0);
      const __m512 rb0 = _mm512_permutex2var_ps(lo0, odd, hi0);
      const __m512 ra1 = _mm512_permutex2var_ps(lo1, even, hi1);
      const __m512 rb1 = _mm512_permutex2var_ps(lo1, odd, hi1);
      const __m512 a0 = f(ra0), b0 = f(rb0), a1 = f(ra1), b1 = f(rb1);
      const __mmask16 t0 = beats(b0, a0), t1 = beats(b1, a1);
      const __m512 m0 = _mm512_mask_blend_ps(t0, a0, b0), m1 = _mm512_mask_blend_ps(t1, a1, b1);
      const __m512i i = _mm512_add_epi32(_mm512_set1_epi32(base + 2 * static_cast<int32_t>(ow)), even);
      const __m512i j0 = _mm512_mask_add_epi32(i, t0, i, one);
      const __m512i j1 = _mm512_add_epi32(_mm512_mask_add_epi32(i, t1, i, one), _mm512_set1_epi32(W));
      const __mmask16 t = beats(m1, m0);
      const __m512 best = _mm512_mask_blend_ps(t, m0, m1);
      _mm512_mask_storeu_ps(out + ow, m_out, best);
      if (idx) _mm512_mask_storeu_epi32(idx + ow, m_out, _mm512_mask_blend_epi32(t, j0, j1));
      if (code) {
        const __mmask16 col = static_cast<__mmask16>((t & t1) | (~t & t0));
        const __mmask16 on = _mm512_cmp_ps_mask(best, _mm512_setzero_ps(), _CMP_NLE_UQ);
        const __m512i c =
            _mm512_or_si512(_mm512_or_si512(_mm512_maskz_set1_epi32(col, 1), _mm512_maskz_set1_epi32(t, 2)),
                            _mm512_maskz_set1_epi32(on, 4));
        _mm512_mask_cvtepi32_storeu_epi8(code + ow, m_out, c);
      }
      if (raw) {
        const __m512 x0 = _mm512_mask_blend_ps(t0, ra0, rb0), x1 = _mm512_mask_blend_ps(t1, ra1, rb1);
        _mm512_mask_storeu_ps(raw + ow, m_out, _mm512_mask_blend_ps(t, x0, x1));
      }
    }
    return;
  }
#elif defined(__AVX2__)
  if constexpr (std::is_same_v<T, float> && std::is_same_v<Out, float>) {
    max_2x2_rows_avx2(r0, r1, out, idx, OW, base, W, f, raw, code);
    return;
  }
#endif
  for (; ow < OW; ++ow) {
    const int32_t i = base + static_cast<int32_t>(2 * ow);
    auto best = f(r0[2 * ow]);
    int32_t bi = i;
    take_max(f(r0[2 * ow + 1]), i + 1, best, bi);
    take_max(f(r1[2 * ow]), i + W, best, bi);
    take_max(f(r1[2 * ow + 1]), i + W + 1, best, bi);
    out[ow] = static_cast<Out>(best);
    if (idx) idx[ow] = bi;
    if (code) {
      const int32_t j = bi - i, row = j >= W ? 1 : 0;
      code[ow] = static_cast<uint8_t>((j - row * W) | (row << 1) | (out[ow] <= Out(0) ? 0 : 4));
    }
    if (raw) {
      const int32_t j = bi - i;  // 0, 1 (row 0) or W, W + 1 (row 1)
      raw[ow] = j < 2 ? r0[2 * ow + j] : r1[2 * ow + j - W];
    }
  }
}

}  // namespace kiln::kernels::cpu::pool2x2
