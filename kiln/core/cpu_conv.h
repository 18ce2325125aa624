#pragma once
// CPU convolution settings: the layout autotuner of the CPU conv kernels, the CPU's counterpart
// of kiln::cudnn::set_benchmark (kiln/cuda/cudnn.h) with its own switch and its own cache.
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

// Winograd convolution for f32 NCHW 3x3 stride-1 convolutions of 16+ channels (forward, input
// and weight gradients; on by default): F(4x4, 3x3), 4x fewer multiplications, where its
// products dominate (64+ channels, planes it tiles well), F(2x2, 3x3), 2.25x fewer, elsewhere.
// Rounding errors: F(2x2, 3x3)'s up to about twice the direct kernel's, F(4x4, 3x3)'s 5-35x
// (about 1e-5 of the result's scale; docs/kernels.md, "Winograd convolution", measures them).
// Off: every convolution runs the direct im2col kernel, as PyTorch's CPU convolutions do. f64
// never uses it. The environment variable KILN_CPU_CONV_WINOGRAD=0 turns it off from the start
// (for A/B runs of whole programs).
void set_cpu_conv_winograd(bool enabled);
bool cpu_conv_winograd();

// The Winograd output tile: 0 (the default: each convolution takes the tile with fewer
// products for its plane), 2 (F(2x2, 3x3) everywhere) or 4 (F(4x4, 3x3) everywhere); anything
// else raises kiln::Error. KILN_CPU_CONV_WINOGRAD_TILE=2 or 4 sets it from the start.
void set_cpu_conv_winograd_tile(int m);
int cpu_conv_winograd_tile();

}  // namespace kiln
