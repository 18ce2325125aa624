// Winograd F(2x2, 3x3) convolution on the CPU (kernels/cpu/winograd.h; docs/kernels.md,
// "Winograd convolution").
//
// In one dimension, two outputs of a 3-tap correlation y_i = sum_j d_{i+j} g_j come from four
// products of transformed values, m = (G g) . (B^T d), y = A^T m, with
//   B^T d = [d0 - d2, d1 + d2, d2 - d1, d1 - d3]
//   G g   = [g0, (g0 + g1 + g2) / 2, (g0 - g1 + g2) / 2, g2]
//   A^T m = [m0 + m1 + m2, m1 - m2 - m3].
// Nesting it in both dimensions, a 2x2 output tile takes a 4x4 input tile d and
//   Y = A^T [ sum_c (G g_kc G^T) . (B^T d_c B) ] A,
// and the sum over input channels, for each of the 16 positions xi of the 4x4 transformed tile,
// is a matrix product: M[xi] (K x tiles) = U[xi] (K x C) V[xi] (C x tiles). 16 such products
// of K*C*tiles replace the direct kernel's 36 per tile: 2.25x fewer FLOPs.
//
// The weight gradient runs the forward's transforms adjoint, and so does the input gradient when
// whole samples fit a chunk (run_backward: the output gradient transformed once, A dY A^T, for
// both); otherwise the input gradient is the forward's computation on the output gradient with
// the weight rotated and transposed (run on input_grad_problem). The work
// is cut into chunks of tiles (whole samples, or rows of tiles of one sample when a sample has
// many) of ~4 MB of V and M, so that each product's slices stay in L2; chunks are spread over
// threads, each running its 16 products single-threaded.
#include "kiln/kernels/cpu/winograd.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "kiln/core/cpu_conv.h"
#include "kiln/core/error.h"
#include "kiln/kernels/cpu/gemm.h"

namespace kiln::kernels::cpu {

namespace {

constexpr int64_t kTile = 4;                 // transformed tile side (alpha = m + r - 1)
constexpr int64_t kXi = kTile * kTile;       // transformed positions per tile
constexpr int64_t kOut = 2;                  // output tile side

// On unless the environment says KILN_CPU_CONV_WINOGRAD=0 (for A/B runs of whole programs).
std::atomic<bool>& winograd_switch() {
  static std::atomic<bool> on{[] {
    const char* e = std::getenv("KILN_CPU_CONV_WINOGRAD");
    return !(e && std::string(e) == "0");
  }()};
  return on;
}

// A 3x3 stride-1 correlation with zero padding: in [N, C, H, W] -> out [N, K, OH, OW].
struct Problem {
  int64_t N, C, H, W, K, OH, OW, ph, pw;
  int64_t TH, TW;  // tiles per column and row of an output plane
  Problem(int64_t N_, int64_t C_, int64_t H_, int64_t W_, int64_t K_, int64_t OH_, int64_t OW_, int64_t ph_,
          int64_t pw_)
      : N(N_), C(C_), H(H_), W(W_), K(K_), OH(OH_), OW(OW_), ph(ph_), pw(pw_),
        TH((OH_ + kOut - 1) / kOut), TW((OW_ + kOut - 1) / kOut) {}
};

// A chunk of tiles: samples [n0, n1), tile rows [ty0, ty1) of each. Tile (n, ty, tx) is column
// ((n - n0) * (ty1 - ty0) + ty - ty0) * TW + tx of the chunk's matrices.
struct Chunk {
  int64_t n0, n1, ty0, ty1;
  bool whole_samples;
  int64_t tiles(const Problem& p) const { return (n1 - n0) * (ty1 - ty0) * p.TW; }
};

// Tiles per chunk: V (16 x C x tiles) and M (16 x K x tiles) floats within ~4 MB, which is more
// than the 2 MB L2 but measured faster than smaller chunks on ResNet's shapes (larger products;
// each product's own slices of V and M do fit), at least 32 columns so that the products fill
// the micro-kernel's 32-wide panels, and at least two chunks per thread when the batch allows.
// (4 MB was also measured against 16 MB for the weight gradient, whose inner dimension the
// chunk is: 16 MB was 1.2-1.7x slower on the 28x28 to 7x7 layers.)
int64_t tiles_per_chunk(const Problem& p) {
  return std::max<int64_t>(32, (int64_t(1) << 22) / (kXi * 4 * (p.C + p.K)));
}
// whole_samples_only: never rows of tiles, at least one sample per chunk however large (the
// generated backward makes its output gradient one sample at a time).
std::vector<Chunk> make_chunks(const Problem& p, int nt, bool whole_samples_only = false) {
  const int64_t tps = p.TH * p.TW;
  const int64_t budget = tiles_per_chunk(p);
  std::vector<Chunk> chunks;
  if (tps <= budget || whole_samples_only) {
    int64_t spc = std::max<int64_t>(1, budget / std::max<int64_t>(tps, 1));
    spc = std::min(spc, std::max<int64_t>(1, p.N / (2 * nt)));
    for (int64_t n = 0; n < p.N; n += spc) chunks.push_back({n, std::min(p.N, n + spc), 0, p.TH, true});
  } else {
    const int64_t rows = std::max<int64_t>(1, budget / p.TW);
    for (int64_t n = 0; n < p.N; ++n)
      for (int64_t ty = 0; ty < p.TH; ty += rows) chunks.push_back({n, n + 1, ty, std::min(p.TH, ty + rows), false});
  }
  return chunks;
}

// A growable per-thread buffer that is neither zeroed nor freed between calls: the transforms
// overwrite all of it, and a fresh multi-megabyte allocation per call would pay its page faults
// again. Slot 0: a chunk's matrices; slot 1: the calling thread's U, read by every worker.
template <class T, int Slot = 0>
T* scratch(size_t n) {
  thread_local std::vector<T> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}
template <class T>
T* weight_scratch(size_t n) { return scratch<T, 1>(n); }

// u = G g G^T for a 3x3 filter g, on scalars or on vectors of filters (GCC's vector types take
// the same operators).
template <class V, class S>
inline void filter_transform(const V (&g)[3][3], V (&u)[4][4], S half) {
  V gg[4][3];  // G g
  for (int j = 0; j < 3; ++j) {
    gg[0][j] = g[0][j];
    gg[1][j] = (g[0][j] + g[1][j] + g[2][j]) * half;
    gg[2][j] = (g[0][j] - g[1][j] + g[2][j]) * half;
    gg[3][j] = g[2][j];
  }
  for (int a = 0; a < 4; ++a) {  // (G g) G^T
    u[a][0] = gg[a][0];
    u[a][1] = (gg[a][0] + gg[a][1] + gg[a][2]) * half;
    u[a][2] = (gg[a][0] - gg[a][1] + gg[a][2]) * half;
    u[a][3] = gg[a][2];
  }
}

// Which matrices transform_weights makes from w [K, C, 3, 3]: U[xi] = (G w[k][c] G^T)[xi] as
// K x C (Forward) or C x K (Transposed: the input gradient through the forward's tiles, U^T
// Gt, without transposing in the GEMM), or the "full" convolution's C x K matrices of the 180
// degree rotated filters (FlippedTransposed: the input gradient as a convolution of gy).
enum class WeightLayout { Forward, Transposed, FlippedTransposed };

// U[xi][ko][ci] = (G g G^T)[xi] of the 3x3 filter g that maps channel ci to channel ko, into u
// (16 * KO * CI values), for the layouts above.
template <class T>
void transform_weights(const T* w, int64_t K, int64_t C, WeightLayout layout, T* u) {
  const bool swap = layout != WeightLayout::Forward, flip = layout == WeightLayout::FlippedTransposed;
  const int64_t KO = swap ? C : K, CI = swap ? K : C, plane = KO * CI;
  // filter (ko, ci) starts at w + ko * kos + ci * cis
  const int64_t kos = swap ? 9 : 9 * C, cis = swap ? 9 * C : 9;
  const bool par = !omp_in_parallel() && K * C >= 4096;
#pragma omp parallel for schedule(static) if (par)
  for (int64_t ko = 0; ko < KO; ++ko) {
    int64_t ci = 0;
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<T, float>) {  // 16 filters at a time, their taps gathered
      const __m512i lane = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                              _mm512_set1_epi32(static_cast<int>(cis)));
      for (; ci + 16 <= CI; ci += 16) {
        const float* f = w + ko * kos + ci * cis;
        __m512 g[3][3], r[4][4];
        for (int i = 0; i < 3; ++i)
          for (int j = 0; j < 3; ++j) {
            const int tap = flip ? (2 - i) * 3 + (2 - j) : i * 3 + j;
            g[i][j] = _mm512_i32gather_ps(lane, f + tap, 4);
          }
        filter_transform(g, r, 0.5f);
        for (int a = 0; a < 4; ++a)
          for (int b = 0; b < 4; ++b) _mm512_storeu_ps(u + (a * 4 + b) * plane + ko * CI + ci, r[a][b]);
      }
    }
#endif
    for (; ci < CI; ++ci) {
      const T* f = w + ko * kos + ci * cis;
      T g[3][3], r[4][4];
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) g[i][j] = flip ? f[(2 - i) * 3 + (2 - j)] : f[i * 3 + j];
      filter_transform(g, r, T(0.5));
      for (int a = 0; a < 4; ++a)
        for (int b = 0; b < 4; ++b) u[(a * 4 + b) * plane + ko * CI + ci] = r[a][b];
    }
  }
}

