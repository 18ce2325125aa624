#pragma once
// Per-element math of the CUDA pooling kernels (pool.cu), as KILN_INLINE (__host__ __device__)
// functions so the CPU tests can run exactly this code element by element against the CPU
// kernels (tests/nn/test_pool_math.cpp); the CUDA kernels only add the launch.
//
// Forward: one output element from its window. Backward: one *input* element gathered from the
// output windows covering it, in ascending (oh, ow) order - no atomics, deterministic, and the
// same summation order as the CPU kernel's scatter (so f32/f64 results match it bitwise). The
// window rules are the CPU kernel's (kernels/cpu/pool.cpp). Math in opmath (f32 for f16/bf16).
#include <cmath>
#include <cstdint>

#include "kiln/core/dtype.h"
#include "kiln/core/macros.h"
#include "kiln/kernels/conv.h"
#include "kiln/kernels/memory_format.h"
#include "kiln/kernels/pool.h"

namespace kiln::kernels::pool_math {

// Strided [N, C, H, W] access to one operand (strides in elements).
template <class T> struct View4 {
  T* p;
  int64_t sn, sc, sh, sw;
  KILN_INLINE T& at(int64_t n, int64_t c, int64_t h, int64_t w) const { return p[n * sn + c * sc + h * sh + w * sw]; }
};

template <class T> inline View4<T> view4(const Tensor& t) {
  return {static_cast<T*>(t.data_ptr()), t.stride(0), t.stride(1), t.stride(2), t.stride(3)};
}

// i -> (n, c, h, w) of an [N, C, H, W] index space; channels innermost when `cl` (so that
// neighbouring threads touch neighbouring addresses of a channels-last tensor).
KILN_INLINE void unflatten(int64_t i, int64_t C, int64_t H, int64_t W, bool cl, int64_t& n, int64_t& c, int64_t& h,
                           int64_t& w) {
  if (cl) {
    c = i % C;
    i /= C;
    w = i % W;
    i /= W;
    h = i % H;
    n = i / H;
  } else {
    w = i % W;
    i /= W;
    h = i % H;
    i /= H;
    c = i % C;
    n = i / C;
  }
}

KILN_INLINE int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }
KILN_INLINE int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

// The in-bounds part [s, e) of window o along one axis: start o * stride - pad, length k.
KILN_INLINE void window(int64_t o, int64_t stride, int64_t pad, int64_t k, int64_t n, int64_t& s, int64_t& e) {
  const int64_t start = o * stride - pad;
  s = imax(start, 0);
  e = imin(start + k, n);
}

// The windows o in [lo, hi] (inclusive, within [0, out_n)) whose unclipped extent
// [o * stride - pad, o * stride - pad + k) contains i (i >= 0, pad >= 0).
KILN_INLINE void covering(int64_t i, int64_t stride, int64_t pad, int64_t k, int64_t out_n, int64_t& lo, int64_t& hi) {
  const int64_t first = i + pad - k + 1;  // o * stride >= first
  lo = first <= 0 ? 0 : (first + stride - 1) / stride;
  hi = imin((i + pad) / stride, out_n - 1);
}

// window() along both axes: rows [hs, he) and columns [ws, we) of output window (oh, ow).
KILN_INLINE void window2d(int64_t oh, int64_t ow, const PoolGeometry& g, int64_t& hs, int64_t& he, int64_t& ws,
                          int64_t& we) {
  window(oh, g.sh, g.ph, g.kh, g.H, hs, he);
  window(ow, g.sw, g.pw, g.kw, g.W, ws, we);
}

// covering() along both axes: the windows oh in [oh0, oh1], ow in [ow0, ow1] around input (h, w).
KILN_INLINE void covering2d(int64_t h, int64_t w, const PoolGeometry& g, int64_t& oh0, int64_t& oh1, int64_t& ow0,
                            int64_t& ow1) {
  covering(h, g.sh, g.ph, g.kh, g.OH, oh0, oh1);
  covering(w, g.sw, g.pw, g.kw, g.OW, ow0, ow1);
}

// Adaptive windows: window o covers [floor(o * n / out_n), ceil((o + 1) * n / out_n)).
KILN_INLINE int64_t ad_start(int64_t o, int64_t n, int64_t out_n) { return (o * n) / out_n; }
KILN_INLINE int64_t ad_end(int64_t o, int64_t n, int64_t out_n) { return ((o + 1) * n + out_n - 1) / out_n; }
// The adaptive windows that can contain i: o in [floor(i * out_n / n), ceil((i + 1) * out_n / n) - 1]
// (the callers still test each one).
KILN_INLINE void ad_covering(int64_t i, int64_t n, int64_t out_n, int64_t& lo, int64_t& hi) {
  lo = (i * out_n) / n;
  hi = imin(((i + 1) * out_n + n - 1) / n - 1, out_n - 1);
}

// Divisor of an average-pool window: kh * kw with count_include_pad (windows never reach past
// the padding), else the number of in-bounds elements.
KILN_INLINE int64_t avg_divisor(int64_t hs, int64_t he, int64_t ws, int64_t we, const PoolGeometry& g,
                                bool include_pad) {
  return include_pad ? g.kh * g.kw : (he - hs) * (we - ws);
}

// ---------------------------------------------------------------------- per-element bodies

