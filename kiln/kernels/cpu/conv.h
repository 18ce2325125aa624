#pragma once
// CPU-only convolution entry points used by the CPU's fused blocks (not dispatched).
#include <cstdint>
#include <functional>

#include "kiln/kernels/conv.h"

namespace kiln::kernels::cpu {

// conv2d's weight gradient (grad_weight) and input gradient (grad_x) for an output gradient that
// is never stored: make_dy(n, dy) writes sample n's [K, OH, OW] gradient (x's dtype) into a
// per-thread buffer, which goes straight into both GEMMs while it is in cache. NCHW only;
// either output may be undefined; the weight gradient's per-thread sums are combined in thread
// order over a static split of the samples (reproducible for a fixed thread count).
void conv2d_backward_generated(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& x,
                               const Tensor& weight, const ConvGeometry& g,
                               const std::function<void(int64_t n, void* dy)>& make_dy);

}  // namespace kiln::kernels::cpu