// V[xi][c][t] = (B^T d B)[xi] for every tile t of the chunk and channel c (ld = the chunk's
// tiles). The four input rows a tile row reads are split into even and odd columns first, so
// that the tile at tx reads e[tx], o[tx], e[tx + 1], o[tx + 1]: unit-stride loops over tx.
// Returns false if a transformed value is not finite (see all_finite).
template <class T>
bool input_transform(const Problem& p, const T* in, const Chunk& ch, T* v, int64_t ld, int64_t xs, T* rowbuf) {
  bool finite = true;
  const int64_t TW = p.TW, half = TW + 1;
  T* e = rowbuf;              // [4][half]
  T* o = rowbuf + 4 * half;   // [4][half]
  for (int64_t c = 0; c < p.C; ++c) {
    T* vc = v + c * ld;
    for (int64_t n = ch.n0; n < ch.n1; ++n) {
      const T* plane = in + (n * p.C + c) * p.H * p.W;
      for (int64_t ty = ch.ty0; ty < ch.ty1; ++ty) {
        for (int64_t i = 0; i < kTile; ++i) {
          const int64_t r = kOut * ty - p.ph + i;
          T* ei = e + i * half;
          T* oi = o + i * half;
          if (r < 0 || r >= p.H) {
            std::fill(ei, ei + half, T(0));
            std::fill(oi, oi + half, T(0));
            continue;
          }
          const T* row = plane + r * p.W;
          for (int64_t u = 0; u < half; ++u) {
            const int64_t c0 = 2 * u - p.pw, c1 = c0 + 1;
            ei[u] = c0 >= 0 && c0 < p.W ? row[c0] : T(0);
            oi[u] = c1 >= 0 && c1 < p.W ? row[c1] : T(0);
          }
        }
        T* vt = vc + ((n - ch.n0) * (ch.ty1 - ch.ty0) + ty - ch.ty0) * TW;
        for (int64_t tx = 0; tx < TW; ++tx) {
          T s[4][4];  // B^T applied along each row: s[i][b]
          for (int i = 0; i < 4; ++i) {
            const T d0 = e[i * half + tx], d1 = o[i * half + tx], d2 = e[i * half + tx + 1], d3 = o[i * half + tx + 1];
            s[i][0] = d0 - d2;
            s[i][1] = d1 + d2;
            s[i][2] = d2 - d1;
            s[i][3] = d1 - d3;
          }
          for (int b = 0; b < 4; ++b) {  // then along each column
            const T r[4] = {s[0][b] - s[2][b], s[1][b] + s[2][b], s[2][b] - s[1][b], s[1][b] - s[3][b]};
            for (int a = 0; a < 4; ++a) {
              vt[(a * 4 + b) * xs + tx] = r[a];
              finite = finite && r[a] - r[a] == T(0);
            }
          }
        }
      }
    }
  }
  return finite;
}

// out tiles = A^T M[.][k][t] A (+ bias[k]), clipped to the plane where the tiles overhang it.
// Returns false if an output is not finite: with finite transformed operands, only a product or
// sum that overflowed, where the direct kernel might give +-Inf rather than NaN.
template <class T>
bool output_transform(const Problem& p, const T* m, int64_t ld, int64_t xs, const Chunk& ch, const T* bias, T* out,
                      T* rowbuf) {
  const int64_t TW = p.TW;
  T check = T(0);
  T* y0 = rowbuf;            // the tile row's two output rows, 2 * TW wide each
  T* y1 = rowbuf + 2 * TW;
  for (int64_t k = 0; k < p.K; ++k) {
    const T b = bias ? bias[k] : T(0);
    for (int64_t n = ch.n0; n < ch.n1; ++n) {
      T* plane = out + (n * p.K + k) * p.OH * p.OW;
      for (int64_t ty = ch.ty0; ty < ch.ty1; ++ty) {
        const T* mt = m + k * ld + ((n - ch.n0) * (ch.ty1 - ch.ty0) + ty - ch.ty0) * TW;
        for (int64_t tx = 0; tx < TW; ++tx) {
          T q[2][4];  // A^T along each column
          for (int b = 0; b < 4; ++b) {
            const T m0 = mt[(0 * 4 + b) * xs + tx], m1 = mt[(1 * 4 + b) * xs + tx];
            const T m2 = mt[(2 * 4 + b) * xs + tx], m3 = mt[(3 * 4 + b) * xs + tx];
            q[0][b] = m0 + m1 + m2;
            q[1][b] = m1 - m2 - m3;
          }
          y0[2 * tx] = q[0][0] + q[0][1] + q[0][2] + b;
          y0[2 * tx + 1] = q[0][1] - q[0][2] - q[0][3] + b;
          y1[2 * tx] = q[1][0] + q[1][1] + q[1][2] + b;
          y1[2 * tx + 1] = q[1][1] - q[1][2] - q[1][3] + b;
        }
        const int64_t r = kOut * ty;
        for (int64_t i = 0; i < 2 * TW; ++i) check += (y0[i] - y0[i]) + (y1[i] - y1[i]);
        std::copy_n(y0, p.OW, plane + r * p.OW);
        if (r + 1 < p.OH) std::copy_n(y1, p.OW, plane + (r + 1) * p.OW);
      }
    }
  }
  return check == T(0);
}

