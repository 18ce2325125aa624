#pragma once
// The vector operations of the Winograd transforms that run along a row of tiles
// (kernels/cpu/winograd.cpp): lane l of a vector is tile tx0 + l of the row. One trait per CPU
// level, the same names in each, so the transforms are written once: Lanes512 (16 tiles per
// vector, AVX-512) and Lanes256 (8 tiles, AVX2 + FMA). This header is only included by the
// level copies of winograd.cpp (docs/architecture.md, "CPU levels"); a build without AVX2 has
// neither trait and runs the generic per-tile transforms.
//
// Masks are always a prefix of the lanes (lanes 0 .. n - 1 with n clamped to [0, L]): the tiles
// of a row start at lane 0, and a row's last vector is cut at its end.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace kiln::kernels::cpu::winograd {

#if defined(__AVX512F__)
struct Lanes512 {
  using V = __m512;
  static constexpr int L = 16;

  static __mmask16 prefix(int64_t n) {
    const int64_t k = std::clamp<int64_t>(n, 0, L);
    return static_cast<__mmask16>((1u << k) - 1u);
  }
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V load_first(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(prefix(n), p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static void store_first(float* p, int64_t n, V v) { _mm512_mask_storeu_ps(p, prefix(n), v); }
  static float last(V v) { return _mm512_cvtss_f32(_mm512_permutexvar_ps(_mm512_set1_epi32(L - 1), v)); }

  // Whether one of the first n lanes of v is NaN.
  static bool any_nan(V v, int64_t n) { return _mm512_mask_cmp_ps_mask(prefix(n), v, v, _CMP_UNORD_Q) != 0; }

  // [prev[L - 1], v[0], ..., v[L - 2]]: the lanes moved up by one, the previous vector's last first.
  static V shift_in(V v, V prev) {
    return _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(v), _mm512_castps_si512(prev), 15));
  }

  // ph[j][l] = row[M l + j] for j < M and the L lanes: the M column phases of L M values.
  template <int M> static void deinterleave(const float* row, V (&ph)[M]) {
    static_assert(M == 2 || M == 4);
    if constexpr (M == 2) {
      const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
      const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
      const V a0 = load(row), a1 = load(row + 16);
      ph[0] = _mm512_permutex2var_ps(a0, even, a1);
      ph[1] = _mm512_permutex2var_ps(a0, odd, a1);
    } else {
      // phases j and j + 1 of tiles 0-7 (from the first 32 values) and of tiles 8-15, then their
      // 8-lane halves put together
      const __m512i p01 = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
      const __m512i p23 = _mm512_setr_epi32(2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31);
      const V a0 = load(row), a1 = load(row + 16), a2 = load(row + 32), a3 = load(row + 48);
      const V lo01 = _mm512_permutex2var_ps(a0, p01, a1), hi01 = _mm512_permutex2var_ps(a2, p01, a3);
      const V lo23 = _mm512_permutex2var_ps(a0, p23, a1), hi23 = _mm512_permutex2var_ps(a2, p23, a3);
      ph[0] = _mm512_shuffle_f32x4(lo01, hi01, _MM_SHUFFLE(1, 0, 1, 0));
      ph[1] = _mm512_shuffle_f32x4(lo01, hi01, _MM_SHUFFLE(3, 2, 3, 2));
      ph[2] = _mm512_shuffle_f32x4(lo23, hi23, _MM_SHUFFLE(1, 0, 1, 0));
      ph[3] = _mm512_shuffle_f32x4(lo23, hi23, _MM_SHUFFLE(3, 2, 3, 2));
    }
  }

  // The inverse: out[v] (L M values in all) with lane l of ph[j] at M l + j.
  template <int M> static void interleave(const V (&ph)[M], V (&out)[M]) {
    static_assert(M == 2 || M == 4);
    const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    if constexpr (M == 2) {
      out[0] = _mm512_permutex2var_ps(ph[0], lo, ph[1]);
      out[1] = _mm512_permutex2var_ps(ph[0], hi, ph[1]);
    } else {
      // pairs (ph0, ph1) and (ph2, ph3) of each tile, then the pairs interleaved as doubles
      const __m512d a_lo = _mm512_castps_pd(_mm512_permutex2var_ps(ph[0], lo, ph[1]));
      const __m512d a_hi = _mm512_castps_pd(_mm512_permutex2var_ps(ph[0], hi, ph[1]));
      const __m512d b_lo = _mm512_castps_pd(_mm512_permutex2var_ps(ph[2], lo, ph[3]));
      const __m512d b_hi = _mm512_castps_pd(_mm512_permutex2var_ps(ph[2], hi, ph[3]));
      const __m512i first = _mm512_setr_epi64(0, 8, 1, 9, 2, 10, 3, 11);
      const __m512i second = _mm512_setr_epi64(4, 12, 5, 13, 6, 14, 7, 15);
      out[0] = _mm512_castpd_ps(_mm512_permutex2var_pd(a_lo, first, b_lo));
      out[1] = _mm512_castpd_ps(_mm512_permutex2var_pd(a_lo, second, b_lo));
      out[2] = _mm512_castpd_ps(_mm512_permutex2var_pd(a_hi, first, b_hi));
      out[3] = _mm512_castpd_ps(_mm512_permutex2var_pd(a_hi, second, b_hi));
    }
  }
};
using RowLanes = Lanes512;
#define KILN_WINOGRAD_ROW_LANES 1

