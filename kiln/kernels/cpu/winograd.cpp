// Winograd convolution on the CPU, F(2x2, 3x3) and F(4x4, 3x3) (kernels/cpu/winograd.h;
// docs/kernels.md, "Winograd convolution"; the tiles' transforms are in winograd_tiles.h).
//
// An m x m output tile takes an alpha x alpha input tile d (alpha = m + 2) and
//   Y = A^T [ sum_c (G g_kc G^T) . (B^T d_c B) ] A,
// and the sum over input channels, for each of the alpha^2 positions xi of the transformed tile,
// is a matrix product: M[xi] (K x tiles) = U[xi] (K x C) V[xi] (C x tiles). F(2, 3) makes 16
// such products of K*C*tiles where the direct kernel makes 36 per 2x2 tile (2.25x fewer);
// F(4, 3) 36 where it makes 144 per 4x4 tile (4x fewer), but pads planes to multiples of 4.
// winograd_tile picks the one with fewer products for the plane.
//
// The weight gradient runs the forward's transforms adjoint, and so does the input gradient when
// whole samples fit a chunk (run_backward: the output gradient transformed once, A dY A^T, for
// both); otherwise the input gradient is the forward's computation on the output gradient with
// the weight rotated and transposed (run on input_grad_problem). The work is cut into chunks of
// tiles (whole samples, or rows of tiles of one sample when a sample has many) of ~4 MB of V and
// M, so that each product's slices stay in L2; chunks are spread over threads, each running its
// products single-threaded.
#include "kiln/kernels/cpu/winograd.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "kiln/core/cpu_conv.h"
#include "kiln/kernels/cpu_conv_settings.h"
#include "kiln/core/error.h"
#include "kiln/kernels/cpu/gemm.h"
#include "kiln/kernels/cpu/winograd_tiles.h"
#if defined(__AVX2__) && defined(__FMA__)
#include "kiln/kernels/cpu/winograd_lanes.h"
#endif

namespace kiln::kernels::cpu {

namespace {

using winograd::F2;
using winograd::F4;
using winograd::nest;

using cpu_conv::winograd_switch;

// A 3x3 stride-1 correlation with zero padding, in [N, C, H, W] -> out [N, K, OH, OW], cut into
// the tiles of F.
template <class F> struct Problem {
  int64_t N, C, H, W, K, OH, OW, ph, pw;
  int64_t TH, TW;  // tiles per column and row of an output plane
  Problem(int64_t N_, int64_t C_, int64_t H_, int64_t W_, int64_t K_, int64_t OH_, int64_t OW_, int64_t ph_,
          int64_t pw_)
      : N(N_),
        C(C_),
        H(H_),
        W(W_),
        K(K_),
        OH(OH_),
        OW(OW_),
        ph(ph_),
        pw(pw_),
        TH((OH_ + F::m - 1) / F::m),
        TW((OW_ + F::m - 1) / F::m) {}
};

// A chunk of tiles: samples [n0, n1), tile rows [ty0, ty1) of each. Tile (n, ty, tx) is column
// ((n - n0) * (ty1 - ty0) + ty - ty0) * TW + tx of the chunk's matrices.
struct Chunk {
  int64_t n0, n1, ty0, ty1;
  bool whole_samples;
  template <class F> int64_t tiles(const Problem<F>& p) const { return (n1 - n0) * (ty1 - ty0) * p.TW; }
};

// Tiles per chunk: V (xi x C x tiles) and M (xi x K x tiles) floats within ~4 MB, which is more
// than the 2 MB L2 but measured faster than smaller chunks on ResNet's shapes (larger products;
// each product's own slices of V and M do fit), at least 32 columns so that the products fill
// the micro-kernel's 32-wide panels, and at least two chunks per thread when the batch allows.
// (4 MB was also measured against 16 MB for the weight gradient, whose inner dimension the
// chunk is: 16 MB was 1.2-1.7x slower on the 28x28 to 7x7 layers.)
template <class F> int64_t tiles_per_chunk(const Problem<F>& p) {
  return std::max<int64_t>(32, (int64_t(1) << 22) / (F::xi * 4 * (p.C + p.K)));
}
// whole_samples_only: never rows of tiles, at least one sample per chunk however large (the
// generated backward makes its output gradient one sample at a time).
template <class F> std::vector<Chunk> make_chunks(const Problem<F>& p, int nt, bool whole_samples_only = false) {
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
// again. Slot 0: a chunk's matrices; slot 1: the calling thread's U, read by every worker. The
// start is cache-line aligned, and callers cut it into parts of whole cache lines (lines): the
// GEMMs' rows then start on a line, which measured up to 1.5x faster (the weight gradient's
// accumulation into dU on ResNet-18's 4x4 layer) than whatever offset the parts happened to have.
template <class T, int Slot = 0> T* scratch(size_t n) {
  constexpr size_t line = 64 / sizeof(T);
  thread_local std::vector<T> buf;
  if (buf.size() < n + line) buf.resize(n + line);
  const uintptr_t at = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + (line - at / sizeof(T) % line) % line;
}
// n values rounded up to whole cache lines.
template <class T> constexpr int64_t lines(int64_t n) {
  constexpr int64_t line = 64 / sizeof(T);
  return (n + line - 1) / line * line;
}
template <class T> T* weight_scratch(size_t n) { return scratch<T, 1>(n); }

// Which matrices transform_weights makes from w [K, C, 3, 3]: U[xi] = (G w[k][c] G^T)[xi] as
// K x C (Forward) or C x K (Transposed: the input gradient through the forward's tiles, U^T
// Gt, without transposing in the GEMM), or the "full" convolution's C x K matrices of the 180
// degree rotated filters (FlippedTransposed: the input gradient as a convolution of gy).
enum class WeightLayout { Forward, Transposed, FlippedTransposed };

// U[xi][ko][ci] = (G g G^T)[xi] of the 3x3 filter g that maps channel ci to channel ko, into u
// (xi * KO * CI values), for the layouts above.
template <class F, class T> void transform_weights(const T* w, int64_t K, int64_t C, WeightLayout layout, T* u) {
  const bool swap = layout != WeightLayout::Forward, flip = layout == WeightLayout::FlippedTransposed;
  const int64_t KO = swap ? C : K, CI = swap ? K : C, plane = KO * CI;
  // filter (ko, ci) starts at w + ko * kos + ci * cis
  const int64_t kos = swap ? 9 : 9 * C, cis = swap ? 9 * C : 9;
  auto g = [](const auto& in, auto& out) { F::g(in, out); };
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
        __m512 t[3][3], r[F::alpha][F::alpha];
        for (int i = 0; i < 3; ++i)
          for (int j = 0; j < 3; ++j) {
            const int tap = flip ? (2 - i) * 3 + (2 - j) : i * 3 + j;
            t[i][j] = _mm512_i32gather_ps(lane, f + tap, 4);
          }
        nest(t, r, g);
        for (int a = 0; a < F::alpha; ++a)
          for (int b = 0; b < F::alpha; ++b) _mm512_storeu_ps(u + (a * F::alpha + b) * plane + ko * CI + ci, r[a][b]);
      }
    }
#endif
    for (; ci < CI; ++ci) {
      const T* f = w + ko * kos + ci * cis;
      T t[3][3], r[F::alpha][F::alpha];
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) t[i][j] = flip ? f[(2 - i) * 3 + (2 - j)] : f[i * 3 + j];
      nest(t, r, g);
      for (int a = 0; a < F::alpha; ++a)
        for (int b = 0; b < F::alpha; ++b) u[(a * F::alpha + b) * plane + ko * CI + ci] = r[a][b];
    }
  }
}