// The weight gradient's transform of the output gradient, the adjoint of output_transform:
// G[.][k][t] = A dY A^T for each 2x2 tile dY of gy (zero where the tile overhangs the plane),
// A dY per column being [e0, e0 + e1, e0 - e1, -e1]. Returns false if a value is not finite.
template <class T>
bool grad_transform(const Problem& p, const T* gy, const Chunk& ch, T* gt, int64_t ld, int64_t xs, T*) {
  bool finite = true;
  for (int64_t k = 0; k < p.K; ++k)
    for (int64_t n = ch.n0; n < ch.n1; ++n) {
      const T* plane = gy + (n * p.K + k) * p.OH * p.OW;
      for (int64_t ty = ch.ty0; ty < ch.ty1; ++ty) {
        T* g = gt + k * ld + ((n - ch.n0) * (ch.ty1 - ch.ty0) + ty - ch.ty0) * p.TW;
        for (int64_t tx = 0; tx < p.TW; ++tx) {
          T e[2][2];
          for (int a = 0; a < 2; ++a)
            for (int b = 0; b < 2; ++b) {
              const int64_t r = kOut * ty + a, c = kOut * tx + b;
              e[a][b] = r < p.OH && c < p.OW ? plane[r * p.OW + c] : T(0);
            }
          T s[2][4];  // along each row
          for (int a = 0; a < 2; ++a) {
            s[a][0] = e[a][0];
            s[a][1] = e[a][0] + e[a][1];
            s[a][2] = e[a][0] - e[a][1];
            s[a][3] = -e[a][1];
          }
          for (int b = 0; b < 4; ++b) {  // then along each column
            const T r[4] = {s[0][b], s[0][b] + s[1][b], s[0][b] - s[1][b], -s[1][b]};
            for (int a = 0; a < 4; ++a) {
              g[(a * 4 + b) * xs + tx] = r[a];
              finite = finite && r[a] - r[a] == T(0);
            }
          }
        }
      }
    }
  return finite;
}

// The input gradient's plane buffer (input_transform_adjoint): rows 0 .. 2 TH + 1 of the tiles'
// input region (input row r - ph), each from column -pw on and wide enough for whole 32-column
// stores of every group of 16 tiles plus the last tile's overhang.
inline int64_t adjoint_width(const Problem& p) { return (p.TW + 15) / 16 * 32 + 16; }
inline int64_t adjoint_plane_floats(const Problem& p) { return (kOut * p.TH + 2) * adjoint_width(p); }

// The input gradient through the forward's own tiles, the adjoint of input_transform: each
// tile's 16 values dv[xi] (C x tiles, laid out as V) go back through B, dd = B dv B^T with
// B q = [q0, q1 - q2 + q3, q1 + q2 - q0, -q3], and neighbouring tiles, which overlap by two rows
// and columns, add up in the plane. So the output gradient is transformed once (A dY A^T, shared
// with the weight gradient) instead of again through B^T as the input of a "full" convolution.
// Whole samples only (another chunk's tiles would add into the same rows); gx's planes of the
// chunk's samples are overwritten; plane: adjoint_plane_floats scratch. Returns false if a value
// is not finite.
template <class T>
bool input_transform_adjoint(const Problem& p, const T* dv, int64_t ld, int64_t xs, const Chunk& ch, T* gx,
                             T* plane) {
  const int64_t wd = adjoint_width(p), rows = kOut * p.TH + 2;
  T check = T(0);
  for (int64_t n = ch.n0; n < ch.n1; ++n)
    for (int64_t c = 0; c < p.C; ++c) {
      std::fill(plane, plane + rows * wd, T(0));
      for (int64_t ty = 0; ty < p.TH; ++ty)
        for (int64_t tx = 0; tx < p.TW; ++tx) {
          const T* d = dv + c * ld + ((n - ch.n0) * p.TH + ty) * p.TW + tx;
          T h[4][4];  // B along the first index: h[i][b]
          for (int b = 0; b < 4; ++b) {
            const T q0 = d[(0 * 4 + b) * xs], q1 = d[(1 * 4 + b) * xs], q2 = d[(2 * 4 + b) * xs],
                    q3 = d[(3 * 4 + b) * xs];
            h[0][b] = q0;
            h[1][b] = q1 - q2 + q3;
            h[2][b] = q1 + q2 - q0;
            h[3][b] = -q3;
          }
          for (int i = 0; i < 4; ++i) {  // then along the second
            T* row = plane + (kOut * ty + i) * wd + kOut * tx;
            row[0] += h[i][0];
            row[1] += h[i][1] - h[i][2] + h[i][3];
            row[2] += h[i][1] + h[i][2] - h[i][0];
            row[3] += -h[i][3];
          }
        }
      T* out = gx + (n * p.C + c) * p.H * p.W;
      for (int64_t r = 0; r < p.H; ++r) {
        const T* src = plane + (r + p.ph) * wd + p.pw;
        for (int64_t w = 0; w < p.W; ++w) check += src[w] - src[w];
        std::copy_n(src, p.W, out + r * p.W);
      }
    }
  return check == T(0);
}

// The zero-bordered copy of a chunk's input rows (input_transform<float>): each row holds
// column -pw on, as far as the last vector of the last tile reads (2 * 16-wide groups + 2).
inline int64_t padded_width(const Problem& p) { return (p.TW + 15) / 16 * 32 + 18; }
inline int64_t padded_plane_floats(const Problem& p, int64_t tile_rows) {
  return (kOut * tile_rows + 2) * padded_width(p);
}

#if defined(__AVX512F__)
// The f32 transforms, vectorised along a row of tiles: lane l of each vector is tile tx0 + l
// (up to 16 tiles; a plane narrower than 32 columns leaves lanes idle, which the products' cost
// at such planes' channel counts dwarfs).

// Lanes l with 0 <= start + l < n.
inline __mmask16 span_mask(int64_t start, int64_t n) {
  const int64_t lo = std::clamp<int64_t>(-start, 0, 16), hi = std::clamp<int64_t>(n - start, 0, 16);
  return hi > lo ? static_cast<__mmask16>(((1u << hi) - 1u) & ~((1u << lo) - 1u)) : __mmask16(0);
}

// row[start + l] for the lanes inside [0, n), zero elsewhere (padding).
inline __m512 load_span(const float* row, int64_t start, int64_t n) {
  const __mmask16 m = span_mask(start, n);
  return m ? _mm512_maskz_loadu_ps(m, row + start) : _mm512_setzero_ps();  // masked lanes are not read
}

