// Dropout on the CPU: out[i] = u_i >= p ? in[i] / (1 - p) : 0, where u_i is the Philox uniform of
// element i (philox::dropout_uniform(seed, offset, i): word i % 4 of block offset + i / 4) - the
// same bits the CUDA kernels draw, so masks agree across backends and thread counts. The backward of dropout is this
// kernel applied to the gradient with the same (seed, offset): the mask is regenerated, not stored. The decisions come
// from dropout_keep (kernels/cpu/dropout_keep.h), defined here.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/core/philox.h"
#include "kiln/kernels/cpu/dropout_keep.h"
#include "kiln/kernels/dropout.h"
#include "kiln/kernels/activation.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace kiln::kernels::cpu {

namespace {

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
// 16 lanes of 32-bit words: what the Philox rounds below need of the vector unit.
struct Lanes {
  using V = __m512i;
  static constexpr int N = 16;
  static V set1(uint32_t x) { return _mm512_set1_epi32(static_cast<int>(x)); }
  static V iota() { return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); }
  static V add(V a, V b) { return _mm512_add_epi32(a, b); }
  static V xor3(V a, V b, V c) { return _mm512_xor_si512(_mm512_xor_si512(a, b), c); }
  // hi + 1 in the lanes where lo (= start + lane) wrapped below start
  static V carry(V hi, V lo, V start) {
    return _mm512_mask_add_epi32(hi, _mm512_cmplt_epu32_mask(lo, start), hi, set1(1));
  }
  // lo, hi = the low and high words of a * b per lane: two 32 x 32 -> 64-bit products (even
  // and odd lanes), blended
  static void mulhilo(V a, V b, V& lo, V& hi) {
    const V even = _mm512_mul_epu32(a, b);
    const V odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), _mm512_srli_epi64(b, 32));
    lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
    hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
  }
  // bit l = (v_l >> 8) * 2^-24 >= p (philox::to_unit_float, exact in f32)
  static uint64_t keep_bits(V v, __m512 p) {
    const __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(v, 8)), _mm512_set1_ps(1.0f / 16777216.0f));
    return _mm512_cmp_ps_mask(u, p, _CMP_GE_OQ);
  }
  // keep[j] = bit j of bits, j < 64
  static void store_bytes(uint64_t bits, uint8_t* keep) { _mm512_storeu_si512(keep, _mm512_maskz_set1_epi8(bits, 1)); }
  using P = __m512;
  static P set1_ps(float p) { return _mm512_set1_ps(p); }
};
#define KILN_DROPOUT_KEEP_LANES 1
#elif defined(__AVX2__)
// 8 lanes: the same operations with AVX2's instructions (no unsigned compare: flip the sign
// bits; no byte masks: spread bits to bytes with pdep).
struct Lanes {
  using V = __m256i;
  static constexpr int N = 8;
  static V set1(uint32_t x) { return _mm256_set1_epi32(static_cast<int>(x)); }
  static V iota() { return _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7); }
  static V add(V a, V b) { return _mm256_add_epi32(a, b); }
  static V xor3(V a, V b, V c) { return _mm256_xor_si256(_mm256_xor_si256(a, b), c); }
  static V carry(V hi, V lo, V start) {
    const V sign = set1(0x80000000u);
    const V wrapped = _mm256_cmpgt_epi32(_mm256_xor_si256(start, sign), _mm256_xor_si256(lo, sign));  // -1 or 0
    return _mm256_sub_epi32(hi, wrapped);
  }
  static void mulhilo(V a, V b, V& lo, V& hi) {
    const V even = _mm256_mul_epu32(a, b);
    const V odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), _mm256_srli_epi64(b, 32));
    lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
    hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
  }
  static uint64_t keep_bits(V v, __m256 p) {
    const __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v, 8)), _mm256_set1_ps(1.0f / 16777216.0f));
    return static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(u, p, _CMP_GE_OQ)));
  }
  static void store_bytes(uint64_t bits, uint8_t* keep) {  // j < 32
    for (int q = 0; q < 4; ++q) {
      const uint64_t bytes = _pdep_u64((bits >> (8 * q)) & 0xff, 0x0101010101010101ull);
      std::memcpy(keep + 8 * q, &bytes, 8);
    }
  }
  using P = __m256;
  static P set1_ps(float p) { return _mm256_set1_ps(p); }
};
#define KILN_DROPOUT_KEEP_LANES 1
#else
#define KILN_DROPOUT_KEEP_LANES 0
#endif

}  // namespace