// The zero-bordered copy of a chunk's input rows that the input transforms read: row i holds
// input row m * ty0 - ph + i from column -pw on, wide enough for whole vectors of 16 tiles (16 m
// columns, and the alpha - m more the last tile reads, read as another 16).
template <class F> inline int64_t padded_width(const Problem<F>& p) { return (p.TW + 15) / 16 * 16 * F::m + 16 + F::m; }
template <class F> inline int64_t padded_plane_floats(const Problem<F>& p, int64_t tile_rows) {
  return (F::m * tile_rows + F::alpha - F::m) * padded_width(p);
}
template <class F, class T> void pad_rows(const Problem<F>& p, const T* plane, int64_t ty0, int64_t tile_rows, T* buf) {
  const int64_t wd = padded_width(p), rows = F::m * tile_rows + F::alpha - F::m;
  for (int64_t i = 0; i < rows; ++i) {
    T* dst = buf + i * wd;
    const int64_t r = F::m * ty0 - p.ph + i;
    if (r < 0 || r >= p.H) {
      std::fill(dst, dst + wd, T(0));
      continue;
    }
    std::fill(dst, dst + p.pw, T(0));
    std::copy_n(plane + r * p.W, p.W, dst + p.pw);
    std::fill(dst + p.pw + p.W, dst + wd, T(0));
  }
}

// The output gradient's zero-padded rows for grad_transform: m rows per tile row, each as wide
// as whole vectors of 16 tiles.
template <class F> inline int64_t grad_width(const Problem<F>& p) { return (p.TW + 15) / 16 * 16 * F::m; }

// The input gradient's plane buffer (input_transform_adjoint): rows 0 .. m TH + alpha - m - 1 of
// the tiles' input region (input row r - ph), each from column -pw on and wide enough for whole
// stores of every group of 16 tiles plus the last tile's overhang.
template <class F> inline int64_t adjoint_width(const Problem<F>& p) { return (p.TW + 15) / 16 * 16 * F::m + 16; }
template <class F> inline int64_t adjoint_plane_floats(const Problem<F>& p) {
  return (F::m * p.TH + F::alpha - F::m) * adjoint_width(p);
}

// Whether x is finite (x - x is 0 for finite x and NaN for Inf or NaN).
template <class T> inline bool finite_value(T x) { return x - x == T(0); }

// V[xi][c][t] = (B^T d B)[xi] for every tile t of the chunk and channel c (ld = the chunk's
// tiles, xs = the distance between positions). Returns false if a value is not finite.
template <class F, class T>
bool input_transform(const Problem<F>& p, const T* in, const Chunk& ch, T* v, int64_t ld, int64_t xs, T* buf) {
  bool finite = true;
  const int64_t wd = padded_width(p);
  auto bt = [](const auto& d, auto& o) { F::bt(d, o); };
  for (int64_t n = ch.n0; n < ch.n1; ++n)
    for (int64_t c = 0; c < p.C; ++c) {
      pad_rows(p, in + (n * p.C + c) * p.H * p.W, ch.ty0, ch.ty1 - ch.ty0, buf);
      for (int64_t ty = ch.ty0; ty < ch.ty1; ++ty) {
        T* vt = v + c * ld + ((n - ch.n0) * (ch.ty1 - ch.ty0) + ty - ch.ty0) * p.TW;
        const T* rows = buf + F::m * (ty - ch.ty0) * wd;
        for (int64_t tx = 0; tx < p.TW; ++tx) {
          T d[F::alpha][F::alpha], r[F::alpha][F::alpha];
          for (int i = 0; i < F::alpha; ++i)
            for (int j = 0; j < F::alpha; ++j) d[i][j] = rows[i * wd + F::m * tx + j];
          nest(d, r, bt);
          for (int a = 0; a < F::alpha; ++a)
            for (int b = 0; b < F::alpha; ++b) {
              vt[(a * F::alpha + b) * xs + tx] = r[a][b];
              finite = finite && finite_value(r[a][b]);
            }
        }
      }
    }
  return finite;
}

// out tiles = A^T M[.][k][t] A (+ bias[k]), clipped to the plane where the tiles overhang it.
// Returns false if an output is not finite: with finite transformed operands, only a product or
// sum that overflowed, where the direct kernel might give +-Inf rather than NaN.
template <class F, class T>
bool output_transform(const Problem<F>& p, const T* m, int64_t ld, int64_t xs, const Chunk& ch, const T* bias, T* out,
                      T*) {
  T check = T(0);
  auto at = [](const auto& q, auto& o) { F::at(q, o); };
  for (int64_t k = 0; k < p.K; ++k) {
    const T b = bias ? bias[k] : T(0);
    for (int64_t n = ch.n0; n < ch.n1; ++n) {
      T* plane = out + (n * p.K + k) * p.OH * p.OW;
      for (int64_t ty = ch.ty0; ty < ch.ty1; ++ty) {
        const T* mt = m + k * ld + ((n - ch.n0) * (ch.ty1 - ch.ty0) + ty - ch.ty0) * p.TW;
        for (int64_t tx = 0; tx < p.TW; ++tx) {
          T q[F::alpha][F::alpha], y[F::m][F::m];
          for (int a = 0; a < F::alpha; ++a)
            for (int c = 0; c < F::alpha; ++c) q[a][c] = mt[(a * F::alpha + c) * xs + tx];
          nest(q, y, at);
          for (int i = 0; i < F::m; ++i)
            for (int j = 0; j < F::m; ++j) {
              const int64_t r = F::m * ty + i, col = F::m * tx + j;
              if (r >= p.OH || col >= p.OW) continue;
              const T o = y[i][j] + b;
              check += o - o;
              plane[r * p.OW + col] = o;
            }
        }
      }
    }
  }
  return check == T(0);
}

// The weight gradient's transform of the output gradient, the adjoint of output_transform:
// Gt[.][k][t] = A dY A^T for each m x m tile dY of gy (zero where the tile overhangs the plane).
// Returns false if a value is not finite.
template <class F, class T>
bool grad_transform(const Problem<F>& p, const T* gy, const Chunk& ch, T* gt, int64_t ld, int64_t xs, T*) {
  bool finite = true;
  auto a = [](const auto& e, auto& o) { F::a(e, o); };
  for (int64_t k = 0; k < p.K; ++k)
    for (int64_t n = ch.n0; n < ch.n1; ++n) {
      const T* plane = gy + (n * p.K + k) * p.OH * p.OW;
      for (int64_t ty = ch.ty0; ty < ch.ty1; ++ty) {
        T* g = gt + k * ld + ((n - ch.n0) * (ch.ty1 - ch.ty0) + ty - ch.ty0) * p.TW;
        for (int64_t tx = 0; tx < p.TW; ++tx) {
          T e[F::m][F::m], r[F::alpha][F::alpha];
          for (int i = 0; i < F::m; ++i)
            for (int j = 0; j < F::m; ++j) {
              const int64_t row = F::m * ty + i, col = F::m * tx + j;
              e[i][j] = row < p.OH && col < p.OW ? plane[row * p.OW + col] : T(0);
            }
          nest(e, r, a);
          for (int i = 0; i < F::alpha; ++i)
            for (int j = 0; j < F::alpha; ++j) {
              g[(i * F::alpha + j) * xs + tx] = r[i][j];
              finite = finite && finite_value(r[i][j]);
            }
        }
      }
    }
  return finite;
}