#elif defined(__AVX2__) && defined(__FMA__)
struct Lanes256 {
  using V = __m256;
  static constexpr int L = 8;

  // all-ones in lanes 0 .. n - 1 (maskload/maskstore read each lane's sign bit)
  static __m256i prefix(int64_t n) {
    const int k = static_cast<int>(std::clamp<int64_t>(n, 0, L));
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V load_first(const float* p, int64_t n) { return _mm256_maskload_ps(p, prefix(n)); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static void store_first(float* p, int64_t n, V v) { _mm256_maskstore_ps(p, prefix(n), v); }
  static float last(V v) { return _mm_cvtss_f32(_mm_permute_ps(_mm256_extractf128_ps(v, 1), _MM_SHUFFLE(3, 3, 3, 3))); }

  static bool any_nan(V v, int64_t n) {
    const int k = static_cast<int>(std::clamp<int64_t>(n, 0, L));
    return (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) & ((1 << k) - 1)) != 0;
  }

  static V shift_in(V v, V prev) {
    // [prev's high half, v's low half], then each 128-bit half shifted up by one lane from it
    const __m256i t = _mm256_castps_si256(_mm256_permute2f128_ps(prev, v, 0x21));
    return _mm256_castsi256_ps(_mm256_alignr_epi8(_mm256_castps_si256(v), t, 12));
  }

  template <int M> static void deinterleave(const float* row, V (&ph)[M]) {
    static_assert(M == 2 || M == 4);
    if constexpr (M == 2) {
      // even and odd values of each 128-bit half, then the halves' 64-bit pairs put in order
      const V a0 = load(row), a1 = load(row + 8);
      const V even = _mm256_shuffle_ps(a0, a1, _MM_SHUFFLE(2, 0, 2, 0));
      const V odd = _mm256_shuffle_ps(a0, a1, _MM_SHUFFLE(3, 1, 3, 1));
      ph[0] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(even), _MM_SHUFFLE(3, 1, 2, 0)));
      ph[1] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(odd), _MM_SHUFFLE(3, 1, 2, 0)));
    } else {
      // an 8 x 4 transpose: tiles l and l + 4 side by side in t[l], then a 4 x 4 transpose in
      // each 128-bit half
      const V a0 = load(row), a1 = load(row + 8), a2 = load(row + 16), a3 = load(row + 24);
      const V t0 = _mm256_permute2f128_ps(a0, a2, 0x20), t1 = _mm256_permute2f128_ps(a0, a2, 0x31);
      const V t2 = _mm256_permute2f128_ps(a1, a3, 0x20), t3 = _mm256_permute2f128_ps(a1, a3, 0x31);
      const V u0 = _mm256_unpacklo_ps(t0, t1), u1 = _mm256_unpackhi_ps(t0, t1);
      const V u2 = _mm256_unpacklo_ps(t2, t3), u3 = _mm256_unpackhi_ps(t2, t3);
      ph[0] = _mm256_shuffle_ps(u0, u2, _MM_SHUFFLE(1, 0, 1, 0));
      ph[1] = _mm256_shuffle_ps(u0, u2, _MM_SHUFFLE(3, 2, 3, 2));
      ph[2] = _mm256_shuffle_ps(u1, u3, _MM_SHUFFLE(1, 0, 1, 0));
      ph[3] = _mm256_shuffle_ps(u1, u3, _MM_SHUFFLE(3, 2, 3, 2));
    }
  }

  template <int M> static void interleave(const V (&ph)[M], V (&out)[M]) {
    static_assert(M == 2 || M == 4);
    if constexpr (M == 2) {
      const V lo = _mm256_unpacklo_ps(ph[0], ph[1]), hi = _mm256_unpackhi_ps(ph[0], ph[1]);
      out[0] = _mm256_permute2f128_ps(lo, hi, 0x20);
      out[1] = _mm256_permute2f128_ps(lo, hi, 0x31);
    } else {
      // the 4 x 4 transposes first (tiles l and l + 4 in t[l]), then the halves put in order
      const V u0 = _mm256_unpacklo_ps(ph[0], ph[1]), u1 = _mm256_unpackhi_ps(ph[0], ph[1]);
      const V u2 = _mm256_unpacklo_ps(ph[2], ph[3]), u3 = _mm256_unpackhi_ps(ph[2], ph[3]);
      const V t0 = _mm256_shuffle_ps(u0, u2, _MM_SHUFFLE(1, 0, 1, 0));
      const V t1 = _mm256_shuffle_ps(u0, u2, _MM_SHUFFLE(3, 2, 3, 2));
      const V t2 = _mm256_shuffle_ps(u1, u3, _MM_SHUFFLE(1, 0, 1, 0));
      const V t3 = _mm256_shuffle_ps(u1, u3, _MM_SHUFFLE(3, 2, 3, 2));
      out[0] = _mm256_permute2f128_ps(t0, t1, 0x20);
      out[1] = _mm256_permute2f128_ps(t2, t3, 0x20);
      out[2] = _mm256_permute2f128_ps(t0, t1, 0x31);
      out[3] = _mm256_permute2f128_ps(t2, t3, 0x31);
    }
  }
};
using RowLanes = Lanes256;
#define KILN_WINOGRAD_ROW_LANES 1
#endif

}  // namespace kiln::kernels::cpu::winograd
