#pragma once
// Index arithmetic of the strided pointwise kernels (launch.cuh), host and device alike so that
// the CPU tests run exactly the code a GPU thread runs (tests/core/test_cuda_index_math.cpp).
//
// A strided kernel turns each linear element index into one byte offset per operand: a div and a
// mod per dimension. 64-bit `/` and `%` are software loops of ~40 instructions on a GPU, and they
// made the broadcast and strided cases a fraction of the copy bandwidth. Here the iteration space
// is checked to fit 32-bit offsets, and each division by a dimension's size is a multiply-high,
// an add and a shift with a magic number computed once on the host (Granlund and Montgomery,
// "Division by invariant integers using multiplication", PLDI 1994; docs/kernels.md).
#include <cstdint>
#include <limits>

#include "kiln/core/macros.h"
#include "kiln/kernels/pointwise_iter.h"

// `#pragma unroll` in nvcc's device pass; nothing for host compilers, which would warn.
#if defined(__CUDA_ARCH__)
#define KILN_INDEX_UNROLL _Pragma("unroll")
#else
#define KILN_INDEX_UNROLL
#endif

namespace kiln::kernels::cuda {

// Division of 32-bit numerators n < 2^31 by a fixed divisor d >= 1:
// q = (mulhi(n, magic) + n) >> shift with shift = ceil(log2 d) and
// magic = floor(2^32 (2^shift - d) / d) + 1. For n < 2^31 the sum stays below 2^32.
struct FastDivmod {
  uint32_t divisor = 1;
  uint32_t magic = 1;
  uint32_t shift = 0;

  FastDivmod() = default;
  explicit FastDivmod(uint32_t d) : divisor(d) {
    while ((uint64_t{1} << shift) < d) ++shift;
    magic = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }

  KILN_INLINE uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(n, magic);
#else
    const uint32_t hi = static_cast<uint32_t>((static_cast<uint64_t>(n) * magic) >> 32);
#endif
    return (hi + n) >> shift;
  }
  // q = n / d and r = n % d
  KILN_INLINE void divmod(uint32_t n, uint32_t& q, uint32_t& r) const {
    q = div(n);
    r = n - q * divisor;
  }
};

// Whether every index and byte offset of the iteration space fits the 32-bit kernels: fewer than
// 2^31 elements, no negative strides, and each operand's last byte below 2^31.
inline bool fits_32bit_indexing(const PointwiseIter& it) {
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (it.numel > kMax) return false;
  for (int k = 0; k < it.noperands; ++k) {
    int64_t last = it.elem_size[k];
    for (int d = 0; d < it.ndim; ++d) {
      if (it.strides[k][d] < 0 || it.strides[k][d] > kMax) return false;
      last += (it.sizes[d] - 1) * it.strides[k][d];  // < 2^31 * 2^31: no int64 overflow
      if (last > kMax) return false;
    }
  }
  return true;
}

// Linear index -> byte offset of each of the N operands, innermost dimension first, with 32-bit
// arithmetic and FastDivmod. Built on the host from a PointwiseIter that fits_32bit_indexing.
template <int N> struct OffsetCalc32 {
  int ndim = 0;
  FastDivmod sizes[kMaxDims];
  uint32_t strides[kMaxDims][N] = {};

  OffsetCalc32() = default;
  explicit OffsetCalc32(const PointwiseIter& it) : ndim(it.ndim) {
    for (int d = 0; d < it.ndim; ++d) {
      const int src = it.ndim - 1 - d;  // PointwiseIter keeps the outermost dimension first
      sizes[d] = FastDivmod(static_cast<uint32_t>(it.sizes[src]));
      for (int k = 0; k < N; ++k) strides[d][k] = static_cast<uint32_t>(it.strides[k][src]);
    }
  }

  KILN_INLINE void get(uint32_t linear, uint32_t (&off)[N]) const {
    KILN_INDEX_UNROLL
    for (int k = 0; k < N; ++k) off[k] = 0;
    // Unrolled to the fixed bound so the sizes and strides stay in registers and constant memory.
    KILN_INDEX_UNROLL
    for (int d = 0; d < kMaxDims; ++d) {
      if (d == ndim) break;
      uint32_t q, r;
      sizes[d].divmod(linear, q, r);
      linear = q;
      KILN_INDEX_UNROLL
      for (int k = 0; k < N; ++k) off[k] += r * strides[d][k];
    }
  }
};

}  // namespace kiln::kernels::cuda