// The input gradient through the forward's own tiles, the adjoint of input_transform: each
// tile's values dv[xi] (C x tiles, laid out as V) go back through B, dd = B dv B^T, and
// neighbouring tiles, which overlap by alpha - m = 2 rows and columns, add up in the plane. So
// the output gradient is transformed once (A dY A^T, shared with the weight gradient) instead of
// again through B^T as the input of a "full" convolution. Whole samples only (another chunk's
// tiles would add into the same rows); gx's planes of the chunk's samples are overwritten;
// plane: adjoint_plane_floats scratch. Returns false if a value is not finite.
template <class F, class T>
bool input_transform_adjoint(const Problem<F>& p, const T* dv, int64_t ld, int64_t xs, const Chunk& ch, T* gx,
                             T* plane) {
  const int64_t wd = adjoint_width(p), rows = F::m * p.TH + F::alpha - F::m;
  auto b = [](const auto& q, auto& o) { F::b(q, o); };
  T check = T(0);
  for (int64_t n = ch.n0; n < ch.n1; ++n)
    for (int64_t c = 0; c < p.C; ++c) {
      std::fill(plane, plane + rows * wd, T(0));
      for (int64_t ty = 0; ty < p.TH; ++ty)
        for (int64_t tx = 0; tx < p.TW; ++tx) {
          const T* d = dv + c * ld + ((n - ch.n0) * p.TH + ty) * p.TW + tx;
          T q[F::alpha][F::alpha], dd[F::alpha][F::alpha];
          for (int i = 0; i < F::alpha; ++i)
            for (int j = 0; j < F::alpha; ++j) q[i][j] = d[(i * F::alpha + j) * xs];
          nest(q, dd, b);
          for (int i = 0; i < F::alpha; ++i) {
            T* row = plane + (F::m * ty + i) * wd + F::m * tx;
            for (int j = 0; j < F::alpha; ++j) row[j] += dd[i][j];
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

#if defined(KILN_WINOGRAD_ROW_LANES)
// The f32 transforms, vectorised along a row of tiles: lane l of each vector is tile tx0 + l
// (L = 16 tiles at AVX-512, 8 at AVX2; a plane narrower than L tiles leaves lanes idle, which
// the products' cost at such planes' channel counts dwarfs). A tile's m columns are m-strided in
// the row, so rows are split into their m column phases (deinterleave) and put back
// (interleave). Written once over winograd::RowLanes, the level's vector trait.
using RL = winograd::RowLanes;
using Vec = RL::V;
constexpr int kL = RL::L;

// Whether a sum of values is finite (not Inf or NaN; a sum that overflows counts as not finite:
// then the convolution is only computed directly, never wrong). sum - sum is NaN exactly then.
inline bool finite_sum(Vec sum, int64_t lanes = kL) { return !RL::any_nan(sum - sum, lanes); }

// Stores the transformed positions of a row of up to L tiles, position xi at out + xi * xs, and
// returns whether the first `lanes` lanes are finite. Whole vectors when `room`: the lanes past
// the row's last tile land on tiles of the same channel that the caller writes later; only the
// first `lanes` at the end of a channel's row.
template <int XI> inline bool store_positions(float* out, int64_t xs, bool room, int64_t lanes, const Vec (&v)[XI]) {
  Vec sum = RL::zero();
  for (int xi = 0; xi < XI; ++xi) {
    if (room) RL::store(out + xi * xs, v[xi]);
    else RL::store_first(out + xi * xs, lanes, v[xi]);
    sum = sum + v[xi];
  }
  return finite_sum(sum, lanes);
}

// The same for positions held as an alpha x alpha tile (position a * alpha + b).
template <int A> inline bool store_positions(float* out, int64_t xs, bool room, int64_t lanes, const Vec (&v)[A][A]) {
  Vec flat[A * A];
  for (int a = 0; a < A; ++a)
    for (int b = 0; b < A; ++b) flat[a * A + b] = v[a][b];
  return store_positions<A * A>(out, xs, room, lanes, flat);
}

template <class F>
bool input_transform_f32(const Problem<F>& p, const float* in, const Chunk& ch, float* v, int64_t ld, int64_t xs,
                         float* buf) {
  constexpr int M = F::m, A = F::alpha;
  bool finite = true;
  // Each plane is first copied into a zero-bordered buffer, so that the loads below are whole,
  // unmasked vectors: masked loads that start before a row cost several times more on AMD's
  // cores.
  const int64_t wd = padded_width(p);
  for (int64_t n = ch.n0; n < ch.n1; ++n)
    for (int64_t c = 0; c < p.C; ++c) {
      pad_rows(p, in + (n * p.C + c) * p.H * p.W, ch.ty0, ch.ty1 - ch.ty0, buf);
      for (int64_t ty = ch.ty0; ty < ch.ty1; ++ty) {
        const int64_t t = ((n - ch.n0) * (ch.ty1 - ch.ty0) + ty - ch.ty0) * p.TW;
        float* vt = v + c * ld + t;
        for (int64_t tx0 = 0; tx0 < p.TW; tx0 += kL) {
          Vec s[A][A];  // B^T along each row: s[i][b]
          for (int i = 0; i < A; ++i) {
            const float* row = buf + (M * (ty - ch.ty0) + i) * wd + M * tx0;
            Vec d[A], lead[M], tail[M];
            RL::deinterleave<M>(row, lead);      // columns 0 .. m - 1 of each tile
            RL::deinterleave<M>(row + M, tail);  // and m .. alpha - 1, the next tile's first ones
            for (int j = 0; j < M; ++j) d[j] = lead[j];
            for (int j = M; j < A; ++j) d[j] = tail[j - M];
            F::bt(d, s[i]);
          }
          Vec r[A * A];
          for (int b = 0; b < A; ++b) {  // then along each column
            Vec col[A], o[A];
            for (int i = 0; i < A; ++i) col[i] = s[i][b];
            F::bt(col, o);
            for (int a = 0; a < A; ++a) r[a * A + b] = o[a];
          }
          finite &= store_positions<A * A>(vt + tx0, xs, t + tx0 + kL <= ld, p.TW - tx0, r);
        }
      }
    }
  return finite;
}

template <class F>
bool output_transform_f32(const Problem<F>& p, const float* m, int64_t ld, int64_t xs, const Chunk& ch,
                          const float* bias, float* out) {
  constexpr int M = F::m, A = F::alpha;
  Vec sum = RL::zero();  // Inf or NaN once an output is
  // The rows a chunk writes end at end_row: whole-vector stores that spill past a row's end land
  // on the next rows, which are written after it (by this tile row, or later ones of the chunk),
  // but must not pass end_row, where another thread's chunk may already have written. With more
  // than one group of L tiles per row, a later group's spill would land on rows an earlier group
  // has written, so stores are then whole only inside the row.
  const int64_t end_row = std::min(M * ch.ty1, p.OH);
  const bool one_group = p.TW <= kL;
  for (int64_t k = 0; k < p.K; ++k) {
    const Vec bv = RL::set1(bias ? bias[k] : 0.0f);
    for (int64_t n = ch.n0; n < ch.n1; ++n) {
      float* plane = out + (n * p.K + k) * p.OH * p.OW;
      for (int64_t ty = ch.ty0; ty < ch.ty1; ++ty) {
        const float* mt = m + k * ld + ((n - ch.n0) * (ch.ty1 - ch.ty0) + ty - ch.ty0) * p.TW;
        const int64_t r = M * ty;
        for (int64_t tx0 = 0; tx0 < p.TW; tx0 += kL) {
          const int64_t lanes = p.TW - tx0;
          Vec q[M][A];  // A^T along each column
          for (int b = 0; b < A; ++b) {
            Vec col[A], o[M];
            for (int i = 0; i < A; ++i) col[i] = RL::load_first(mt + (i * A + b) * xs + tx0, lanes);
            F::at(col, o);
            for (int a = 0; a < M; ++a) q[a][b] = o[a];
          }
          for (int a = 0; a < M && r + a < p.OH; ++a) {
            Vec y[M], v[M];
            F::at(q[a], y);
            for (int j = 0; j < M; ++j) {
              y[j] = y[j] + bv;
              sum = sum + y[j];
            }
            RL::interleave<M>(y, v);
            for (int j = 0; j < M; ++j) {
              const int64_t col = M * tx0 + kL * j, at = (r + a) * p.OW + col;
              if (col + kL <= p.OW || (one_group && at + kL <= end_row * p.OW)) {
                RL::store(plane + at, v[j]);
              } else if (col < p.OW) {
                RL::store_first(plane + at, p.OW - col, v[j]);
              }
            }
          }
        }
      }
    }
  }
  return finite_sum(sum);
}

template <class F>
bool grad_transform_f32(const Problem<F>& p, const float* gy, const Chunk& ch, float* gt, int64_t ld, int64_t xs,
                        float* buf) {
  constexpr int M = F::m, A = F::alpha;
  bool finite = true;
  // the chunk's rows of each plane, zero-padded to whole tiles and whole vectors (see
  // input_transform_f32 on masked loads)
  const int64_t width = grad_width(p), rows = M * (ch.ty1 - ch.ty0);
  for (int64_t n = ch.n0; n < ch.n1; ++n)
    for (int64_t k = 0; k < p.K; ++k) {
      const float* plane = gy + (n * p.K + k) * p.OH * p.OW;
      for (int64_t i = 0; i < rows; ++i) {
        float* dst = buf + i * width;
        const int64_t r = M * ch.ty0 + i;
        if (r >= p.OH) {
          std::fill(dst, dst + width, 0.0f);
          continue;
        }
        std::copy_n(plane + r * p.OW, p.OW, dst);
        std::fill(dst + p.OW, dst + width, 0.0f);
      }
      for (int64_t ty = ch.ty0; ty < ch.ty1; ++ty) {
        const int64_t t = ((n - ch.n0) * (ch.ty1 - ch.ty0) + ty - ch.ty0) * p.TW;
        for (int64_t tx0 = 0; tx0 < p.TW; tx0 += kL) {
          Vec s[M][A];  // A along each row
          for (int a = 0; a < M; ++a) {
            Vec e[M];
            RL::deinterleave<M>(buf + (M * (ty - ch.ty0) + a) * width + M * tx0, e);
            F::a(e, s[a]);
          }
          Vec r[A * A];
          for (int b = 0; b < A; ++b) {  // then along each column
            Vec col[M], o[A];
            for (int a = 0; a < M; ++a) col[a] = s[a][b];
            F::a(col, o);
            for (int i = 0; i < A; ++i) r[i * A + b] = o[i];
          }
          finite &= store_positions<A * A>(gt + k * ld + t + tx0, xs, t + tx0 + kL <= ld, p.TW - tx0, r);
        }
      }
    }
  return finite;
}

template <class F>
bool input_transform_adjoint_f32(const Problem<F>& p, const float* dv, int64_t ld, int64_t xs, const Chunk& ch,
                                 float* gx, float* plane) {
  constexpr int M = F::m, A = F::alpha, O = A - M;  // O: the columns (and rows) tiles overlap by
  const int64_t wd = adjoint_width(p);
  Vec sum = RL::zero();  // Inf or NaN once a value is
  for (int64_t n = ch.n0; n < ch.n1; ++n)
    for (int64_t c = 0; c < p.C; ++c) {
      // Rows m ty .. m ty + O - 1 are first written by tile row ty - 1 (its last O rows, stored
      // over every column the copy below reads), so only the first O rows need zeros.
      std::fill(plane, plane + O * wd, 0.0f);
      for (int64_t ty = 0; ty < p.TH; ++ty) {
        const float* d = dv + c * ld + ((n - ch.n0) * p.TH + ty) * p.TW;
        Vec carry[A][O];  // the previous group's columns m .. alpha - 1 (its last lane spills over)
        for (int i = 0; i < A; ++i)
          for (int j = 0; j < O; ++j) carry[i][j] = RL::zero();
        for (int64_t tx0 = 0; tx0 < p.TW; tx0 += kL) {
          const int64_t lanes = p.TW - tx0;  // lanes past the last tile load 0
          Vec h[A][A];                       // B along the first index: h[i][b]
          for (int b = 0; b < A; ++b) {
            Vec q[A], o[A];
            for (int a = 0; a < A; ++a) q[a] = RL::load_first(d + (a * A + b) * xs + tx0, lanes);
            F::b(q, o);
            for (int i = 0; i < A; ++i) h[i][b] = o[i];
          }
          for (int i = 0; i < A; ++i) {
            Vec dd[A], cols[M], v[M];
            F::b(h[i], dd);  // then along the second
            for (int j = 0; j < M; ++j) cols[j] = dd[j];
            for (int j = 0; j < O; ++j) {
              cols[j] = cols[j] + RL::shift_in(dd[M + j], carry[i][j]);
              carry[i][j] = dd[M + j];
            }
            for (int j = 0; j < M; ++j) sum = sum + cols[j];
            RL::interleave<M>(cols, v);
            float* row = plane + (M * ty + i) * wd + M * tx0;
            for (int j = 0; j < M; ++j) {
              if (i < O) v[j] = v[j] + RL::load(row + kL * j);  // rows the tile row above started
              RL::store(row + kL * j, v[j]);
            }
          }
        }
        if (p.TW % kL == 0) {  // the last tile's overhang had no next lane to land in
          for (int i = 0; i < A; ++i) {
            float* row = plane + (M * ty + i) * wd + M * p.TW;
            for (int j = 0; j < O; ++j) {
              sum = sum + carry[i][j];
              row[j] = (i < O ? row[j] : 0.0f) + RL::last(carry[i][j]);
            }
          }
        }
      }
      float* out = gx + (n * p.C + c) * p.H * p.W;
      for (int64_t r = 0; r < p.H; ++r) std::copy_n(plane + (r + p.ph) * wd + p.pw, p.W, out + r * p.W);
    }
  return finite_sum(sum);
}
#endif  // KILN_WINOGRAD_ROW_LANES

#if defined(__AVX512F__)
// Lanes l with 0 <= start + l < n.
inline __mmask16 span_mask(int64_t start, int64_t n) {
  const int64_t lo = std::clamp<int64_t>(-start, 0, 16), hi = std::clamp<int64_t>(n - start, 0, 16);
  return hi > lo ? static_cast<__mmask16>(((1u << hi) - 1u) & ~((1u << lo) - 1u)) : __mmask16(0);
}
// Rows of at most this many tiles take the gathered transforms: measured in bench_conv_lab on
// ResNet-18's layers, 1.1-1.2x faster at 1 to 4 tiles per row (its 7x7 and 4x4 planes), 1.2-1.6x
// slower at 7 (its 28x28 and 14x14 ones), where the row-wise transforms fill half the lanes.
constexpr int64_t kGatheredMaxTiles = 4;

// The transforms for planes narrower than a vector of tiles (a few tiles per row would leave
// most of the 16 lanes idle): lane l of group g is tile 16 g + l of the chunk, counted across
// rows of tiles and samples (chunks of whole samples), its values gathered from (and the outputs
// scattered to) their planes.
template <class F> struct TileLanes {
  int64_t tiles, groups;
  std::vector<int32_t> s, ty, tx;  // each tile's sample (from the chunk's first), row and column
  TileLanes(const Problem<F>& p, const Chunk& ch) : tiles(ch.tiles(p)), groups((tiles + 15) / 16) {
    s.resize(groups * 16), ty.resize(groups * 16), tx.resize(groups * 16);
    const int64_t per = p.TH * p.TW;
    for (int64_t f = 0; f < groups * 16; ++f) {
      const int64_t t = std::min(f, tiles - 1);  // lanes past the last tile repeat it (masked off)
      s[f] = static_cast<int32_t>(t / per);
      ty[f] = static_cast<int32_t>(t % per / p.TW);
      tx[f] = static_cast<int32_t>(t % p.TW);
    }
  }
  __mmask16 valid(int64_t g) const { return span_mask(16 * g, tiles); }
  // s * sample + m ty * row + m tx for the group's lanes
  __m512i offsets(int64_t g, int64_t sample, int64_t row) const {
    const __m512i vs = _mm512_loadu_si512(s.data() + 16 * g), vy = _mm512_loadu_si512(ty.data() + 16 * g);
    const __m512i vx = _mm512_loadu_si512(tx.data() + 16 * g);
    return _mm512_add_epi32(_mm512_add_epi32(_mm512_mullo_epi32(vs, _mm512_set1_epi32(static_cast<int>(sample))),
                                             _mm512_mullo_epi32(vy, _mm512_set1_epi32(static_cast<int>(F::m * row)))),
                            _mm512_mullo_epi32(vx, _mm512_set1_epi32(static_cast<int>(F::m))));
  }
  // lanes whose tile's value (i, j) lies inside an OH x OW plane
  __mmask16 inside(int64_t g, int i, int j, int64_t OH, int64_t OW) const {
    const __m512i vy = _mm512_loadu_si512(ty.data() + 16 * g), vx = _mm512_loadu_si512(tx.data() + 16 * g);
    const __m512i m = _mm512_set1_epi32(static_cast<int>(F::m));
    const __mmask16 r = _mm512_cmplt_epi32_mask(_mm512_add_epi32(_mm512_mullo_epi32(vy, m), _mm512_set1_epi32(i)),
                                                _mm512_set1_epi32(static_cast<int>(OH)));
    const __mmask16 c = _mm512_cmplt_epi32_mask(_mm512_add_epi32(_mm512_mullo_epi32(vx, m), _mm512_set1_epi32(j)),
                                                _mm512_set1_epi32(static_cast<int>(OW)));
    return r & c & valid(g);
  }
  // inside() for every value (i, j) of an m x m output tile
  void inside_masks(int64_t g, int64_t OH, int64_t OW, __mmask16 (&keep)[F::m][F::m]) const {
    for (int i = 0; i < F::m; ++i)
      for (int j = 0; j < F::m; ++j) keep[i][j] = inside(g, i, j, OH, OW);
  }
};

// The zero-padded planes of a chunk's samples for one channel (input_transform_gathered and the
// adjoint's sum): m TH + alpha - m rows of m TW + alpha - m columns each, from (-ph, -pw) on.
template <class F> inline int64_t gathered_width(const Problem<F>& p) { return F::m * p.TW + F::alpha - F::m; }
template <class F> inline int64_t gathered_plane(const Problem<F>& p) {
  return (F::m * p.TH + F::alpha - F::m) * gathered_width(p);
}

// Whether the chunk's transforms take tiles across rows and samples: whole samples, rows of few
// tiles, and offsets within int32.
template <class F> bool gathered(const Problem<F>& p, const Chunk& ch) {
  const int64_t samples = ch.n1 - ch.n0;
  return ch.whole_samples && p.TW <= kGatheredMaxTiles &&
         samples * std::max({p.C * gathered_plane(p), p.K * p.OH * p.OW, p.C * p.H * p.W}) < (int64_t(1) << 31);
}

template <class F>
bool input_transform_gathered(const Problem<F>& p, const float* in, const Chunk& ch, float* v, int64_t ld, int64_t xs,
                              float* buf) {
  constexpr int A = F::alpha;
  const TileLanes<F> tl(p, ch);
  const int64_t wg = gathered_width(p), ps = gathered_plane(p), samples = ch.n1 - ch.n0;
  bool finite = true;
  for (int64_t c = 0; c < p.C; ++c) {
    for (int64_t s = 0; s < samples; ++s) {  // the channel's planes, zero-bordered
      const float* plane = in + ((ch.n0 + s) * p.C + c) * p.H * p.W;
      float* dst = buf + s * ps;
      std::fill(dst, dst + ps, 0.0f);
      for (int64_t r = 0; r < p.H; ++r)
        for (int64_t w = 0; w < p.W; ++w) dst[(r + p.ph) * wg + p.pw + w] = plane[r * p.W + w];
    }
    for (int64_t g = 0; g < tl.groups; ++g) {
      const __m512i at = tl.offsets(g, ps, wg);
      __m512 d[A][A], r[A][A];
      for (int i = 0; i < A; ++i)
        for (int j = 0; j < A; ++j) d[i][j] = _mm512_i32gather_ps(at, buf + i * wg + j, 4);
      nest(d, r, [](const auto& x, auto& y) { F::bt(x, y); });
      finite &= store_positions(v + c * ld + 16 * g, xs, 16 * g + 16 <= ld, tl.tiles - 16 * g, r);
    }
  }
  return finite;
}

template <class F>
bool output_transform_gathered(const Problem<F>& p, const float* m, int64_t ld, int64_t xs, const Chunk& ch,
                               const float* bias, float* out) {
  constexpr int M = F::m, A = F::alpha;
  const TileLanes<F> tl(p, ch);
  const int64_t ohw = p.OH * p.OW;
  __m512 sum = _mm512_setzero_ps();
  float* base = out + ch.n0 * p.K * ohw;
  for (int64_t g = 0; g < tl.groups; ++g) {
    const __m512i at = tl.offsets(g, p.K * ohw, p.OW);
    __mmask16 keep[M][M];
    tl.inside_masks(g, p.OH, p.OW, keep);
    const __mmask16 lanes = tl.valid(g);
    for (int64_t k = 0; k < p.K; ++k) {
      const __m512 bv = _mm512_set1_ps(bias ? bias[k] : 0.0f);
      const float* mk = m + k * ld + 16 * g;
      __m512 q[A][A], y[M][M];
      for (int a = 0; a < A; ++a)
        for (int b = 0; b < A; ++b) q[a][b] = _mm512_maskz_loadu_ps(lanes, mk + (a * A + b) * xs);
      nest(q, y, [](const auto& x, auto& z) { F::at(x, z); });
      float* plane = base + k * ohw;
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < M; ++j) {
          const __m512 o = _mm512_add_ps(y[i][j], bv);
          sum = _mm512_add_ps(sum, o);
          _mm512_mask_i32scatter_ps(plane + i * p.OW + j, keep[i][j], at, o, 4);
        }
    }
  }
  return finite_sum(sum);
}

template <class F>
bool grad_transform_gathered(const Problem<F>& p, const float* gy, const Chunk& ch, float* gt, int64_t ld, int64_t xs) {
  constexpr int M = F::m, A = F::alpha;
  const TileLanes<F> tl(p, ch);
  const int64_t ohw = p.OH * p.OW;
  bool finite = true;
  const float* base = gy + ch.n0 * p.K * ohw;
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t g = 0; g < tl.groups; ++g) {
    const __m512i at = tl.offsets(g, p.K * ohw, p.OW);
    __mmask16 keep[M][M];  // values outside the plane (tiles that overhang it) are zero
    tl.inside_masks(g, p.OH, p.OW, keep);
    for (int64_t k = 0; k < p.K; ++k) {
      const float* plane = base + k * ohw;
      __m512 e[M][M], r[A][A];
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < M; ++j) e[i][j] = _mm512_mask_i32gather_ps(zero, keep[i][j], at, plane + i * p.OW + j, 4);
      nest(e, r, [](const auto& x, auto& z) { F::a(x, z); });
      finite &= store_positions(gt + k * ld + 16 * g, xs, 16 * g + 16 <= ld, tl.tiles - 16 * g, r);
    }
  }
  return finite;
}

template <class F>
bool input_transform_adjoint_gathered(const Problem<F>& p, const float* dv, int64_t ld, int64_t xs, const Chunk& ch,
                                      float* gx, float* buf) {
  constexpr int A = F::alpha;
  const TileLanes<F> tl(p, ch);
  const int64_t wg = gathered_width(p), ps = gathered_plane(p), samples = ch.n1 - ch.n0;
  float check = 0.0f;  // NaN once a value is Inf or NaN
  for (int64_t c = 0; c < p.C; ++c) {
    std::fill(buf, buf + samples * ps, 0.0f);
    for (int64_t g = 0; g < tl.groups; ++g) {
      const __mmask16 lanes = tl.valid(g);
      const __m512i at = tl.offsets(g, ps, wg);
      __m512 q[A][A], dd[A][A];
      for (int a = 0; a < A; ++a)
        for (int b = 0; b < A; ++b) q[a][b] = _mm512_maskz_loadu_ps(lanes, dv + c * ld + 16 * g + (a * A + b) * xs);
      nest(q, dd, [](const auto& x, auto& z) { F::b(x, z); });
      // Neighbouring tiles overlap, but for one (i, j) every lane's position is its own: the
      // gather, add and scatter of each (i, j) in turn sum the overlaps correctly.
      for (int i = 0; i < A; ++i)
        for (int j = 0; j < A; ++j) {
          float* at_ij = buf + i * wg + j;
          const __m512 cur = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), lanes, at, at_ij, 4);
          _mm512_mask_i32scatter_ps(at_ij, lanes, at, _mm512_add_ps(cur, dd[i][j]), 4);
        }
    }
    for (int64_t s = 0; s < samples; ++s) {
      float* plane = gx + ((ch.n0 + s) * p.C + c) * p.H * p.W;
      const float* src = buf + s * ps;
      for (int64_t r = 0; r < p.H; ++r)
        for (int64_t w = 0; w < p.W; ++w) {
          const float x = src[(r + p.ph) * wg + p.pw + w];
          check += x - x;
          plane[r * p.W + w] = x;
        }
    }
  }
  return check == 0.0f;
}
#endif  // __AVX512F__

