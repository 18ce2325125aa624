// CPU 2-D pooling: max (with argmax indices for backward), average (count_include_pad or not)
// and adaptive average, forward and backward. Every operand is read and written through its own
// strides, so NCHW, channels-last and other views need no copy. Work is split over the N*C
// planes (one plane per task), so backward scatters never race; each window's bounds are clipped
// once, so the inner loops have no bounds tests.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kiln/core/error.h"
#include "kiln/kernels/cpu/max_pool_2x2.h"
#include "kiln/kernels/conv.h"
#include "kiln/kernels/memory_format.h"
#include "kiln/kernels/pool.h"

namespace kiln::kernels::cpu {

namespace {

using pool2x2::Identity;
using pool2x2::max_2x2_row_pair;
using pool2x2::take_max;

// Strided [N, C, H, W] access to one operand.
template <class T> struct View4 {
  T* p;
  int64_t sn, sc, sh, sw;
  View4(const Tensor& t)  // NOLINT
      : p(static_cast<T*>(t.data_ptr())), sn(t.stride(0)), sc(t.stride(1)), sh(t.stride(2)), sw(t.stride(3)) {}
  T* plane(int64_t n, int64_t c) const { return p + n * sn + c * sc; }
};

template <class F> void for_planes(const PoolGeometry& g, int64_t work_per_plane, F&& f) {
  const int64_t planes = g.N * g.C;
  const bool par = planes > 1 && planes * work_per_plane >= 32768;
#pragma omp parallel for schedule(static) if (par)
  for (int64_t p = 0; p < planes; ++p) f(p / g.C, p % g.C);
}

// The in-bounds part [s, e) of window o along one axis: start o * stride - pad, length k, input n.
inline void clip_window(int64_t o, int64_t stride, int64_t pad, int64_t k, int64_t n, int64_t& s, int64_t& e) {
  const int64_t start = o * stride - pad;
  s = std::max<int64_t>(start, 0);
  e = std::min(start + k, n);
}

// Adaptive windows: window i covers [floor(i * in / out), ceil((i + 1) * in / out)).
inline int64_t ad_start(int64_t i, int64_t in, int64_t out) { return (i * in) / out; }
inline int64_t ad_end(int64_t i, int64_t in, int64_t out) { return ((i + 1) * in + out - 1) / out; }

// Window o's in-bounds part [s, e) along an axis of `in` inputs and `out` outputs: adaptive, or
// clipped from start o * stride - pad and length k.
template <bool kAdaptive>
inline void window_bounds(int64_t o, int64_t stride, int64_t pad, int64_t k, int64_t in, int64_t out, int64_t& s,
                          int64_t& e) {
  if constexpr (kAdaptive) {
    s = ad_start(o, in, out);
    e = ad_end(o, in, out);
  } else {
    clip_window(o, stride, pad, k, in, s, e);
  }
}

// Calls f(oh, ow, hs, he, ws, we) for every output position of a plane in row order, with its
// window's in-bounds rows [hs, he) and columns [ws, we) (the adaptive windows when kAdaptive).
template <bool kAdaptive, class F> inline void for_windows(const PoolGeometry& g, F&& f) {
  for (int64_t oh = 0; oh < g.OH; ++oh) {
    int64_t hs, he;
    window_bounds<kAdaptive>(oh, g.sh, g.ph, g.kh, g.H, g.OH, hs, he);
    for (int64_t ow = 0; ow < g.OW; ++ow) {
      int64_t ws, we;
      window_bounds<kAdaptive>(ow, g.sw, g.pw, g.kw, g.W, g.OW, ws, we);
      f(oh, ow, hs, he, ws, we);
    }
  }
}

// Sum of a plane over rows [hs, he) and columns [ws, we).
template <class T>
inline T window_sum(const T* p, int64_t sh, int64_t sw, int64_t hs, int64_t he, int64_t ws, int64_t we) {
  T s = 0;
  for (int64_t h = hs; h < he; ++h)
    for (int64_t w = ws; w < we; ++w) s += p[h * sh + w * sw];
  return s;
}

// Adds v to a plane over rows [hs, he) and columns [ws, we).
template <class T>
inline void window_add(T* p, int64_t sh, int64_t sw, int64_t hs, int64_t he, int64_t ws, int64_t we, T v) {
  for (int64_t h = hs; h < he; ++h)
    for (int64_t w = ws; w < we; ++w) p[h * sh + w * sw] += v;
}

template <class T> void max_fwd(const Tensor& out, const Tensor& idx, const Tensor& x, const PoolGeometry& g) {
  View4<const T> X(x);
  View4<T> O(out);
  View4<int32_t> I(idx);
  if (X.sc == 1 && O.sc == 1 && I.sc == 1 && g.C > 1) {
    // Channels-last: for each output pixel, run the window with the channels as the contiguous,
    // vectorised inner loop.
    const int64_t rows = g.N * g.OH;
#pragma omp parallel for schedule(static) if (rows > 1 && g.N * g.C * g.OH * g.OW * g.kh * g.kw >= 32768)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t n = r / g.OH, oh = r % g.OH;
      int64_t hs, he;
      clip_window(oh, g.sh, g.ph, g.kh, g.H, hs, he);
      for (int64_t ow = 0; ow < g.OW; ++ow) {
        int64_t ws, we;
        clip_window(ow, g.sw, g.pw, g.kw, g.W, ws, we);
        T* op = O.plane(n, 0) + oh * O.sh + ow * O.sw;
        int32_t* ip = I.plane(n, 0) + oh * I.sh + ow * I.sw;
        const int32_t first = static_cast<int32_t>(hs * g.W + ws);
#pragma omp simd
        for (int64_t c = 0; c < g.C; ++c) {
          op[c] = -std::numeric_limits<T>::infinity();
          ip[c] = first;
        }
        for (int64_t h = hs; h < he; ++h)
          for (int64_t w = ws; w < we; ++w) {
            const T* xp = X.plane(n, 0) + h * X.sh + w * X.sw;
            const int32_t i = static_cast<int32_t>(h * g.W + w);
#pragma omp simd
            for (int64_t c = 0; c < g.C; ++c) take_max(xp[c], i, op[c], ip[c]);
          }
      }
    }
    return;
  }
  const bool two_by_two = g.kh == 2 && g.kw == 2 && g.sh == 2 && g.sw == 2 && g.ph == 0 && g.pw == 0;
  for_planes(g, g.OH * g.OW * g.kh * g.kw, [&](int64_t n, int64_t c) {
    const T* xp = X.plane(n, c);
    T* op = O.plane(n, c);
    int32_t* ip = I.plane(n, c);
    if (two_by_two && X.sw == 1 && O.sw == 1 && I.sw == 1) {  // unit-stride rows
      for (int64_t oh = 0; oh < g.OH; ++oh)
        max_2x2_row_pair(xp + 2 * oh * X.sh, xp + (2 * oh + 1) * X.sh, op + oh * O.sh, ip + oh * I.sh, g.OW,
                         static_cast<int32_t>(2 * oh * g.W), static_cast<int32_t>(g.W), Identity{});
      return;
    }
    if (two_by_two) {  // strided rows, unrolled: windows never clip
      for (int64_t oh = 0; oh < g.OH; ++oh) {
        const T* r0 = xp + 2 * oh * X.sh;
        const T* r1 = r0 + X.sh;
        const int32_t base = static_cast<int32_t>(2 * oh * g.W);
        const int32_t Wi = static_cast<int32_t>(g.W);
        for (int64_t ow = 0; ow < g.OW; ++ow) {
          const int64_t a = 2 * ow * X.sw, b = a + X.sw;
          const int32_t i0 = base + static_cast<int32_t>(2 * ow);
          T best = r0[a];
          int32_t bi = i0;
          take_max(r0[b], i0 + 1, best, bi);
          take_max(r1[a], i0 + Wi, best, bi);
          take_max(r1[b], i0 + Wi + 1, best, bi);
          op[oh * O.sh + ow * O.sw] = best;
          ip[oh * I.sh + ow * I.sw] = bi;
        }
      }
      return;
    }
    for_windows<false>(g, [&](int64_t oh, int64_t ow, int64_t hs, int64_t he, int64_t ws, int64_t we) {
      T best = -std::numeric_limits<T>::infinity();
      int32_t bi = static_cast<int32_t>(hs * g.W + ws);
      for (int64_t h = hs; h < he; ++h)
        for (int64_t w = ws; w < we; ++w)
          take_max(xp[h * X.sh + w * X.sw], static_cast<int32_t>(h * g.W + w), best, bi);
      op[oh * O.sh + ow * O.sw] = best;
      ip[oh * I.sh + ow * I.sw] = bi;
    });
  });
}

// Zeroes one plane of a strided gradient.
template <class T> void zero_plane(T* p, const View4<T>& V, int64_t H, int64_t W) {
  for (int64_t h = 0; h < H; ++h)
    for (int64_t w = 0; w < W; ++w) p[h * V.sh + w * V.sw] = T(0);
}

template <class T> void max_bwd(const Tensor& gx, const Tensor& gy, const Tensor& idx, const PoolGeometry& g) {
  View4<T> GX(gx);
  View4<const T> GY(gy);
  View4<const int32_t> I(idx);
  // The flat index h * W + w maps to the offset index * sw whenever rows are W elements apart.
  const bool flat = GX.sh == g.W * GX.sw;
  // Windows that tile the input (stride == kernel, no padding): every input element lies in at
  // most one window, so each is written exactly once -- the gradient where it was the argmax,
  // else 0 -- with no zero-fill pass and no scatter; elements past the last window are zeroed.
  const bool tiling = g.sh == g.kh && g.sw == g.kw && g.ph == 0 && g.pw == 0;
  if (tiling && GX.sc == 1 && GY.sc == 1 && I.sc == 1 && g.C > 1) {
#pragma omp parallel for schedule(static) if (g.N > 1 && g.N * g.C * g.H * g.W >= 32768)
    for (int64_t n = 0; n < g.N; ++n) {
      T* gxn = GX.plane(n, 0);
      for (int64_t h = 0; h < g.H; ++h) {
        const int64_t oh = h / g.kh;
        for (int64_t w = 0; w < g.W; ++w) {
          T* d = gxn + h * GX.sh + w * GX.sw;
          const int64_t ow = w / g.kw;
          if (oh >= g.OH || ow >= g.OW) {
            std::fill(d, d + g.C, T(0));
            continue;
          }
          const T* gyp = GY.plane(n, 0) + oh * GY.sh + ow * GY.sw;
          const int32_t* ip = I.plane(n, 0) + oh * I.sh + ow * I.sw;
          const int32_t here = static_cast<int32_t>(h * g.W + w);
#pragma omp simd
          for (int64_t c = 0; c < g.C; ++c) d[c] = ip[c] == here ? gyp[c] : T(0);
        }
      }
    }
    return;
  }
  if (GX.sw == 1 && GX.sh == g.W && GY.sw == 1 && I.sw == 1) {
    // Unit-stride NCHW planes: one memset and a scatter with no index arithmetic.
    for_planes(g, g.H * g.W + g.OH * g.OW, [&](int64_t n, int64_t c) {
      T* gxp = GX.plane(n, c);
      const T* gyp = GY.plane(n, c);
      const int32_t* ip = I.plane(n, c);
      std::memset(gxp, 0, static_cast<size_t>(g.H * g.W) * sizeof(T));
      for (int64_t oh = 0; oh < g.OH; ++oh) {
        const T* gyr = gyp + oh * GY.sh;
        const int32_t* ir = ip + oh * I.sh;
        for (int64_t ow = 0; ow < g.OW; ++ow) gxp[ir[ow]] += gyr[ow];
      }
    });
    return;
  }
  if (GX.sc == 1 && GY.sc == 1 && I.sc == 1 && flat && g.C > 1) {
    // Channels-last: per sample, zero it, then scatter with the channels as the inner loop.
#pragma omp parallel for schedule(static) if (g.N > 1 && g.N * g.C * (g.H * g.W + g.OH * g.OW) >= 32768)
    for (int64_t n = 0; n < g.N; ++n) {
      T* gxn = GX.plane(n, 0);
      for (int64_t hw = 0; hw < g.H * g.W; ++hw) std::fill(gxn + hw * GX.sw, gxn + hw * GX.sw + g.C, T(0));
      for (int64_t oh = 0; oh < g.OH; ++oh)
        for (int64_t ow = 0; ow < g.OW; ++ow) {
          const T* gyp = GY.plane(n, 0) + oh * GY.sh + ow * GY.sw;
          const int32_t* ip = I.plane(n, 0) + oh * I.sh + ow * I.sw;
          for (int64_t c = 0; c < g.C; ++c) gxn[ip[c] * GX.sw + c] += gyp[c];
        }
    }
    return;
  }
  for_planes(g, g.H * g.W + g.OH * g.OW, [&](int64_t n, int64_t c) {
    T* gxp = GX.plane(n, c);
    const T* gyp = GY.plane(n, c);
    const int32_t* ip = I.plane(n, c);
    zero_plane(gxp, GX, g.H, g.W);
    for (int64_t oh = 0; oh < g.OH; ++oh)
      for (int64_t ow = 0; ow < g.OW; ++ow) {
        const int64_t i = ip[oh * I.sh + ow * I.sw];
        const int64_t off = flat ? i * GX.sw : (i / g.W) * GX.sh + (i % g.W) * GX.sw;
        gxp[off] += gyp[oh * GY.sh + ow * GY.sw];
      }
  });
}

// Divisor of window (oh, ow): kh*kw with count_include_pad (windows never reach past the
// padding), else the number of in-bounds elements.
inline int64_t avg_divisor(int64_t hs, int64_t he, int64_t ws, int64_t we, const PoolGeometry& g, bool include_pad) {
  return include_pad ? g.kh * g.kw : (he - hs) * (we - ws);
}

template <class T> void avg_fwd(const Tensor& out, const Tensor& x, const PoolGeometry& g, bool include_pad) {
  View4<const T> X(x);
  View4<T> O(out);
  for_planes(g, g.OH * g.OW * g.kh * g.kw, [&](int64_t n, int64_t c) {
    const T* xp = X.plane(n, c);
    T* op = O.plane(n, c);
    for_windows<false>(g, [&](int64_t oh, int64_t ow, int64_t hs, int64_t he, int64_t ws, int64_t we) {
      const T s = window_sum(xp, X.sh, X.sw, hs, he, ws, we);
      const int64_t d = avg_divisor(hs, he, ws, we, g, include_pad);
      op[oh * O.sh + ow * O.sw] = d > 0 ? s / T(d) : T(0);
    });
  });
}

template <class T> void avg_bwd(const Tensor& gx, const Tensor& gy, const PoolGeometry& g, bool include_pad) {
  View4<T> GX(gx);
  View4<const T> GY(gy);
  for_planes(g, g.H * g.W + g.OH * g.OW * g.kh * g.kw, [&](int64_t n, int64_t c) {
    T* gxp = GX.plane(n, c);
    const T* gyp = GY.plane(n, c);
    zero_plane(gxp, GX, g.H, g.W);
    for_windows<false>(g, [&](int64_t oh, int64_t ow, int64_t hs, int64_t he, int64_t ws, int64_t we) {
      const int64_t d = avg_divisor(hs, he, ws, we, g, include_pad);
      if (d > 0) window_add(gxp, GX.sh, GX.sw, hs, he, ws, we, gyp[oh * GY.sh + ow * GY.sw] / T(d));
    });
  });
}

template <class T> void adaptive_fwd(const Tensor& out, const Tensor& x, const PoolGeometry& g) {
  View4<const T> X(x);
  View4<T> O(out);
  for_planes(g, g.H * g.W + g.OH * g.OW, [&](int64_t n, int64_t c) {
    const T* xp = X.plane(n, c);
    T* op = O.plane(n, c);
    for_windows<true>(g, [&](int64_t oh, int64_t ow, int64_t hs, int64_t he, int64_t ws, int64_t we) {
      op[oh * O.sh + ow * O.sw] = window_sum(xp, X.sh, X.sw, hs, he, ws, we) / T((he - hs) * (we - ws));
    });
  });
}

template <class T> void adaptive_bwd(const Tensor& gx, const Tensor& gy, const PoolGeometry& g) {
  View4<T> GX(gx);
  View4<const T> GY(gy);
  for_planes(g, 2 * g.H * g.W + g.OH * g.OW, [&](int64_t n, int64_t c) {
    T* gxp = GX.plane(n, c);
    const T* gyp = GY.plane(n, c);
    zero_plane(gxp, GX, g.H, g.W);
    for_windows<true>(g, [&](int64_t oh, int64_t ow, int64_t hs, int64_t he, int64_t ws, int64_t we) {
      window_add(gxp, GX.sh, GX.sw, hs, he, ws, we, gyp[oh * GY.sh + ow * GY.sw] / T((he - hs) * (we - ws)));
    });
  });
}

void check4(const char* op, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) KILN_CHECK(t->dim() == 4, op, ": expected 4-D operands, got sizes ", t->sizes());
}

}  // namespace

