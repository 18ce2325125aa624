#pragma once
// Dropout's keep decisions for a run of elements on the CPU: keep[j] = 1 when
// philox::dropout_uniform(seed, offset, i0 + j) >= p, bit for bit the scalar draw (and the CUDA
// kernels'), so masks agree across backends and thread counts. Four elements share a Philox block;
// sixteen (AVX-512) or eight (AVX2) blocks go through the ten rounds at once in 32-bit lanes, the
// 32 x 32 -> 64-bit products as two vpmuludq (even and odd lanes): the compiler's own
// vectorisation of the scalar code used 64-bit lanes and vpmullq, which made dropout's mask most
// of the cost of a fused bias + dropout + add.
#include <cstdint>

#include "kiln/kernels/dispatch.h"

namespace kiln::kernels::cpu {

// The run length the kernels draw at a time (a stack buffer of bytes).
constexpr int64_t kDropoutKeepSpan = 512;

// keep[j] (0 or 1) for j in [0, n). Defined in kernels/cpu/dropout.cpp, compiled once per CPU
// level (docs/kernels.md, "One binary, every x86-64").
void dropout_keep(uint64_t seed, uint64_t offset, float p, uint64_t i0, int64_t n, uint8_t* keep);

// Walks elements [i0, i0 + n) of a mask in spans of kDropoutKeepSpan: fn(j0, m, keep) gets the
// span's first index relative to i0, its length and its keep decisions.
template <class Fn>
inline void for_keep_spans(uint64_t seed, uint64_t offset, float p, int64_t i0, int64_t n, Fn&& fn) {
  uint8_t keep[kDropoutKeepSpan];
  for (int64_t j0 = 0; j0 < n; j0 += kDropoutKeepSpan) {
    const int64_t m = n - j0 < kDropoutKeepSpan ? n - j0 : kDropoutKeepSpan;
    dropout_keep(seed, offset, p, static_cast<uint64_t>(i0 + j0), m, keep);
    fn(j0, m, static_cast<const uint8_t*>(keep));
  }
}

// dropout_keep of the CPU level in use, for tests (call with .on(Device::cpu(), ...)); the
// kernels call their own copy above.
inline Kernel<void(uint64_t, uint64_t, float, uint64_t, int64_t, uint8_t*)> dropout_keep_in_use{"dropout_keep"};

}  // namespace kiln::kernels::cpu