// The transforms the kernels call: for f32 the vector ones of the level where compiled in (the
// gathered ones for narrow planes at AVX-512 only: AVX2 has no scatter, and its 8 lanes fill
// better along a row).
// KILN_WINOGRAD_VECTOR(gathered call, row call): inside a transform below, returns the vector
// transform's result for f32 where the level has one.
#if defined(__AVX512F__)
#define KILN_WINOGRAD_VECTOR(gathered_call, row_call) \
  if constexpr (std::is_same_v<T, float>) return gathered(p, ch) ? gathered_call : row_call;
#elif defined(KILN_WINOGRAD_ROW_LANES)
#define KILN_WINOGRAD_VECTOR(gathered_call, row_call) \
  if constexpr (std::is_same_v<T, float>) return row_call;
#else
#define KILN_WINOGRAD_VECTOR(gathered_call, row_call)
#endif

template <class F, class T>
bool input_transform_any(const Problem<F>& p, const T* in, const Chunk& ch, T* v, int64_t ld, int64_t xs, T* buf) {
  KILN_WINOGRAD_VECTOR(input_transform_gathered(p, in, ch, v, ld, xs, buf),
                       input_transform_f32(p, in, ch, v, ld, xs, buf))
  return input_transform(p, in, ch, v, ld, xs, buf);
}
template <class F, class T>
bool output_transform_any(const Problem<F>& p, const T* m, int64_t ld, int64_t xs, const Chunk& ch, const T* bias,
                          T* out, T* buf) {
  KILN_WINOGRAD_VECTOR(output_transform_gathered(p, m, ld, xs, ch, bias, out),
                       output_transform_f32(p, m, ld, xs, ch, bias, out))
  return output_transform(p, m, ld, xs, ch, bias, out, buf);
}
template <class F, class T>
bool grad_transform_any(const Problem<F>& p, const T* gy, const Chunk& ch, T* gt, int64_t ld, int64_t xs, T* buf) {
  KILN_WINOGRAD_VECTOR(grad_transform_gathered(p, gy, ch, gt, ld, xs), grad_transform_f32(p, gy, ch, gt, ld, xs, buf))
  return grad_transform(p, gy, ch, gt, ld, xs, buf);
}
template <class F, class T>
bool input_transform_adjoint_any(const Problem<F>& p, const T* dv, int64_t ld, int64_t xs, const Chunk& ch, T* gx,
                                 T* plane) {
  KILN_WINOGRAD_VECTOR(input_transform_adjoint_gathered(p, dv, ld, xs, ch, gx, plane),
                       input_transform_adjoint_f32(p, dv, ld, xs, ch, gx, plane))
  return input_transform_adjoint(p, dv, ld, xs, ch, gx, plane);
}
#undef KILN_WINOGRAD_VECTOR

