#pragma once
// Launch limits of the CUDA backend as plain host arithmetic (no CUDA headers), so that the CPU
// tests can check them.
#include <algorithm>
#include <cstdint>

namespace kiln::kernels::cuda {

// gridDim.y and gridDim.z are at most 65535 on every GPU (gridDim.x: 2^31 - 1).
constexpr int64_t kMaxGridYZ = 65535;

// Blocks along y (or z) for `n` rows: at most kMaxGridYZ, at least 1. A kernel launched with it
// strides over the rows (row += gridDim.y) when n is larger.
inline unsigned grid_yz(int64_t n) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(n, kMaxGridYZ)));
}

}  // namespace kiln::kernels::cuda
