#pragma once
// The Philox dropout mask. CPU: kernels/cpu/dropout.cpp; CUDA: kernels/cuda/dropout.cu.
#include <cstdint>

#include "kiln/core/tensor.h"
#include "kiln/kernels/dispatch.h"

namespace kiln::kernels {

// out[i] = u_i >= p ? in[i] / (1 - p) : 0 with u_i = philox::dropout_uniform(seed, offset, i)
// (word i % 4 of block offset + i / 4), i the element's index in row-major order. in, out contiguous, 0 <= p < 1.
inline Kernel<void(const Tensor& out, const Tensor& in, double p, uint64_t seed, uint64_t offset)> dropout{"dropout"};

}  // namespace kiln::kernels