// Whether every value is finite (x - x is 0 for finite x and NaN for Inf or NaN).
template <class T> bool all_finite(const T* v, int64_t n) {
  constexpr int64_t L = 16;  // independent lane sums, so that the loop vectorises
  T acc[L] = {};
  int64_t i = 0;
  for (; i + L <= n; i += L)
    for (int64_t l = 0; l < L; ++l) acc[l] += v[i + l] - v[i + l];
  for (; i < n; ++i) acc[0] += v[i] - v[i];
  for (int64_t l = 1; l < L; ++l) acc[0] += acc[l];
  return acc[0] == T(0);
}

// The distance between a chunk's xi matrices of n values each: n rounded up to whole 4 KB
// pages plus one cache line, so that the rows the transforms touch at once (one per matrix)
// fall in different L1 sets instead of all aliasing one 4 KB-strided set.
inline int64_t position_stride(int64_t n) { return (n + 1023) / 1024 * 1024 + 16; }  // whole lines

// The transforms' row buffer for chunks of up to tile_rows rows of tiles (each transform's own
// layout; the adjoint's plane only when the input gradient runs through the forward's tiles).
template <class F> int64_t row_buffer_floats(const Problem<F>& p, int64_t tile_rows, int64_t samples, bool adjoint) {
  return std::max({padded_plane_floats(p, tile_rows), F::m * tile_rows * grad_width(p),
                   adjoint ? adjoint_plane_floats(p) : int64_t(0),
                   samples * (F::m * p.TH + F::alpha - F::m) * (F::m * p.TW + F::alpha - F::m)});
}