// Sum of X[n, c] over rows [hs, he) and columns [ws, we), in opmath.
template <class T>
KILN_INLINE opmath_t<T> box_sum(const View4<const T>& X, int64_t n, int64_t c, int64_t hs, int64_t he, int64_t ws,
                                int64_t we) {
  using M = opmath_t<T>;
  M s = 0;
  for (int64_t h = hs; h < he; ++h)
    for (int64_t w = ws; w < we; ++w) s += static_cast<M>(X.at(n, c, h, w));
  return s;
}

// Max of window (oh, ow) and the flat offset h * W + w of its first maximum (a NaN wins).
template <class T>
KILN_INLINE void max_fwd_at(const View4<const T>& X, const PoolGeometry& g, int64_t n, int64_t c, int64_t oh,
                            int64_t ow, opmath_t<T>& best, int32_t& bi) {
  using M = opmath_t<T>;
  int64_t hs, he, ws, we;
  window2d(oh, ow, g, hs, he, ws, we);
  best = -static_cast<M>(INFINITY);
  bi = static_cast<int32_t>(hs * g.W + ws);
  for (int64_t h = hs; h < he; ++h)
    for (int64_t w = ws; w < we; ++w) {
      const M v = static_cast<M>(X.at(n, c, h, w));
      if ((v > best) | (v != v)) {  // strict >: the first of equal maxima stays
        best = v;
        bi = static_cast<int32_t>(h * g.W + w);
      }
    }
}

// d(loss)/d x[n, c, h, w]: the gradients of the windows whose recorded argmax is (h, w).
template <class T>
KILN_INLINE opmath_t<T> max_bwd_at(const View4<const T>& GY, const View4<const int32_t>& I, const PoolGeometry& g,
                                   int64_t n, int64_t c, int64_t h, int64_t w) {
  using M = opmath_t<T>;
  int64_t oh0, oh1, ow0, ow1;
  covering2d(h, w, g, oh0, oh1, ow0, ow1);
  const int32_t self = static_cast<int32_t>(h * g.W + w);
  M acc = 0;
  for (int64_t oh = oh0; oh <= oh1; ++oh)
    for (int64_t ow = ow0; ow <= ow1; ++ow)
      if (I.at(n, c, oh, ow) == self) acc += static_cast<M>(GY.at(n, c, oh, ow));
  return acc;
}

template <class T>
KILN_INLINE opmath_t<T> avg_fwd_at(const View4<const T>& X, const PoolGeometry& g, bool include_pad, int64_t n,
                                   int64_t c, int64_t oh, int64_t ow) {
  int64_t hs, he, ws, we;
  window2d(oh, ow, g, hs, he, ws, we);
  using M = opmath_t<T>;
  const M s = box_sum<T>(X, n, c, hs, he, ws, we);
  const int64_t d = avg_divisor(hs, he, ws, we, g, include_pad);
  return d > 0 ? s / static_cast<M>(d) : M(0);
}

template <class T>
KILN_INLINE opmath_t<T> avg_bwd_at(const View4<const T>& GY, const PoolGeometry& g, bool include_pad, int64_t n,
                                   int64_t c, int64_t h, int64_t w) {
  using M = opmath_t<T>;
  int64_t oh0, oh1, ow0, ow1;
  covering2d(h, w, g, oh0, oh1, ow0, ow1);
  M acc = 0;
  for (int64_t oh = oh0; oh <= oh1; ++oh) {
    int64_t hs, he;
    window(oh, g.sh, g.ph, g.kh, g.H, hs, he);
    for (int64_t ow = ow0; ow <= ow1; ++ow) {
      int64_t ws, we;
      window(ow, g.sw, g.pw, g.kw, g.W, ws, we);
      const int64_t d = avg_divisor(hs, he, ws, we, g, include_pad);
      if (d == 0) continue;
      acc += static_cast<M>(GY.at(n, c, oh, ow)) / static_cast<M>(d);
    }
  }
  return acc;
}

template <class T>
KILN_INLINE opmath_t<T> adaptive_fwd_at(const View4<const T>& X, const PoolGeometry& g, int64_t n, int64_t c,
                                        int64_t oh, int64_t ow) {
  using M = opmath_t<T>;
  const int64_t hs = ad_start(oh, g.H, g.OH), he = ad_end(oh, g.H, g.OH);
  const int64_t ws = ad_start(ow, g.W, g.OW), we = ad_end(ow, g.W, g.OW);
  return box_sum<T>(X, n, c, hs, he, ws, we) / static_cast<M>((he - hs) * (we - ws));
}

template <class T>
KILN_INLINE opmath_t<T> adaptive_bwd_at(const View4<const T>& GY, const PoolGeometry& g, int64_t n, int64_t c,
                                        int64_t h, int64_t w) {
  using M = opmath_t<T>;
  int64_t oh0, oh1, ow0, ow1;
  ad_covering(h, g.H, g.OH, oh0, oh1);
  ad_covering(w, g.W, g.OW, ow0, ow1);
  M acc = 0;
  for (int64_t oh = oh0; oh <= oh1; ++oh) {
    const int64_t hs = ad_start(oh, g.H, g.OH), he = ad_end(oh, g.H, g.OH);
    if (h < hs || h >= he) continue;
    for (int64_t ow = ow0; ow <= ow1; ++ow) {
      const int64_t ws = ad_start(ow, g.W, g.OW), we = ad_end(ow, g.W, g.OW);
      if (w < ws || w >= we) continue;
      acc += static_cast<M>(GY.at(n, c, oh, ow)) / static_cast<M>((he - hs) * (we - ws));
    }
  }
  return acc;
}

}  // namespace kiln::kernels::pool_math