// Stores the 16 transformed positions of a row of up to 16 tiles, position xi at out + xi * xs,
// and returns the lanes where one of them is Inf or NaN. Whole vectors when `room`: the lanes
// past the row's last tile land on tiles of the same channel that the caller writes later;
// masked at the end of a channel's row.
inline __mmask16 store_positions(float* out, int64_t xs, bool room, __mmask16 lanes, const __m512 (&v)[kXi]) {
  __m512 sum = _mm512_setzero_ps();
  for (int xi = 0; xi < kXi; ++xi) {
    if (room) _mm512_storeu_ps(out + xi * xs, v[xi]);
    else _mm512_mask_storeu_ps(out + xi * xs, lanes, v[xi]);
    sum = _mm512_add_ps(sum, v[xi]);
  }
  // an Inf or NaN makes the sum Inf or NaN, and sum - sum NaN (so may a sum that overflows:
  // then the convolution is only computed directly, never wrong)
  const __m512 check = _mm512_sub_ps(sum, sum);
  return _mm512_mask_cmp_ps_mask(lanes, check, check, _CMP_UNORD_Q);
}

template <>
bool input_transform<float>(const Problem& p, const float* in, const Chunk& ch, float* v, int64_t ld, int64_t xs,
                           float* rowbuf) {
  __mmask16 bad = 0;  // lanes where a transformed value is Inf or NaN
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  // Each plane is first copied into a zero-bordered buffer (rowbuf: padded_plane_floats), so
  // that the loads below are whole, unmasked vectors: masked loads that start before a row
  // cost several times more on AMD's cores.
  const int64_t pw_ = padded_width(p), rows = kOut * (ch.ty1 - ch.ty0) + 2;
  for (int64_t n = ch.n0; n < ch.n1; ++n)
    for (int64_t c = 0; c < p.C; ++c) {
      const float* plane = in + (n * p.C + c) * p.H * p.W;
      // buffer row i holds input row kOut * ty0 - ph + i, from column -pw on
      for (int64_t i = 0; i < rows; ++i) {
        float* dst = rowbuf + i * pw_;
        const int64_t r = kOut * ch.ty0 - p.ph + i;
        if (r < 0 || r >= p.H) {
          std::fill(dst, dst + pw_, 0.0f);
          continue;
        }
        std::fill(dst, dst + p.pw, 0.0f);
        std::copy_n(plane + r * p.W, p.W, dst + p.pw);
        std::fill(dst + p.pw + p.W, dst + pw_, 0.0f);
      }
      for (int64_t ty = ch.ty0; ty < ch.ty1; ++ty) {
        const int64_t t = ((n - ch.n0) * (ch.ty1 - ch.ty0) + ty - ch.ty0) * p.TW;
        float* vt = v + c * ld + t;
        for (int64_t tx0 = 0; tx0 < p.TW; tx0 += 16) {
          const __mmask16 lanes = span_mask(0, p.TW - tx0);
          __m512 s[4][4];  // B^T along each row: s[i][b]
          for (int i = 0; i < 4; ++i) {
            const float* row = rowbuf + (kOut * (ty - ch.ty0) + i) * pw_ + 2 * tx0;
            const __m512 a0 = _mm512_loadu_ps(row), a1 = _mm512_loadu_ps(row + 16);
            const __m512 b0 = _mm512_loadu_ps(row + 2), b1 = _mm512_loadu_ps(row + 18);
            const __m512 d0 = _mm512_permutex2var_ps(a0, even, a1), d1 = _mm512_permutex2var_ps(a0, odd, a1);
            const __m512 d2 = _mm512_permutex2var_ps(b0, even, b1), d3 = _mm512_permutex2var_ps(b0, odd, b1);
            s[i][0] = _mm512_sub_ps(d0, d2);
            s[i][1] = _mm512_add_ps(d1, d2);
            s[i][2] = _mm512_sub_ps(d2, d1);
            s[i][3] = _mm512_sub_ps(d1, d3);
          }
          __m512 r[kXi];
          for (int b = 0; b < 4; ++b) {  // then along each column
            r[0 * 4 + b] = _mm512_sub_ps(s[0][b], s[2][b]);
            r[1 * 4 + b] = _mm512_add_ps(s[1][b], s[2][b]);
            r[2 * 4 + b] = _mm512_sub_ps(s[2][b], s[1][b]);
            r[3 * 4 + b] = _mm512_sub_ps(s[1][b], s[3][b]);
          }
          bad |= store_positions(vt + tx0, xs, t + tx0 + 16 <= ld, lanes, r);
        }
      }
    }
  return bad == 0;
}

template <>
bool output_transform<float>(const Problem& p, const float* m, int64_t ld, int64_t xs, const Chunk& ch,
                             const float* bias, float* out, float* rowbuf) {
  __m512 sum = _mm512_setzero_ps();  // Inf or NaN once an output is (see input_transform<float>)
  // the last plane row this chunk writes: whole-vector stores must not pass it, or they would
  // land on rows another thread's chunk may already have written
  const int64_t end_row = std::min(kOut * ch.ty1, p.OH);
  // With one group of 16 tiles per row both output rows are stored as they come; with more, a
  // later group's first row would spill onto the second row stored before it, so that row is
  // buffered (a library copy per row costs ~2% of a ResNet-18 step, so not by default)
  const bool buffered = p.TW > 16;
  // interleave two vectors of 16: (a0, b0, a1, b1, ...), the first and second halves
  const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  for (int64_t k = 0; k < p.K; ++k) {
    const __m512 bv = _mm512_set1_ps(bias ? bias[k] : 0.0f);
    for (int64_t n = ch.n0; n < ch.n1; ++n) {
      float* plane = out + (n * p.K + k) * p.OH * p.OW;
      for (int64_t ty = ch.ty0; ty < ch.ty1; ++ty) {
        const float* mt = m + k * ld + ((n - ch.n0) * (ch.ty1 - ch.ty0) + ty - ch.ty0) * p.TW;
        const int64_t r = kOut * ty;
        for (int64_t tx0 = 0; tx0 < p.TW; tx0 += 16) {
          const __mmask16 lanes = span_mask(0, p.TW - tx0);
          __m512 q[2][4];  // A^T along each column
          for (int b = 0; b < 4; ++b) {
            const __m512 m0 = _mm512_maskz_loadu_ps(lanes, mt + (0 * 4 + b) * xs + tx0);
            const __m512 m1 = _mm512_maskz_loadu_ps(lanes, mt + (1 * 4 + b) * xs + tx0);
            const __m512 m2 = _mm512_maskz_loadu_ps(lanes, mt + (2 * 4 + b) * xs + tx0);
            const __m512 m3 = _mm512_maskz_loadu_ps(lanes, mt + (3 * 4 + b) * xs + tx0);
            q[0][b] = _mm512_add_ps(_mm512_add_ps(m0, m1), m2);
            q[1][b] = _mm512_sub_ps(_mm512_sub_ps(m1, m2), m3);
          }
          const int64_t col = 2 * tx0;
          for (int a = 0; a < 2 && r + a < p.OH; ++a) {
            const __m512 y0 = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(q[a][0], q[a][1]), q[a][2]), bv);
            const __m512 y1 = _mm512_add_ps(_mm512_sub_ps(_mm512_sub_ps(q[a][1], q[a][2]), q[a][3]), bv);
            const __m512 v0 = _mm512_permutex2var_ps(y0, lo, y1), v1 = _mm512_permutex2var_ps(y0, hi, y1);
            sum = _mm512_add_ps(sum, _mm512_add_ps(y0, y1));
            if (a == 1 && buffered) {  // waits in rowbuf until every group's first row is out
              _mm512_storeu_ps(rowbuf + col, v0);
              _mm512_storeu_ps(rowbuf + col + 16, v1);
              continue;
            }
            // Whole-vector stores where they stay inside the chunk's rows: values past the row's
            // end land on the next rows, which are written after it (the second row next, or
            // from rowbuf below; later rows by later tile rows).
            const int64_t at = (r + a) * p.OW + col;
            float* row = plane + at;
            if (at + 32 <= end_row * p.OW) {
              _mm512_storeu_ps(row, v0);
              _mm512_storeu_ps(row + 16, v1);
            } else {
              _mm512_mask_storeu_ps(row, span_mask(col, p.OW), v0);
              _mm512_mask_storeu_ps(row + 16, span_mask(col + 16, p.OW), v1);
            }
          }
        }
        if (buffered && r + 1 < p.OH) std::copy_n(rowbuf, p.OW, plane + (r + 1) * p.OW);
      }
    }
  }
  const __m512 check = _mm512_sub_ps(sum, sum);
  return _mm512_cmp_ps_mask(check, check, _CMP_UNORD_Q) == 0;
}

