#pragma once
// Per-element math of the fused pointwise kernels (kiln/kernels/fused.h), written once
// for the CPU loops (kernels/cpu/fused.cpp) and the CUDA kernels (kernels/cuda/fused.cu).
// The GELU math itself is the GeluErf / GeluTanh functors of pointwise.h (and their backward
// functors), so `bias_gelu` computes exactly what `gelu(x + bias)` computes, minus one pass.
// The dropout mask is the one of kiln/kernels/cpu/dropout.cpp: element i (row-major) is kept
// when philox::dropout_uniform(seed, offset, i) >= p.
#include <cstdint>

#include "kiln/core/macros.h"
#include "kiln/core/philox.h"
#include "kiln/kernels/math/pointwise.h"

namespace kiln::math {

// act(x + b): the forward of bias_gelu with Act = GeluErf or GeluTanh.
template <class Act> struct BiasAct {
  template <class T> KILN_INLINE T operator()(T x, T b) const { return Act{}(x + b); }
};

// g * act'(x + b): the backward of bias_gelu with ActBackward = GeluErfBackward or
// GeluTanhBackward (which take (g, pre-activation)).
template <class ActBackward> struct BiasActBackward {
  template <class T> KILN_INLINE T operator()(T g, T x, T b) const { return ActBackward{}(g, x + b); }
};

// The dropout mask shared by the forward and the backward of bias_dropout_add. Branch-free (so
// CPU loops vectorize the Philox rounds); p == 0 keeps everything (u >= 0 always), and the
// kernels skip drawing then; p >= 1 drops everything (u < 1), as dropout(p = 1) does.
struct DropoutMask {
  uint64_t seed = 0, offset = 0;
  float p = 0.0f;
  KILN_INLINE bool keep(uint64_t i) const { return philox::dropout_uniform(seed, offset, i) >= p; }
  // the decisions of elements 4 q .. 4 q + 3 from their one block
  KILN_INLINE void keep4(uint64_t q, bool (&k)[4]) const {
    const philox::U32x4 b = philox::block(seed, offset + q);
    for (int w = 0; w < 4; ++w) k[w] = philox::to_unit_float(b.v[w]) >= p;
  }
};

// residual + dropout(x + b) for one element with its keep decision drawn already (the kernels
// draw four elements per Philox block, the CPU 32 or 64 at a time), in opmath T. `scale` is
// 1 / (1 - p) (0 for p >= 1).
struct BiasDropoutAdd {
  DropoutMask mask;
  template <class T> static KILN_INLINE T apply(T x, T b, T residual, T scale, bool keep) {
    return keep ? residual + (x + b) * scale : residual;
  }
};

// d/dx of BiasDropoutAdd: g * scale where kept, else 0.
struct DropoutGrad {
  DropoutMask mask;
  template <class T> KILN_INLINE T operator()(T g, T scale, uint64_t i) const { return apply(g, scale, mask.keep(i)); }
  template <class T> static KILN_INLINE T apply(T g, T scale, bool keep) { return keep ? g * scale : T(0); }
};

}  // namespace kiln::math
