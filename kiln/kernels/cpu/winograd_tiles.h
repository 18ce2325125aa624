#pragma once
// The two Winograd tiles of the CPU's 3x3 convolutions (kernels/cpu/winograd.cpp; docs/kernels.md,
// "Winograd convolution"): F(2, 3) and F(4, 3), each as its six one-dimensional transforms.
// In one dimension, m outputs of a 3-tap correlation y_i = sum_j d_{i+j} g_j come from alpha =
// m + 2 products of transformed values: y = A^T [(G g) . (B^T d)]. The 2-D tile nests them,
// Y = A^T [(G g G^T) . (B^T d B)] A. The backward runs them adjoint: A (the output gradient into
// the transformed domain), B (the transformed input gradient back to the input tile) and G^T
// (the transformed weight gradient back to the 3 taps).
//
// Each transform is written once for scalars and for GCC vector types (AVX-512's __m512 takes
// the same operators, and a scalar operand is broadcast), so the generic and the vectorised
// transforms share the arithmetic.
#include <cstdint>
#include <type_traits>
#include <utility>

namespace kiln::kernels::cpu::winograd {

// The element type of a value the transforms take: the type itself, or a vector's lane type
// (GCC's vector types, __m512 among them, can be indexed).
template <class V, class = void> struct Lane { using type = V; };
template <class V> struct Lane<V, std::void_t<decltype(std::declval<V&>()[0])>> {
  using type = std::decay_t<decltype(std::declval<V&>()[0])>;
};
template <class V> using lane_t = typename Lane<V>::type;

// F(2, 3): interpolation points 0, 1, -1 and infinity. 16 products per 2x2 output tile per
// channel pair instead of 36 (2.25x fewer).
struct F2 {
  static constexpr int64_t m = 2;      // output tile side
  static constexpr int64_t alpha = 4;  // transformed tile side, m + 3 - 1
  static constexpr int64_t xi = alpha * alpha;

  // B^T d: the input tile row d[4] -> 4 transformed values.
  template <class V> static void bt(const V (&d)[4], V (&o)[4]) {
    o[0] = d[0] - d[2];
    o[1] = d[1] + d[2];
    o[2] = d[2] - d[1];
    o[3] = d[1] - d[3];
  }
  // B q, the adjoint of bt: 4 transformed values -> the input tile row's 4 gradients.
  template <class V> static void b(const V (&q)[4], V (&o)[4]) {
    o[0] = q[0];
    o[1] = q[1] - q[2] + q[3];
    o[2] = q[1] + q[2] - q[0];
    o[3] = -q[3];
  }
  // G g: the 3 taps -> 4 transformed values.
  template <class V> static void g(const V (&w)[3], V (&o)[4]) {
    using S = lane_t<V>;
    o[0] = w[0];
    o[1] = (w[0] + w[1] + w[2]) * S(0.5);
    o[2] = (w[0] - w[1] + w[2]) * S(0.5);
    o[3] = w[2];
  }
  // G^T q, the adjoint of g: 4 transformed values -> the 3 taps' gradients.
  template <class V> static void gt(const V (&q)[4], V (&o)[3]) {
    using S = lane_t<V>;
    const V s = (q[1] + q[2]) * S(0.5);
    o[0] = q[0] + s;
    o[1] = (q[1] - q[2]) * S(0.5);
    o[2] = s + q[3];
  }
  // A^T q: 4 products -> the 2 outputs.
  template <class V> static void at(const V (&q)[4], V (&o)[2]) {
    o[0] = q[0] + q[1] + q[2];
    o[1] = q[1] - q[2] - q[3];
  }
  // A e, the adjoint of at: the 2 outputs' gradients -> 4 transformed values.
  template <class V> static void a(const V (&e)[2], V (&o)[4]) {
    o[0] = e[0];
    o[1] = e[0] + e[1];
    o[2] = e[0] - e[1];
    o[3] = -e[1];
  }
};

// F(4, 3): interpolation points 0, 1, -1, 2, -2 and infinity. 36 products per 4x4 output tile
// per channel pair instead of 144 (4x fewer), at the cost of larger transform coefficients
// (up to 8), which round a little more (docs/kernels.md has the measured errors).
struct F4 {
  static constexpr int64_t m = 4;
  static constexpr int64_t alpha = 6;
  static constexpr int64_t xi = alpha * alpha;