template <>
bool grad_transform<float>(const Problem& p, const float* gy, const Chunk& ch, float* gt, int64_t ld, int64_t xs,
                           float* rowbuf) {
  __mmask16 bad = 0;
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  const __m512 zero = _mm512_setzero_ps();
  // the chunk's rows of each plane, zero-padded to whole tiles and whole vectors (see
  // input_transform<float> on masked loads)
  const int64_t width = (p.TW + 15) / 16 * 32, rows = kOut * (ch.ty1 - ch.ty0);
  for (int64_t n = ch.n0; n < ch.n1; ++n)
    for (int64_t k = 0; k < p.K; ++k) {
      const float* plane = gy + (n * p.K + k) * p.OH * p.OW;
      for (int64_t i = 0; i < rows; ++i) {
        float* dst = rowbuf + i * width;
        const int64_t r = kOut * ch.ty0 + i;
        if (r >= p.OH) {
          std::fill(dst, dst + width, 0.0f);
          continue;
        }
        std::copy_n(plane + r * p.OW, p.OW, dst);
        std::fill(dst + p.OW, dst + width, 0.0f);
      }
      for (int64_t ty = ch.ty0; ty < ch.ty1; ++ty) {
        const int64_t t = ((n - ch.n0) * (ch.ty1 - ch.ty0) + ty - ch.ty0) * p.TW;
        for (int64_t tx0 = 0; tx0 < p.TW; tx0 += 16) {
          const __mmask16 lanes = span_mask(0, p.TW - tx0);
          __m512 s[2][4];
          for (int a = 0; a < 2; ++a) {
            const float* row = rowbuf + (kOut * (ty - ch.ty0) + a) * width + 2 * tx0;
            const __m512 v0 = _mm512_loadu_ps(row), v1 = _mm512_loadu_ps(row + 16);
            const __m512 e0 = _mm512_permutex2var_ps(v0, even, v1), e1 = _mm512_permutex2var_ps(v0, odd, v1);
            s[a][0] = e0;
            s[a][1] = _mm512_add_ps(e0, e1);
            s[a][2] = _mm512_sub_ps(e0, e1);
            s[a][3] = _mm512_sub_ps(zero, e1);
          }
          __m512 r[kXi];
          for (int b = 0; b < 4; ++b) {  // then along each column
            r[0 * 4 + b] = s[0][b];
            r[1 * 4 + b] = _mm512_add_ps(s[0][b], s[1][b]);
            r[2 * 4 + b] = _mm512_sub_ps(s[0][b], s[1][b]);
            r[3 * 4 + b] = _mm512_sub_ps(zero, s[1][b]);
          }
          bad |= store_positions(gt + k * ld + t + tx0, xs, t + tx0 + 16 <= ld, lanes, r);
        }
      }
    }
  return bad == 0;
}

template <>
bool input_transform_adjoint<float>(const Problem& p, const float* dv, int64_t ld, int64_t xs, const Chunk& ch,
                                    float* gx, float* plane) {
  const int64_t wd = adjoint_width(p);
  __m512 sum = _mm512_setzero_ps();  // Inf or NaN once a value is (see input_transform<float>)
  const __m512 zero = _mm512_setzero_ps();
  // interleave two vectors of 16, (a0, b0, a1, b1, ...): the even and odd columns of a row
  const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  // [prev[15], v[0], ..., v[14]]: tile tx's columns 2 and 3 land on tile tx + 1's columns 0 and 1
  auto shift_in = [](__m512 v, __m512 prev) {
    return _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(v), _mm512_castps_si512(prev), 15));
  };
  for (int64_t n = ch.n0; n < ch.n1; ++n)
    for (int64_t c = 0; c < p.C; ++c) {
      // Rows 2 ty and 2 ty + 1 are first written by tile row ty - 1 (its rows i = 2, 3, stored
      // over every column the copy below reads), so only the first two rows need zeros.
      std::fill(plane, plane + 2 * wd, 0.0f);
      for (int64_t ty = 0; ty < p.TH; ++ty) {
        const float* d = dv + c * ld + ((n - ch.n0) * p.TH + ty) * p.TW;
        __m512 carry[4][2];  // the previous group's dd[i][2], dd[i][3] (its lane 15 spills over)
        for (int i = 0; i < 4; ++i) carry[i][0] = carry[i][1] = zero;
        for (int64_t tx0 = 0; tx0 < p.TW; tx0 += 16) {
          const __mmask16 lanes = span_mask(0, p.TW - tx0);  // lanes past the last tile load 0
          __m512 h[4][4];
          for (int b = 0; b < 4; ++b) {
            const __m512 q0 = _mm512_maskz_loadu_ps(lanes, d + (0 * 4 + b) * xs + tx0);
            const __m512 q1 = _mm512_maskz_loadu_ps(lanes, d + (1 * 4 + b) * xs + tx0);
            const __m512 q2 = _mm512_maskz_loadu_ps(lanes, d + (2 * 4 + b) * xs + tx0);
            const __m512 q3 = _mm512_maskz_loadu_ps(lanes, d + (3 * 4 + b) * xs + tx0);
            h[0][b] = q0;
            h[1][b] = _mm512_add_ps(_mm512_sub_ps(q1, q2), q3);
            h[2][b] = _mm512_sub_ps(_mm512_add_ps(q1, q2), q0);
            h[3][b] = _mm512_sub_ps(zero, q3);
          }
          for (int i = 0; i < 4; ++i) {
            const __m512 d0 = h[i][0], d1 = _mm512_add_ps(_mm512_sub_ps(h[i][1], h[i][2]), h[i][3]);
            const __m512 d2 = _mm512_sub_ps(_mm512_add_ps(h[i][1], h[i][2]), h[i][0]);
            const __m512 d3 = _mm512_sub_ps(zero, h[i][3]);
            const __m512 even = _mm512_add_ps(d0, shift_in(d2, carry[i][0]));
            const __m512 odd = _mm512_add_ps(d1, shift_in(d3, carry[i][1]));
            carry[i][0] = d2;
            carry[i][1] = d3;
            sum = _mm512_add_ps(sum, _mm512_add_ps(even, odd));
            __m512 v0 = _mm512_permutex2var_ps(even, lo, odd), v1 = _mm512_permutex2var_ps(even, hi, odd);
            float* row = plane + (kOut * ty + i) * wd + 2 * tx0;
            if (i < 2) {  // rows the tile row above started
              v0 = _mm512_add_ps(v0, _mm512_loadu_ps(row));
              v1 = _mm512_add_ps(v1, _mm512_loadu_ps(row + 16));
            }
            _mm512_storeu_ps(row, v0);
            _mm512_storeu_ps(row + 16, v1);
          }
        }
        if (p.TW % 16 == 0) {  // the last tile's overhang had no next lane to land in
          alignas(64) float c2[16], c3[16];
          for (int i = 0; i < 4; ++i) {
            sum = _mm512_add_ps(sum, _mm512_add_ps(carry[i][0], carry[i][1]));
            _mm512_store_ps(c2, carry[i][0]);
            _mm512_store_ps(c3, carry[i][1]);
            float* row = plane + (kOut * ty + i) * wd + 2 * p.TW;
            row[0] = (i < 2 ? row[0] : 0.0f) + c2[15];
            row[1] = (i < 2 ? row[1] : 0.0f) + c3[15];
          }
        }
      }
      float* out = gx + (n * p.C + c) * p.H * p.W;
      for (int64_t r = 0; r < p.H; ++r) std::copy_n(plane + (r + p.ph) * wd + p.pw, p.W, out + r * p.W);
    }
  const __m512 check = _mm512_sub_ps(sum, sum);
  return _mm512_cmp_ps_mask(check, check, _CMP_UNORD_Q) == 0;
}
#endif  // __AVX512F__

