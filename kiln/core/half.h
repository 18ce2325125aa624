#pragma once
// 16-bit floating point storage types. Arithmetic is always done in float (the "opmath" type);
// these structs only store the bits and convert, in code that compiles for host and device. On the
// GPU the conversions are the hardware's cvt instructions (one each; the bit manipulation below
// is ~15 instructions with branches, a real share of a memory-bound f16 kernel); both round to
// nearest even, so every finite value and infinity converts to the same bits on either side. A NaN
// stays a NaN (its payload bits may differ: the GPU writes its canonical NaN).
#include <cstdint>
#include <cstring>

#include "kiln/core/macros.h"

namespace kiln {

namespace detail {
KILN_INLINE uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
KILN_INLINE float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

#if defined(__CUDA_ARCH__)
// The GPU's conversion instructions (round to nearest even), one each.
__device__ __forceinline__ uint16_t cvt_f16(float f) {
  uint16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
__device__ __forceinline__ float cvt_f32(uint16_t h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
#if __CUDA_ARCH__ >= 800
__device__ __forceinline__ uint16_t cvt_bf16(float f) {
  uint16_t h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
#endif
#endif
}  // namespace detail

// IEEE 754 binary16. Conversion rounds to nearest even and handles subnormals, inf and NaN.
struct Half {
  uint16_t bits = 0;
  Half() = default;
  KILN_INLINE Half(float f) : bits(from_float(f)) {}
  KILN_INLINE operator float() const { return to_float(bits); }

  static KILN_INLINE Half from_bits(uint16_t b) {
    Half h;
    h.bits = b;
    return h;
  }

  static KILN_INLINE uint16_t from_float(float f) {
#if defined(__CUDA_ARCH__)
    return detail::cvt_f16(f);
#else
    uint32_t x = detail::float_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u) {  // inf or NaN
      return static_cast<uint16_t>(sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u));
    }
    if (x >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow to inf
    if (x < 0x38800000u) {                                               // subnormal half (or zero): |f| < 2^-14
      if (x < 0x33000000u) return static_cast<uint16_t>(sign);           // below half of smallest subnormal
      uint32_t mant = (x & 0x007fffffu) | 0x00800000u;
      int shift = 126 - static_cast<int>(x >> 23);  // value / 2^-24 = mant * 2^(exp-126); shift in [14, 24]
      uint32_t half_mant = mant >> (shift);
      uint32_t rem = mant & ((1u << shift) - 1u);
      uint32_t halfway = 1u << (shift - 1);
      if (rem > halfway || (rem == halfway && (half_mant & 1u))) ++half_mant;
      return static_cast<uint16_t>(sign | half_mant);
    }
    // normal: rebias exponent 127 -> 15, round mantissa 23 -> 10 bits to nearest even
    uint32_t r = x - 0x38000000u;
    uint32_t lsb = (r >> 13) & 1u;
    r += 0x0fffu + lsb;
    return static_cast<uint16_t>(sign | (r >> 13));
#endif
  }

  static KILN_INLINE float to_float(uint16_t h) {
#if defined(__CUDA_ARCH__)
    return detail::cvt_f32(h);
#else
    uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t out;
    if (exp == 0x1fu) {
      out = sign | 0x7f800000u | (mant << 13);
    } else if (exp == 0) {
      if (mant == 0) {
        out = sign;
      } else {  // subnormal: normalise
        int e = -1;
        do {
          ++e;
          mant <<= 1;
        } while ((mant & 0x400u) == 0);
        out = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
      }
    } else {
      out = sign | ((exp + 112u) << 23) | (mant << 13);
    }
    return detail::bits_float(out);
#endif
  }
};

// bfloat16: the top 16 bits of a float, rounded to nearest even; NaN stays NaN.
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  KILN_INLINE BFloat16(float f) : bits(from_float(f)) {}
  KILN_INLINE operator float() const { return detail::bits_float(static_cast<uint32_t>(bits) << 16); }

  static KILN_INLINE BFloat16 from_bits(uint16_t b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }

  static KILN_INLINE uint16_t from_float(float f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    return detail::cvt_bf16(f);
#else
    uint32_t x = detail::float_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
    uint32_t lsb = (x >> 16) & 1u;
    x += 0x7fffu + lsb;
    return static_cast<uint16_t>(x >> 16);
#endif
  }
};

}  // namespace kiln
