#pragma once
// A ConvGeometry (kiln/kernels/conv.h) from a few numbers, for the tests that call the convolution
// kernels directly: tests/nn (the conv block kernels), tests/core (Winograd) and tests/cuda
// (test_cuda has no repository root on its include path: it includes this header by its place).
#include <cstdint>

#include "kiln/kernels/conv.h"

namespace kiln_test {

// A stride-1, undilated NCHW convolution of x [N, C, H, W] by a [K, C / groups, kh, kw] weight with
// zero padding (ph, pw): the output [N, K, OH, OW] has OH = H + 2 ph - kh + 1, OW = W + 2 pw - kw + 1.
inline kiln::kernels::ConvGeometry conv_geometry(const kiln::IntList& x, int64_t K, const kiln::IntList& kernel,
                                                 const kiln::IntList& padding, int64_t groups = 1) {
  kiln::kernels::ConvGeometry g;
  g.N = x[0], g.C = x[1], g.H = x[2], g.W = x[3];
  g.K = K;
  g.kh = kernel[0], g.kw = kernel[1];
  g.ph = padding[0], g.pw = padding[1];
  g.groups = groups;
  g.set_output_size();
  return g;
}

}  // namespace kiln_test