#define KILN_POOL_DISPATCH(op, dt, ...)                                            \
  switch (dt) {                                                                    \
    case DType::F32: {                                                             \
      using T = float;                                                             \
      __VA_ARGS__;                                                                 \
    } break;                                                                       \
    case DType::F64: {                                                             \
      using T = double;                                                            \
      __VA_ARGS__;                                                                 \
    } break;                                                                       \
    default: KILN_FAIL(op, ": dtype ", dt, " is not supported by the CPU kernel"); \
  }

void max_pool2d_forward(const Tensor& out, const Tensor& indices, const Tensor& x, const PoolGeometry& g) {
  check4("max_pool2d", {&out, &indices, &x});
  KILN_CHECK(indices.dtype() == DType::I32, "max_pool2d: indices must be int32");
  KILN_CHECK(g.H * g.W <= std::numeric_limits<int32_t>::max(),
             "max_pool2d: planes larger than 2^31 elements are not supported");
  if (out.numel() == 0) return;
  KILN_POOL_DISPATCH("max_pool2d", x.dtype(), max_fwd<T>(out, indices, x, g));
}
KILN_REGISTER_KERNEL(kernels::max_pool2d_forward, CPU, max_pool2d_forward);

void max_pool2d_backward(const Tensor& grad_x, const Tensor& grad_out, const Tensor& indices, const PoolGeometry& g) {
  check4("max_pool2d_backward", {&grad_x, &grad_out, &indices});
  if (grad_x.numel() == 0) return;
  KILN_POOL_DISPATCH("max_pool2d_backward", grad_x.dtype(), max_bwd<T>(grad_x, grad_out, indices, g));
}
KILN_REGISTER_KERNEL(kernels::max_pool2d_backward, CPU, max_pool2d_backward);