// Element i0 + j's keep decision from word (i0 + j) % 4 of block offset + (i0 + j) / 4, one block
// for every four elements: scalar up to an element that starts a block, then 4 * Lanes::N
// elements at a time (a block per lane, the four words' decisions interleaved with pdep), then a
// scalar tail.
void dropout_keep(uint64_t seed, uint64_t offset, float p, uint64_t i0, int64_t n, uint8_t* keep) {
  int64_t j = 0;
  auto scalar_until = [&](int64_t end) {  // a block per run of up to four elements
    while (j < end) {
      const uint64_t i = i0 + static_cast<uint64_t>(j);
      const philox::U32x4 b = philox::block(seed, offset + i / 4);
      for (uint64_t w = i % 4; w < 4 && j < end; ++w, ++j) keep[j] = philox::to_unit_float(b.v[w]) >= p;
    }
  };
#if KILN_DROPOUT_KEEP_LANES
  constexpr int64_t kSpan = 4 * Lanes::N;
  scalar_until(std::min<int64_t>(n, static_cast<int64_t>((4 - i0 % 4) % 4)));
  const Lanes::V m0 = Lanes::set1(0xD2511F53u), m1 = Lanes::set1(0xCD9E8D57u);
  const Lanes::P pv = Lanes::set1_ps(p);
  for (; j + kSpan <= n; j += kSpan) {
    // the counters offset + (i0 + j) / 4 + l as (c0, c1) = (low, high) words, carrying where the low wraps
    const uint64_t start = offset + (i0 + static_cast<uint64_t>(j)) / 4;
    const Lanes::V lo_start = Lanes::set1(static_cast<uint32_t>(start));
    Lanes::V c0 = Lanes::add(lo_start, Lanes::iota());
    Lanes::V c1 = Lanes::carry(Lanes::set1(static_cast<uint32_t>(start >> 32)), c0, lo_start);
    Lanes::V c2 = Lanes::set1(0), c3 = Lanes::set1(0);
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    for (int round = 0; round < 10; ++round) {
      Lanes::V lo0, hi0, lo1, hi1;
      Lanes::mulhilo(m0, c0, lo0, hi0);
      Lanes::mulhilo(m1, c2, lo1, hi1);
      c0 = Lanes::xor3(hi1, c1, Lanes::set1(k0));
      c1 = lo1;
      c2 = Lanes::xor3(hi0, c3, Lanes::set1(k1));
      c3 = lo0;
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    // element 4 l + w is word w of lane l: bit l of word w's decisions goes to bit 4 l + w
    const Lanes::V words[4] = {c0, c1, c2, c3};
    uint64_t bits = 0;
    for (int w = 0; w < 4; ++w) bits |= _pdep_u64(Lanes::keep_bits(words[w], pv), 0x1111111111111111ull << w);
    Lanes::store_bytes(bits, keep + j);
  }
#endif
  scalar_until(n);
}
KILN_REGISTER_KERNEL(dropout_keep_in_use, CPU, dropout_keep);

void dropout(const Tensor& out, const Tensor& in, double p, uint64_t seed, uint64_t offset) {
  KILN_CHECK(out.is_contiguous() && in.is_contiguous() && out.dtype() == in.dtype() && out.numel() == in.numel(),
             "dropout: kernel expects contiguous operands of one dtype and size, got sizes ", in.sizes(), " and ",
             out.sizes());
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
