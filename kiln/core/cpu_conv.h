#pragma once
// CPU convolution settings: the layout autotuner of the CPU conv kernels, the CPU's counterpart
// of kiln::cudnn::set_benchmark (kiln/core/cudnn.h) with its own switch and its own cache.
//
//   kiln::set_cpu_conv_autotune(true);
//
// Off (the default): each convolution runs the kernel of its tensors' layout (NCHW im2col or
// channels-last im2row). On: the first call of each (direction, geometry, dtype, layout, thread
// count) also times the other layout's kernel on converted copies, conversions included, and the
// faster choice is cached for the rest of the process; worth it when the shapes repeat, as in a
// training loop with a fixed batch size. While it is on, conv2d does not take a following
// BatchNorm's statistics in its epilogue (that path is NCHW-only and would bypass the tuner).
#include <cstddef>

namespace kiln {

void set_cpu_conv_autotune(bool enabled);
bool cpu_conv_autotune();
// Forgets every layout choice (the next convolution of each shape is timed again).
void clear_cpu_conv_autotune_cache();
size_t cpu_conv_autotune_cache_size();  // number of cached choices

}  // namespace kiln
