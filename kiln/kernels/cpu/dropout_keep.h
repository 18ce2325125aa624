#pragma once
// Dropout's keep decisions for a run of elements on the CPU: keep[j] = 1 when
// philox::uniform_f(seed, offset, i0 + j) >= p, bit for bit the scalar draw (and the CUDA
// kernels'), so masks agree across backends and thread counts. Sixteen (AVX-512) or eight (AVX2)
// counters go through Philox's ten rounds at once in 32-bit lanes, the 32 x 32 -> 64-bit
// products as two vpmuludq (even and odd lanes): the compiler's own vectorisation of the scalar
// code used 64-bit lanes and vpmullq, which made dropout's mask most of the cost of a fused
// bias + dropout + add.
#include <cstdint>

#include "kiln/kernels/dispatch.h"

namespace kiln::kernels::cpu {

// The run length the kernels draw at a time (a stack buffer of bytes).
constexpr int64_t kDropoutKeepSpan = 512;

// keep[j] (0 or 1) for j in [0, n). Defined in kernels/cpu/dropout.cpp, compiled once per CPU
// level (docs/kernels.md, "One binary, every x86-64").
void dropout_keep(uint64_t seed, uint64_t offset, float p, uint64_t i0, int64_t n, uint8_t* keep);

// dropout_keep of the CPU level in use, for tests (call with .on(Device::cpu(), ...)); the
// kernels call their own copy above.
inline Kernel<void(uint64_t, uint64_t, float, uint64_t, int64_t, uint8_t*)> dropout_keep_in_use{"dropout_keep"};

}  // namespace kiln::kernels::cpu