  template <class V> static void bt(const V (&d)[6], V (&o)[6]) {
    using S = lane_t<V>;
    const V d42 = d[4] - d[2], d31 = d[3] - d[1];
    o[0] = (d[4] - d[2] * S(5)) + d[0] * S(4);
    o[1] = (d[3] + d[4]) - (d[1] + d[2]) * S(4);
    o[2] = (d[4] - d[3]) + (d[1] - d[2]) * S(4);
    o[3] = d42 + d31 * S(2);
    o[4] = d42 - d31 * S(2);
    o[5] = (d[5] - d[3] * S(5)) + d[1] * S(4);
  }
  template <class V> static void b(const V (&q)[6], V (&o)[6]) {
    using S = lane_t<V>;
    const V q12s = q[1] + q[2], q12d = q[2] - q[1], q34s = q[3] + q[4], q34d = q[3] - q[4];
    o[0] = q[0] * S(4);
    o[1] = (q12d + q[5]) * S(4) - q34d * S(2);
    o[2] = -(q[0] * S(5) + q12s * S(4) + q34s);
    o[3] = q34d * S(2) - q12d - q[5] * S(5);
    o[4] = q[0] + q12s + q34s;
    o[5] = q[5];
  }
  template <class V> static void g(const V (&w)[3], V (&o)[6]) {
    using S = lane_t<V>;
    const V s02 = w[0] + w[2];
    o[0] = w[0] * S(0.25);
    o[1] = (s02 + w[1]) * S(-1.0 / 6);
    o[2] = (s02 - w[1]) * S(-1.0 / 6);
    const V c = w[0] * S(1.0 / 24) + w[2] * S(1.0 / 6), l = w[1] * S(1.0 / 12);
    o[3] = c + l;
    o[4] = c - l;
    o[5] = w[2];
  }
  template <class V> static void gt(const V (&q)[6], V (&o)[3]) {
    using S = lane_t<V>;
    const V s12 = q[1] + q[2], d12 = q[2] - q[1], s34 = q[3] + q[4], d34 = q[3] - q[4];
    o[0] = q[0] * S(0.25) - s12 * S(1.0 / 6) + s34 * S(1.0 / 24);
    o[1] = d12 * S(1.0 / 6) + d34 * S(1.0 / 12);
    o[2] = (s34 - s12) * S(1.0 / 6) + q[5];
  }
  template <class V> static void at(const V (&q)[6], V (&o)[4]) {
    using S = lane_t<V>;
    const V s12 = q[1] + q[2], d12 = q[1] - q[2], s34 = q[3] + q[4], d34 = q[3] - q[4];
    o[0] = q[0] + s12 + s34;
    o[1] = d12 + d34 * S(2);
    o[2] = s12 + s34 * S(4);
    o[3] = (d12 + q[5]) + d34 * S(8);
  }
  template <class V> static void a(const V (&e)[4], V (&o)[6]) {
    using S = lane_t<V>;
    const V s02 = e[0] + e[2], s13 = e[1] + e[3];
    const V f02 = e[0] + e[2] * S(4), f13 = (e[1] + e[3] * S(4)) * S(2);
    o[0] = e[0];
    o[1] = s02 + s13;
    o[2] = s02 - s13;
    o[3] = f02 + f13;
    o[4] = f02 - f13;
    o[5] = e[3];
  }
};

// The 2-D transforms as the 1-D ones along each index of a tile t[i][j]: first along i for
// every j, then along j for every i. In is the row of values a 1-D transform takes, Out the
// row it gives; f(row in, row out) is one of the tiles' transforms.
template <int In, int Out, class V, class Fn> inline void nest(const V (&t)[In][In], V (&o)[Out][Out], Fn f) {
  V h[Out][In];
  for (int j = 0; j < In; ++j) {
    V col[In], r[Out];
    for (int i = 0; i < In; ++i) col[i] = t[i][j];
    f(col, r);
    for (int i = 0; i < Out; ++i) h[i][j] = r[i];
  }
  for (int i = 0; i < Out; ++i) f(h[i], o[i]);
}

}  // namespace kiln::kernels::cpu::winograd