// Whether every value is finite (x - x is 0 for finite x and NaN for Inf or NaN).
template <class T>
bool all_finite(const T* v, int64_t n) {
  constexpr int64_t L = 16;  // independent lane sums, so that the loop vectorises
  T acc[L] = {};
  int64_t i = 0;
  for (; i + L <= n; i += L)
    for (int64_t l = 0; l < L; ++l) acc[l] += v[i + l] - v[i + l];
  for (; i < n; ++i) acc[0] += v[i] - v[i];
  for (int64_t l = 1; l < L; ++l) acc[0] += acc[l];
  return acc[0] == T(0);
}

// The transforms' row buffer: 4 (TW + 1) values for the generic ones, one output row in whole
// 32-value groups for output_transform<float>.
inline int64_t row_buffer_floats(const Problem& p) { return std::max(8 * (p.TW + 1), (p.TW + 15) / 16 * 32 + 32); }

// The distance between a chunk's 16 matrices of n values each: n rounded up to whole 4 KB
// pages plus one cache line, so that the 16 rows the transforms touch at once (one per matrix)
// fall in different L1 sets instead of all aliasing one 4 KB-strided set.
inline int64_t position_stride(int64_t n) { return (n + 1023) / 1024 * 1024 + 16; }

// One chunk of the convolution p: V = the input transform, the 16 products M[xi] = U[xi] V[xi]
// (on this thread's GEMM), out = the output transform (+ bias). v, m: the chunk's matrices (16
// each, position_stride apart); rows: the transforms' row buffer. False if a value is not finite.
template <class T>
bool forward_chunk(const Problem& p, const T* in, const Chunk& ch, const T* u, const T* bias, T* out, T* v, T* m,
                   T* rows) {
  const int64_t cols = ch.tiles(p);
  const int64_t vxs = position_stride(p.C * cols), mxs = position_stride(p.K * cols);
  if (!input_transform(p, in, ch, v, cols, vxs, rows)) return false;
  for (int64_t xi = 0; xi < kXi; ++xi)
    gemm(row_major(u + xi * p.K * p.C, p.K, p.C, p.C), row_major<const T>(v + xi * vxs, p.C, cols, cols),
         row_major(m + xi * mxs, p.K, cols, cols), false);
  return output_transform(p, m, cols, mxs, ch, bias, out, rows);
}

// The convolution, or false, with out partly written, if a transformed input or weight value is
// not finite: the transforms would turn an Inf into NaNs (Inf - Inf) where the direct kernel
// gives +-Inf, so the caller computes such convolutions directly instead.
template <class T>
bool run(const Problem& p, const T* in, const T* u, const T* bias, T* out,
         const std::function<void(int64_t, int64_t)>& samples_done) {
  if (!all_finite(u, kXi * p.K * p.C)) return false;
  const double flops = 2.0 * p.N * p.K * p.OH * p.OW * p.C * 9;
  const int nt = flops < 2e5 ? 1 : omp_get_max_threads();
  const std::vector<Chunk> chunks = make_chunks(p, nt);
  const int64_t nchunks = static_cast<int64_t>(chunks.size());
  int64_t max_cols = 0;
  for (const Chunk& c : chunks) max_cols = std::max(max_cols, c.tiles(p));
  const int64_t vsize = kXi * position_stride(p.C * max_cols), msize = kXi * position_stride(p.K * max_cols);
  int64_t max_tile_rows = 0;
  for (const Chunk& c : chunks) max_tile_rows = std::max(max_tile_rows, c.ty1 - c.ty0);
  const int64_t rsize = std::max(row_buffer_floats(p), padded_plane_floats(p, max_tile_rows));
  std::atomic<bool> finite{true};
  auto body = [&](const Chunk& ch) {
    if (!finite.load(std::memory_order_relaxed)) return;
    T* v = scratch<T>(static_cast<size_t>(vsize + msize + rsize));
    T* m = v + vsize;
    T* rows = m + msize;
    if (!forward_chunk(p, in, ch, u, bias, out, v, m, rows)) {
      finite.store(false, std::memory_order_relaxed);
      return;
    }
    if (samples_done && ch.whole_samples) samples_done(ch.n0, ch.n1);
  };
  if (nt > 1 && nchunks >= nt) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
    for (int64_t i = 0; i < nchunks; ++i) body(chunks[i]);
  } else {  // one chunk at a time; each product may use every thread
    for (const Chunk& ch : chunks) body(ch);
  }
  if (!finite.load()) return false;
  // samples cut into rows of tiles are final only now
  if (samples_done && nchunks > 0 && !chunks[0].whole_samples) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
    for (int64_t n = 0; n < p.N; ++n) samples_done(n, n + 1);
  }
  return true;
}

