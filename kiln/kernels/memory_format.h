#pragma once
// Layout queries for 4-D image tensors, shared by the convolution and pooling ops and kernels.
#include "kiln/core/memory_format.h"
#include "kiln/core/tensor.h"

namespace kiln::kernels {

// ChannelsLast when t's memory is NHWC (exact NHWC strides, or NHWC once the strides of size-1
// dimensions are ignored, unless the exact NCHW strides also hold), Contiguous otherwise: a
// tensor in neither layout is copied to NCHW by the ops.
MemoryFormat memory_format(const Tensor& t);
// True when t's memory can be read as `fmt` (strides of size-1 dimensions ignored).
bool has_layout(const Tensor& t, MemoryFormat fmt);
// An uninitialised [N, C, H, W] tensor laid out in `fmt`.
Tensor empty_4d(const IntList& sizes, const TensorOptions& opts, MemoryFormat fmt);

}  // namespace kiln::kernels