void avg_pool2d_forward(const Tensor& out, const Tensor& x, const PoolGeometry& g, bool count_include_pad) {
  check4("avg_pool2d", {&out, &x});
  if (out.numel() == 0) return;
  KILN_POOL_DISPATCH("avg_pool2d", x.dtype(), avg_fwd<T>(out, x, g, count_include_pad));
}
KILN_REGISTER_KERNEL(kernels::avg_pool2d_forward, CPU, avg_pool2d_forward);

void avg_pool2d_backward(const Tensor& grad_x, const Tensor& grad_out, const PoolGeometry& g, bool count_include_pad) {
  check4("avg_pool2d_backward", {&grad_x, &grad_out});
  if (grad_x.numel() == 0) return;
  KILN_POOL_DISPATCH("avg_pool2d_backward", grad_x.dtype(), avg_bwd<T>(grad_x, grad_out, g, count_include_pad));
}
KILN_REGISTER_KERNEL(kernels::avg_pool2d_backward, CPU, avg_pool2d_backward);

void adaptive_avg_pool2d_forward(const Tensor& out, const Tensor& x, const PoolGeometry& g) {
  check4("adaptive_avg_pool2d", {&out, &x});
  if (out.numel() == 0) return;
  KILN_POOL_DISPATCH("adaptive_avg_pool2d", x.dtype(), adaptive_fwd<T>(out, x, g));
}
KILN_REGISTER_KERNEL(kernels::adaptive_avg_pool2d_forward, CPU, adaptive_avg_pool2d_forward);

void adaptive_avg_pool2d_backward(const Tensor& grad_x, const Tensor& grad_out, const PoolGeometry& g) {
  check4("adaptive_avg_pool2d_backward", {&grad_x, &grad_out});
  if (grad_x.numel() == 0) return;
  KILN_POOL_DISPATCH("adaptive_avg_pool2d_backward", grad_x.dtype(), adaptive_bwd<T>(grad_x, grad_out, g));
}
KILN_REGISTER_KERNEL(kernels::adaptive_avg_pool2d_backward, CPU, adaptive_avg_pool2d_backward);

#undef KILN_POOL_DISPATCH

}  // namespace kiln::kernels::cpu