// One chunk of the convolution p: V = the input transform, the products M[xi] = U[xi] V[xi] (on
// this thread's GEMM), out = the output transform (+ bias). v, m: the chunk's matrices (xi each,
// position_stride apart); rows: the transforms' row buffer. False if a value is not finite.
template <class F, class T>
bool forward_chunk(const Problem<F>& p, const T* in, const Chunk& ch, const T* u, const T* bias, T* out, T* v, T* m,
                   T* rows) {
  const int64_t cols = ch.tiles(p);
  const int64_t vxs = position_stride(p.C * cols), mxs = position_stride(p.K * cols);
  if (!input_transform_any(p, in, ch, v, cols, vxs, rows)) return false;
  for (int64_t xi = 0; xi < F::xi; ++xi)
    gemm(row_major(u + xi * p.K * p.C, p.K, p.C, p.C), row_major<const T>(v + xi * vxs, p.C, cols, cols),
         row_major(m + xi * mxs, p.K, cols, cols), false);
  return output_transform_any(p, m, cols, mxs, ch, bias, out, rows);
}

// The convolution, or false, with out partly written, if a transformed input or weight value is
// not finite: the transforms would turn an Inf into NaNs (Inf - Inf) where the direct kernel
// gives +-Inf, so the caller computes such convolutions directly instead.
template <class F, class T>
bool run(const Problem<F>& p, const T* in, const T* u, const T* bias, T* out,
         const std::function<void(int64_t, int64_t)>& samples_done) {
  if (!all_finite(u, F::xi * p.K * p.C)) return false;
  const double flops = 2.0 * p.N * p.K * p.OH * p.OW * p.C * 9;
  const int nt = flops < 2e5 ? 1 : omp_get_max_threads();
  const std::vector<Chunk> chunks = make_chunks(p, nt);
  const int64_t nchunks = static_cast<int64_t>(chunks.size());
  int64_t max_cols = 0, max_tile_rows = 0, max_samples = 0;
  for (const Chunk& c : chunks) {
    max_cols = std::max(max_cols, c.tiles(p));
    max_tile_rows = std::max(max_tile_rows, c.ty1 - c.ty0);
    max_samples = std::max(max_samples, c.n1 - c.n0);
  }
  const int64_t vsize = F::xi * position_stride(p.C * max_cols), msize = F::xi * position_stride(p.K * max_cols);
  const int64_t rsize = lines<T>(row_buffer_floats(p, max_tile_rows, max_samples, false));
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

// dw [K, C, 3, 3] = G^T (sum of the parts' dU[xi], K x C each) G, for 16 (k, c) pairs at a time:
// whole-vector reads of the xi matrices (one value at a time from xi streams a multiple of 4 KB
// apart was 3% of a ResNet-18 step), the transform on 16-lane vectors. False if a result is not
// finite.
template <class F, class T> bool reduce_weight_grad(const std::vector<T*>& du, int64_t KC, int nt, T* dw) {
  constexpr int64_t L = 16;
  typedef T Lanes __attribute__((vector_size(L * sizeof(T))));
  auto gt = [](const auto& q, auto& o) { F::gt(q, o); };
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t kc0 = 0; kc0 < KC; kc0 += L) {
    const int64_t lanes = std::min(L, KC - kc0);
    Lanes q[F::alpha][F::alpha], o[3][3];
    for (int a = 0; a < F::alpha; ++a)
      for (int b = 0; b < F::alpha; ++b) {
        Lanes s = {};
        for (const T* part : du) {
          Lanes v = {};
          std::memcpy(&v, part + (a * F::alpha + b) * KC + kc0, lanes * sizeof(T));
          s += v;
        }
        q[a][b] = s;
      }
    nest(q, o, gt);
    for (int64_t l = 0; l < lanes; ++l)
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) dw[(kc0 + l) * 9 + i * 3 + j] = o[i][j][l];
  }
  // finite operands, yet an overflowed product or sum: the direct kernel decides what it is
  return all_finite(dw, KC * 9);
}

