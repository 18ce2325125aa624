#pragma once
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11).
// Counter-based: the numbers for element i depend only on (seed, offset + i), so the CPU loop and
// a CUDA thread per element produce bit-identical streams.
#include <cmath>
#include <cstdint>

#include "kiln/core/macros.h"

namespace kiln::philox {

#if defined(__CUDACC__)
using ::cos;
using ::log;
using ::sqrt;
#else
using std::cos;
using std::log;
using std::sqrt;
#endif

struct U32x4 {
  uint32_t v[4];
};

KILN_INLINE uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t* hi) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  return static_cast<uint32_t>(p);
}

// One block of four 32-bit words for the 128-bit counter (ctr_lo, ctr_hi) and a 64-bit key.
KILN_INLINE U32x4 block(uint64_t key, uint64_t ctr_lo, uint64_t ctr_hi = 0) {
  uint32_t c0 = static_cast<uint32_t>(ctr_lo), c1 = static_cast<uint32_t>(ctr_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(ctr_hi), c3 = static_cast<uint32_t>(ctr_hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, hi1;
    uint32_t lo0 = mulhilo(0xD2511F53u, c0, &hi0);
    uint32_t lo1 = mulhilo(0xCD9E8D57u, c2, &hi1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return U32x4{{c0, c1, c2, c3}};
}

// Uniform float in [0, 1) from the top 24 bits of a word.
KILN_INLINE float to_unit_float(uint32_t x) { return static_cast<float>(x >> 8) * (1.0f / 16777216.0f); }
// Uniform double in [0, 1) from 53 bits of two words.
KILN_INLINE double to_unit_double(uint32_t a, uint32_t b) {
  uint64_t x = (static_cast<uint64_t>(a) << 21) ^ (b >> 11);
  return static_cast<double>(x & ((1ull << 53) - 1)) * (1.0 / 9007199254740992.0);
}

// The element-index -> counter mapping every backend uses: element i of a draw that starts at
// `offset` reads block (offset + i) and uses its words as needed. One block per element wastes
// bits but keeps the mapping trivial and identical everywhere.
KILN_INLINE U32x4 element_block(uint64_t seed, uint64_t offset, uint64_t i) { return block(seed, offset + i, 0); }

// Uniform in [0, 1): float precision, computed from word 0.
KILN_INLINE float uniform_f(uint64_t seed, uint64_t offset, uint64_t i) {
  return to_unit_float(element_block(seed, offset, i).v[0]);
}
KILN_INLINE double uniform_d(uint64_t seed, uint64_t offset, uint64_t i) {
  U32x4 b = element_block(seed, offset, i);
  return to_unit_double(b.v[0], b.v[1]);
}
// Word w (0..3) of a block, by selects: a dynamic index would put the block in local memory on
// the GPU.
KILN_INLINE uint32_t word(const U32x4& b, uint64_t w) {
  return w == 0 ? b.v[0] : w == 1 ? b.v[1] : w == 2 ? b.v[2] : b.v[3];
}

// Dropout's draws (dropout, bias_dropout_add, attention's probabilities): four consecutive
// elements share a block, element i taking word i % 4 of block (offset + i / 4), so a mask costs a
// quarter of the rounds of one block per element. Every backend draws through this mapping, so
// masks stay bit-identical across the CPU, the GPU and thread counts.
KILN_INLINE float dropout_uniform(uint64_t seed, uint64_t offset, uint64_t i) {
  return to_unit_float(word(block(seed, offset + i / 4), i % 4));
}

// Standard normal by Box-Muller on words 2 and 3 (u1 in (0, 1] so log is finite).
KILN_INLINE double normal_d(uint64_t seed, uint64_t offset, uint64_t i) {
  U32x4 b = element_block(seed, offset, i);
  double u1 = 1.0 - to_unit_double(b.v[0], b.v[1]);
  double u2 = to_unit_double(b.v[2], b.v[3]);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

}  // namespace kiln::philox
