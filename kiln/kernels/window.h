#pragma once
// The output size of a sliding window (convolutions, pooling), shared by every geometry that
// kernels take (ConvGeometry, PoolGeometry).
#include <cstdint>

namespace kiln::kernels {

// Windows of k taps, `dilation` apart, at every `stride`-th start over an input of `in` with `pad`
// on both sides, rounded down as PyTorch does: (in + 2 pad - dilation (k - 1) - 1) / stride + 1.
inline int64_t window_out_size(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dilation = 1) {
  return (in + 2 * pad - dilation * (k - 1) - 1) / stride + 1;
}

}  // namespace kiln::kernels