// The backward of the convolution p: dw [K, C, 3, 3] (null: not wanted), the sum over tiles of
// G^T (A dY A^T . B^T d B) G, and gx (null: not wanted), B (U^T A dY A^T) B^T over the forward's
// own tiles (input_transform_adjoint) with u the weight transform as C x K matrices
// (WeightLayout::Transposed). The output gradient
// is gy, or, when make_dy is set, made one sample at a time into a per-chunk buffer (never stored
// whole; make_dy must give the same values if called again, as the caller's fallback may). Per
// chunk: the output gradient's transform Gt = A dY A^T, shared by both gradients; for dw the
// input transform V and, per position, dU[xi] (K x C) += Gt[xi] (K x tiles) V[xi]^T; for gx
// dV[xi] (C x tiles) = U[xi]^T Gt[xi] and its adjoint transform. Each thread sums its own dU over
// a fixed, contiguous share of the chunks, and the shares are added in thread order: the result
// does not depend on timing. gx needs chunks of whole samples (however large), so a caller with
// samples larger than a chunk runs the input gradient as the "full" convolution of run instead.
// Returns false (outputs partly written) if a transformed value or a result is not finite.
template <class T>
bool run_backward(const Problem& p, const T* x, const T* gy, const std::function<void(int64_t, void*)>& make_dy,
                  T* dw, const T* u, T* gx) {
  const double flops = 2.0 * p.N * p.K * p.OH * p.OW * p.C * 9;
  const int nt = flops < 2e5 ? 1 : omp_get_max_threads();
  const bool generated = static_cast<bool>(make_dy);
  const std::vector<Chunk> chunks = make_chunks(p, nt, /*whole_samples_only=*/generated || gx);
  const int64_t nchunks = static_cast<int64_t>(chunks.size());
  for (const Chunk& c : chunks)  // input_transform_adjoint's precondition, checked outside the threads
    KILN_CHECK(!gx || (c.whole_samples && c.ty0 == 0 && c.ty1 == p.TH),
               "winograd run_backward: the input gradient got a chunk of part of a sample");
  int64_t max_cols = 0, max_tile_rows = 0, max_samples = 0;
  for (const Chunk& c : chunks) {
    max_cols = std::max(max_cols, c.tiles(p));
    max_tile_rows = std::max(max_tile_rows, c.ty1 - c.ty0);
    max_samples = std::max(max_samples, c.n1 - c.n0);
  }
  const int64_t OHW = p.OH * p.OW;
  const int64_t vsize = kXi * position_stride(p.C * max_cols);  // V for dw, then dV for gx
  const int64_t gsize = kXi * position_stride(p.K * max_cols);
  const int64_t rsize = std::max({row_buffer_floats(p), padded_plane_floats(p, max_tile_rows),
                                  kOut * max_tile_rows * ((p.TW + 15) / 16 * 32), gx ? adjoint_plane_floats(p) : 0});
  const int64_t dysize = generated ? max_samples * p.K * OHW : 0;
  const int64_t usize = dw ? kXi * p.K * p.C : 0;
  const bool split = nt > 1 && nchunks >= nt;
  const int parts = split ? nt : 1;
  std::vector<T*> du(parts, nullptr);  // each part's dU, in its thread's scratch
  std::atomic<bool> finite{true};
  auto fail = [&] { finite.store(false, std::memory_order_relaxed); };
  auto part = [&](int t, int64_t c0, int64_t c1) {
    T* v = scratch<T>(static_cast<size_t>(vsize + gsize + rsize + dysize + usize));
    T* gt = v + vsize;
    T* rows = gt + gsize;
    T* dyb = rows + rsize;
    T* dus = dyb + dysize;
    du[t] = dus;
    for (int64_t i = c0; i < c1 && finite.load(std::memory_order_relaxed); ++i) {
      // the chunk's operands, indexed from its first sample
      Chunk ch = chunks[i];
      const T* xc = x ? x + ch.n0 * p.C * p.H * p.W : nullptr;
      const T* gyc = gy ? gy + ch.n0 * p.K * OHW : dyb;
      if (generated)  // the chunk's samples' gradients
        for (int64_t n = ch.n0; n < ch.n1; ++n) make_dy(n, dyb + (n - ch.n0) * p.K * OHW);
      ch = {0, ch.n1 - ch.n0, ch.ty0, ch.ty1, ch.whole_samples};
      const int64_t cols = ch.tiles(p);
      const int64_t vxs = position_stride(p.C * cols), gxs = position_stride(p.K * cols);
      if (!grad_transform(p, gyc, ch, gt, cols, gxs, rows)) return fail();
      if (dw) {
        if (!input_transform(p, xc, ch, v, cols, vxs, rows)) return fail();
        for (int64_t xi = 0; xi < kXi; ++xi)
          gemm(row_major<const T>(gt + xi * gxs, p.K, cols, cols), row_major<const T>(v + xi * vxs, p.C, cols, cols).t(),
               row_major(dus + xi * p.K * p.C, p.K, p.C, p.C), i > c0);
      }
      if (gx) {
        for (int64_t xi = 0; xi < kXi; ++xi)
          gemm(row_major(u + xi * p.K * p.C, p.C, p.K, p.K), row_major<const T>(gt + xi * gxs, p.K, cols, cols),
               row_major(v + xi * vxs, p.C, cols, cols), false);
        if (!input_transform_adjoint(p, v, cols, vxs, ch, gx + chunks[i].n0 * p.C * p.H * p.W, rows)) return fail();
      }
    }
    if (dw && c1 == c0) std::fill(dus, dus + usize, T(0));
  };
  if (split) {
#pragma omp parallel num_threads(nt)
    {
      const int t = omp_get_thread_num(), n = omp_get_num_threads();
      part(t, nchunks * t / n, nchunks * (t + 1) / n);
    }
  } else {
    part(0, 0, nchunks);
  }
  if (!finite.load()) return false;
  if (!dw) return true;
  // dw = G^T (sum of the parts' dU) G, G^T q = [q0 + (q1 + q2) / 2, (q1 - q2) / 2, (q1 + q2) / 2 + q3],
  // for 16 (k, c) pairs at a time: whole-vector reads of the 16 matrices (one value at a time
  // from 16 streams a multiple of 4 KB apart was 3% of a ResNet-18 step), lane loops that vectorise
  const int64_t KC = p.K * p.C;
  constexpr int64_t L = 16;
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t kc0 = 0; kc0 < KC; kc0 += L) {
    const int64_t lanes = std::min(L, KC - kc0);
    T q[kXi][L] = {};
    for (int t = 0; t < parts; ++t)
      for (int xi = 0; xi < kXi; ++xi) {
        const T* src = du[t] + xi * KC + kc0;
        if (lanes == L) {
          for (int64_t l = 0; l < L; ++l) q[xi][l] += src[l];
        } else {
          for (int64_t l = 0; l < lanes; ++l) q[xi][l] += src[l];
        }
      }
    T o[9][L];
    for (int64_t l = 0; l < L; ++l) {
      T h[3][4];  // G^T along the first index
      for (int b = 0; b < 4; ++b) {
        h[0][b] = q[b][l] + T(0.5) * (q[4 + b][l] + q[8 + b][l]);
        h[1][b] = T(0.5) * (q[4 + b][l] - q[8 + b][l]);
        h[2][b] = T(0.5) * (q[4 + b][l] + q[8 + b][l]) + q[12 + b][l];
      }
      for (int i = 0; i < 3; ++i) {
        o[i * 3 + 0][l] = h[i][0] + T(0.5) * (h[i][1] + h[i][2]);
        o[i * 3 + 1][l] = T(0.5) * (h[i][1] - h[i][2]);
        o[i * 3 + 2][l] = T(0.5) * (h[i][1] + h[i][2]) + h[i][3];
      }
    }
    for (int64_t l = 0; l < lanes; ++l)
      for (int tap = 0; tap < 9; ++tap) dw[(kc0 + l) * 9 + tap] = o[tap][l];
  }
  // finite operands, yet an overflowed product or sum: the direct kernel decides what it is
  return all_finite(dw, KC * 9);
}

