#pragma once
// How a 4-D image tensor [N, C, H, W] is laid out in memory: NCHW (`Contiguous`) or NHWC
// (`ChannelsLast`, strides [H*W*C, 1, W*C, C]). Modules convert with `to(MemoryFormat)`; the
// convolution and pooling kernels take either.
#include <cstdint>

namespace kiln {

enum class MemoryFormat : uint8_t { Contiguous, ChannelsLast };

}  // namespace kiln