// The backward of the convolution p: dw [K, C, 3, 3] (null: not wanted), the sum over tiles of
// G^T (A dY A^T . B^T d B) G, and gx (null: not wanted), B (U^T A dY A^T) B^T over the forward's
// own tiles (input_transform_adjoint) with u the weight transform as C x K matrices
// (WeightLayout::Transposed). The output gradient is gy, or, when make_dy is set, made one
// sample at a time into a per-chunk buffer (never stored whole; make_dy must give the same
// values if called again, as the caller's fallback may). Per chunk: the output gradient's
// transform Gt = A dY A^T, shared by both gradients; for dw the input transform V and, per
// position, dU[xi] (K x C) += Gt[xi] (K x tiles) V[xi]^T; for gx dV[xi] (C x tiles) = U[xi]^T
// Gt[xi] and its adjoint transform. Each thread sums its own dU over a fixed, contiguous share
// of the chunks, and the shares are added in thread order: the result does not depend on
// timing. gx needs chunks of whole samples (however large), so a caller with samples larger
// than a chunk runs the input gradient as the "full" convolution of run instead. Returns false
// (outputs partly written) if a transformed value or a result is not finite.
template <class F, class T>
bool run_backward(const Problem<F>& p, const T* x, const T* gy, const std::function<void(int64_t, void*)>& make_dy,
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
  const int64_t vsize = F::xi * position_stride(p.C * max_cols);  // V for dw, then dV for gx
  const int64_t gsize = F::xi * position_stride(p.K * max_cols);
  const int64_t rsize = lines<T>(row_buffer_floats(p, max_tile_rows, max_samples, gx != nullptr));
  const int64_t dysize = generated ? lines<T>(max_samples * p.K * OHW) : 0;
  const int64_t usize = dw ? F::xi * p.K * p.C : 0;
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
      if (!grad_transform_any(p, gyc, ch, gt, cols, gxs, rows)) return fail();
      if (dw) {
        if (!input_transform_any(p, xc, ch, v, cols, vxs, rows)) return fail();
        for (int64_t xi = 0; xi < F::xi; ++xi)
          gemm(row_major<const T>(gt + xi * gxs, p.K, cols, cols),
               row_major<const T>(v + xi * vxs, p.C, cols, cols).t(), row_major(dus + xi * p.K * p.C, p.K, p.C, p.C),
               i > c0);
      }
      if (gx) {
        for (int64_t xi = 0; xi < F::xi; ++xi)
          gemm(row_major(u + xi * p.K * p.C, p.C, p.K, p.K), row_major<const T>(gt + xi * gxs, p.K, cols, cols),
               row_major(v + xi * vxs, p.C, cols, cols), false);
        if (!input_transform_adjoint_any(p, v, cols, vxs, ch, gx + chunks[i].n0 * p.C * p.H * p.W, rows)) return fail();
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
  return !dw || reduce_weight_grad<F>(du, p.K * p.C, nt, dw);
}

// The forward's problem, and the input gradient's: gy correlated with the flipped, transposed
// weight, padded by 2 - p (a "full" convolution where the forward was "valid", "same" where it
// was "same").
template <class F> Problem<F> forward_problem(const ConvGeometry& g) {
  return Problem<F>(g.N, g.C, g.H, g.W, g.K, g.OH, g.OW, g.ph, g.pw);
}
template <class F> Problem<F> input_grad_problem(const ConvGeometry& g) {
  return Problem<F>(g.N, g.K, g.OH, g.OW, g.C, g.H, g.W, 2 - g.ph, 2 - g.pw);
}

// Whether a whole sample's tiles fit one chunk: the input gradient through the forward's tiles
// (run_backward with gx) needs chunks of whole samples.
template <class F> bool samples_fit_chunk(const Problem<F>& p) { return p.TH * p.TW <= tiles_per_chunk(p); }

// The weights transformed into C x K matrices (WeightLayout::Transposed) for run_backward's input
// gradient, in this thread's weight scratch; null if a transformed value is not finite.
template <class F, class T> const T* adjoint_weights(const T* w, const ConvGeometry& g) {
  T* u = weight_scratch<T>(static_cast<size_t>(F::xi * g.K * g.C));
  transform_weights<F>(w, g.K, g.C, WeightLayout::Transposed, u);
  return all_finite(u, F::xi * g.K * g.C) ? u : nullptr;
}

// Calls fn with the tile winograd_tile picks for g (an F2 or an F4 value).
template <class Fn> bool with_tile(const ConvGeometry& g, Fn&& fn) {
  return winograd_tile(g) == 4 ? fn(F4{}) : fn(F2{});
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
  return dt == DType::F32 && winograd_switch().load(std::memory_order_relaxed) && winograd_geometry(g) && g.C >= 16 &&
         g.K >= 16;
}

int winograd_tile(const ConvGeometry& g) {
  const int set = cpu_conv::winograd_tile_setting().load(std::memory_order_relaxed);
  if (set != 0) return set;
  // F(4x4, 3x3) makes fewer products, but its transforms cost more per tile, so it pays only
  // where the products dominate: 64+ channels in and out, and at most 0.6x F(2x2, 3x3)'s products
  // (it pads a plane to multiples of 4: a 14x14 plane makes 0.73x, a 28x28 or 7x7 one 0.56x).
  // And more than one tile per sample: with one, the weight gradient's products sum over only
  // a chunk's samples (measured in bench_conv_lab: 1.2x slower on ResNet-18's 4x4 planes).
  // Measured there: F(4x4, 3x3) 1.1-1.2x faster on ResNet-18's 28x28 and 7x7 layers, no faster
  // on its 14x14 one, 1.3-1.4x slower on the CNN's 32-channel 14x14 one.
  auto tiles = [&](int64_t m) { return ((g.OH + m - 1) / m) * ((g.OW + m - 1) / m); };
  const bool pays = std::min(g.C, g.K) >= 64 && 36 * tiles(4) * 10 <= 16 * tiles(2) * 6 && tiles(4) > 1;
  return pays ? 4 : 2;
}

template <class T>
bool winograd_forward(const T* x, const T* w, const T* bias, T* out, const ConvGeometry& g,
                      const std::function<void(int64_t, int64_t)>& samples_done) {
  KILN_CHECK(winograd_geometry(g), "winograd_forward: not a 3x3 stride-1 NCHW convolution");
  return with_tile(g, [&](auto tile) {
    using F = decltype(tile);
    T* u = weight_scratch<T>(static_cast<size_t>(F::xi * g.K * g.C));
    transform_weights<F>(w, g.K, g.C, WeightLayout::Forward, u);
    return run(forward_problem<F>(g), x, u, bias, out, samples_done);
  });
}

template <class T> bool winograd_backward_input(const T* gy, const T* w, T* gx, const ConvGeometry& g) {
  KILN_CHECK(winograd_geometry(g), "winograd_backward_input: not a 3x3 stride-1 NCHW convolution");
  return with_tile(g, [&](auto tile) {
    using F = decltype(tile);
    const Problem<F> pf = forward_problem<F>(g);
    if (samples_fit_chunk(pf)) {  // through the forward's tiles
      const T* u = adjoint_weights<F>(w, g);
      return u && run_backward(pf, static_cast<const T*>(nullptr), gy, {}, static_cast<T*>(nullptr), u, gx);
    }
    T* u = weight_scratch<T>(static_cast<size_t>(F::xi * g.K * g.C));
    transform_weights<F>(w, g.K, g.C, WeightLayout::FlippedTransposed, u);
    return run(input_grad_problem<F>(g), gy, u, static_cast<const T*>(nullptr), gx, {});
  });
}

template <class T> bool winograd_backward_weight(const T* x, const T* gy, T* dw, const ConvGeometry& g) {
  KILN_CHECK(winograd_geometry(g), "winograd_backward_weight: not a 3x3 stride-1 NCHW convolution");
  return with_tile(g, [&](auto tile) {
    using F = decltype(tile);
    return run_backward(forward_problem<F>(g), x, gy, {}, dw, static_cast<const T*>(nullptr), static_cast<T*>(nullptr));
  });
}

template <class T>
bool winograd_backward_both(const T* x, const T* gy, const T* w, T* gx, T* dw, const ConvGeometry& g) {
  KILN_CHECK(winograd_geometry(g), "winograd_backward_both: not a 3x3 stride-1 NCHW convolution");
  return with_tile(g, [&](auto tile) {
    using F = decltype(tile);
    const Problem<F> p = forward_problem<F>(g);
    if (!samples_fit_chunk(p)) return false;
    const T* u = adjoint_weights<F>(w, g);
    return u && run_backward(p, x, gy, {}, dw, u, gx);
  });
}

template <class T>
bool winograd_backward_generated(const T* x, const T* w, T* gx, T* dw, const ConvGeometry& g,
                                 const std::function<void(int64_t, void*)>& make_dy) {
  KILN_CHECK(winograd_geometry(g), "winograd_backward_generated: not a 3x3 stride-1 NCHW convolution");
  return with_tile(g, [&](auto tile) {
    using F = decltype(tile);
    const T* u = gx ? adjoint_weights<F>(w, g) : nullptr;  // the input gradient runs through the forward's tiles
    if (gx && !u) return false;
    return run_backward(forward_problem<F>(g), x, static_cast<const T*>(nullptr), make_dy, dw, u, gx);
  });
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
template bool winograd_backward_generated<double>(const double*, const double*, double*, double*, const ConvGeometry&,
                                                  const std::function<void(int64_t, void*)>&);

namespace {
WinogradEntries winograd_entries() {
  return {&winograd_forward<float>, &winograd_backward_input<float>, &winograd_backward_weight<float>,
          &winograd_backward_both<float>, &winograd_backward_generated<float>};
}
}  // namespace
KILN_REGISTER_KERNEL(winograd_f32_in_use, CPU, winograd_entries);

}  // namespace kiln::kernels::cpu