// The forward's problem, and the input gradient's: gy correlated with the flipped, transposed
// weight, padded by 2 - p (a "full" convolution where the forward was "valid", "same" where it
// was "same").
Problem forward_problem(const ConvGeometry& g) { return Problem(g.N, g.C, g.H, g.W, g.K, g.OH, g.OW, g.ph, g.pw); }
Problem input_grad_problem(const ConvGeometry& g) {
  return Problem(g.N, g.K, g.OH, g.OW, g.C, g.H, g.W, 2 - g.ph, 2 - g.pw);
}

}  // namespace

bool winograd_geometry(const ConvGeometry& g) {
  return !g.channels_last && g.kh == 3 && g.kw == 3 && g.sh == 1 && g.sw == 1 && g.dh == 1 && g.dw == 1 &&
         g.groups == 1 && g.ph >= 0 && g.ph <= 2 && g.pw >= 0 && g.pw <= 2 && g.OH == g.H + 2 * g.ph - 2 &&
         g.OW == g.W + 2 * g.pw - 2 && g.OH > 0 && g.OW > 0;
}

bool winograd_applies(const ConvGeometry& g, DType dt) {
  // Few channels make short products whose cost the transforms dominate (measured in
  // bench_conv_lab: the CNN's 1-channel first layer is faster direct).
  return dt == DType::F32 && winograd_switch().load(std::memory_order_relaxed) && winograd_geometry(g) &&
         g.C >= 16 && g.K >= 16;
}

namespace {

// Whether a whole sample's tiles fit one chunk: the input gradient through the forward's tiles
// (run_backward with gx) needs chunks of whole samples.
bool samples_fit_chunk(const Problem& p) { return p.TH * p.TW <= tiles_per_chunk(p); }

// The weights transformed into C x K matrices (WeightLayout::Transposed) for run_backward's input
// gradient, in this thread's weight scratch; null if a transformed value is not finite.
template <class T>
const T* adjoint_weights(const T* w, const ConvGeometry& g) {
  T* u = weight_scratch<T>(static_cast<size_t>(kXi * g.K * g.C));
  transform_weights(w, g.K, g.C, WeightLayout::Transposed, u);
  return all_finite(u, kXi * g.K * g.C) ? u : nullptr;
}

}  // namespace

template <class T>
bool winograd_forward(const T* x, const T* w, const T* bias, T* out, const ConvGeometry& g,
                      const std::function<void(int64_t, int64_t)>& samples_done) {
  KILN_CHECK(winograd_geometry(g), "winograd_forward: not a 3x3 stride-1 NCHW convolution");
  const Problem p = forward_problem(g);
  T* u = weight_scratch<T>(static_cast<size_t>(kXi * g.K * g.C));
  transform_weights(w, g.K, g.C, WeightLayout::Forward, u);
  return run(p, x, u, bias, out, samples_done);
}

template <class T>
bool winograd_backward_input(const T* gy, const T* w, T* gx, const ConvGeometry& g) {
  KILN_CHECK(winograd_geometry(g), "winograd_backward_input: not a 3x3 stride-1 NCHW convolution");
  const Problem pf = forward_problem(g);
  if (samples_fit_chunk(pf)) {  // through the forward's tiles
    const T* u = adjoint_weights(w, g);
    return u && run_backward(pf, static_cast<const T*>(nullptr), gy, {}, static_cast<T*>(nullptr), u, gx);
  }
  T* u = weight_scratch<T>(static_cast<size_t>(kXi * g.K * g.C));
  transform_weights(w, g.K, g.C, WeightLayout::FlippedTransposed, u);
  return run(input_grad_problem(g), gy, u, static_cast<const T*>(nullptr), gx, {});
}

template <class T>
bool winograd_backward_weight(const T* x, const T* gy, T* dw, const ConvGeometry& g) {
  KILN_CHECK(winograd_geometry(g), "winograd_backward_weight: not a 3x3 stride-1 NCHW convolution");
  const Problem p = forward_problem(g);
  return run_backward(p, x, gy, {}, dw, static_cast<const T*>(nullptr), static_cast<T*>(nullptr));
}

template <class T>
bool winograd_backward_both(const T* x, const T* gy, const T* w, T* gx, T* dw, const ConvGeometry& g) {
  KILN_CHECK(winograd_geometry(g), "winograd_backward_both: not a 3x3 stride-1 NCHW convolution");
  const Problem p = forward_problem(g);
  if (!samples_fit_chunk(p)) return false;
  const T* u = adjoint_weights(w, g);
  return u && run_backward(p, x, gy, {}, dw, u, gx);
}

template <class T>
bool winograd_backward_generated(const T* x, const T* w, T* gx, T* dw, const ConvGeometry& g,
                                 const std::function<void(int64_t, void*)>& make_dy) {
  KILN_CHECK(winograd_geometry(g), "winograd_backward_generated: not a 3x3 stride-1 NCHW convolution");
  const T* u = gx ? adjoint_weights(w, g) : nullptr;  // the input gradient runs through the forward's tiles
  if (gx && !u) return false;
  return run_backward(forward_problem(g), x, static_cast<const T*>(nullptr), make_dy, dw, u, gx);
}

template bool winograd_forward<float>(const float*, const float*, const float*, float*, const ConvGeometry&,
                                      const std::function<void(int64_t, int64_t)>&);
template bool winograd_forward<double>(const double*, const double*, const double*, double*, const ConvGeometry&,
                                       const std::function<void(int64_t, int64_t)>&);
template bool winograd_backward_input<float>(const float*, const float*, float*, const ConvGeometry&);
template bool winograd_backward_input<double>(const double*, const double*, double*, const ConvGeometry&);
template bool winograd_backward_weight<float>(const float*, const float*, float*, const ConvGeometry&);
template bool winograd_backward_weight<double>(const double*, const double*, double*, const ConvGeometry&);
template bool winograd_backward_both<float>(const float*, const float*, const float*, float*, float*,
                                           const ConvGeometry&);
template bool winograd_backward_both<double>(const double*, const double*, const double*, double*, double*,
                                            const ConvGeometry&);
template bool winograd_backward_generated<float>(const float*, const float*, float*, float*, const ConvGeometry&,
                                                 const std::function<void(int64_t, void*)>&);
template bool winograd_backward_generated<double>(const double*, const double*, double*, double*,
                                                  const ConvGeometry&, const std::function<void(int64_t, void*)>&);

}  // namespace kiln::kernels::cpu

namespace kiln {

void set_cpu_conv_winograd(bool enabled) { kernels::cpu::winograd_switch() = enabled; }
bool cpu_conv_winograd() { return kernels::cpu::winograd_switch(); }

}  // namespace kiln
