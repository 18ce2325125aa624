#pragma once
// Winograd F(2x2, 3x3) and F(4x4, 3x3) for the CPU's NCHW 3x3 stride-1 convolutions: the
// forward, the input gradient and the weight gradient (both the forward's transforms, adjoint;
// or, for samples too large for one chunk, the input gradient as a 3x3 stride-1 convolution of
// the output gradient with the weight flipped and transposed). Each 2x2 block of outputs costs
// 16 products per channel pair instead of 36 (2.25x fewer FLOPs in the GEMMs), each 4x4 block
// 36 instead of 144 (4x fewer); docs/kernels.md ("Winograd convolution") has the transforms, the
// blocking and the accuracy measured against the direct kernel.
#include <cstdint>
#include <functional>

#include "kiln/core/dtype.h"
#include "kiln/kernels/conv.h"
#include "kiln/kernels/dispatch.h"

namespace kiln::kernels::cpu {

// Whether the geometry is one the Winograd kernels compute: NCHW, 3x3, stride 1, dilation 1, one
// group, padding at most 2 on each side (so the input gradient is a padded convolution too).
bool winograd_geometry(const ConvGeometry& g);

// Whether conv2d's CPU kernels use Winograd for this convolution: a Winograd geometry, f32, the
// switch on (kiln::set_cpu_conv_winograd), and enough channels for the transforms to pay.
bool winograd_applies(const ConvGeometry& g, DType dt);

// The output tile side the kernels use for g: 2 or 4. kiln::set_cpu_conv_winograd_tile forces
// one; by default F(4x4, 3x3) where the products dominate the transforms (64+ channels in and
// out), it makes at most 0.6x F(2x2, 3x3)'s products (its tiles pad a plane more) and a sample
// has more than one tile; F(2x2, 3x3) elsewhere.
int winograd_tile(const ConvGeometry& g);

// Each returns false, having written part of the output (and maybe called samples_done for some
// samples: the caller's fallback must redo its work for all of them), when an operand holds an
// Inf or NaN, or a transform or a result overflows: the transforms would turn an Inf into NaNs
// (Inf - Inf) where the direct kernel gives +-Inf, so the caller computes such a convolution
// directly, and non-finite values propagate as they do there (and in PyTorch).

// out [N, K, OH, OW] = conv(x, w) + bias (bias may be null). samples_done(n0, n1), if set, is
// called once the output planes of samples [n0, n1) are final, on the thread that wrote them
// (while they are still in its cache), possibly concurrently for different samples.
template <class T>
bool winograd_forward(const T* x, const T* w, const T* bias, T* out, const ConvGeometry& g,
                      const std::function<void(int64_t n0, int64_t n1)>& samples_done = {});

// gx [N, C, H, W] = the input gradient of the convolution from gy [N, K, OH, OW] (overwritten).
template <class T> bool winograd_backward_input(const T* gy, const T* w, T* gx, const ConvGeometry& g);

// dw [K, C, 3, 3] = the weight gradient from x [N, C, H, W] and gy [N, K, OH, OW] (overwritten):
// the exact gradient of the Winograd forward, which is the convolution's up to rounding. The
// sum over the batch is taken in an order that does not depend on thread timing.
template <class T> bool winograd_backward_weight(const T* x, const T* gy, T* dw, const ConvGeometry& g);

// Both gradients at once, gx [N, C, H, W] and dw [K, C, 3, 3] (overwritten) from x, gy and w:
// the output gradient is transformed once for both. Also false, having written nothing, when a
// sample has more tiles than a chunk (the input gradient's adjoint needs whole samples): the
// caller then runs winograd_backward_input and winograd_backward_weight.
template <class T>
bool winograd_backward_both(const T* x, const T* gy, const T* w, T* gx, T* dw, const ConvGeometry& g);

// The backward of a convolution whose output gradient is made one sample at a time and never
// stored (the conv-block fusion, kiln/kernels/conv_block.h): make_dy(n, dy) writes sample n's
// [K, OH, OW] gradient, and may be called again for the same sample by a caller that falls back.
// gx [N, C, H, W] and dw [K, C, 3, 3] are overwritten; either may be null (not wanted).
template <class T>
bool winograd_backward_generated(const T* x, const T* w, T* gx, T* dw, const ConvGeometry& g,
                                 const std::function<void(int64_t n, void* dy)>& make_dy);

// The f32 entry points above as compiled for the CPU level in use (kiln/core/cpu_isa.h), for
// callers outside kiln/kernels/cpu such as tests and benchmarks: the functions above are each
// level's own copy, which the conv kernels call directly, so a test calling them by name would
// only ever run the baseline level's transforms. Call winograd_f32_in_use.on(Device::cpu()).
struct WinogradEntries {
  bool (*forward)(const float*, const float*, const float*, float*, const ConvGeometry&,
                  const std::function<void(int64_t, int64_t)>&);
  bool (*backward_input)(const float*, const float*, float*, const ConvGeometry&);
  bool (*backward_weight)(const float*, const float*, float*, const ConvGeometry&);
  bool (*backward_both)(const float*, const float*, const float*, float*, float*, const ConvGeometry&);
  bool (*backward_generated)(const float*, const float*, float*, float*, const ConvGeometry&,
                             const std::function<void(int64_t, void*)>&);
};
inline Kernel<WinogradEntries()> winograd_f32_in_use{"winograd"};

}  // namespace kiln::kernels::cpu
