// kiln's CPU GEMM (kernels/cpu/gemm.h). The f32 kernel follows the classic packed design (see
// docs/kernels.md, "The CPU GEMM"):
//
//   for each NC-wide column block of C          (B block: KC x NC, lives in L2/L3)
//     for each KC-deep slice of the inner dim   (pack B's slice into NR-wide panels)
//       for each MC-tall row block of C         (pack A's block into MR-tall panels, lives in L2)
//         for each NR-wide panel, each MR-tall panel:  the micro-kernel
//
// The micro-kernel keeps an MR x NR tile of C in registers, NR two vectors wide, and per step of
// the inner dimension loads two vectors of B's panel and broadcasts MR values of A's panel:
// 2 MR FMAs per MR + 2 loads, all from L1/L2 because the panels are packed contiguously.
//   AVX-512: 12 x 32 in 24 of the 32 zmm registers (16 floats each);
//   AVX2:     6 x 16 in 12 of the 16 ymm registers (8 floats each): 12 accumulators, 2 B vectors
//             and the broadcast A value fill 15.
// One source serves both: `Simd` below is the only part written per instruction set. Packing
// also absorbs any operand strides (transposed views), pads the edges with zeros, and reads each
// operand once per block. A last panel of at most one vector's width runs a one-vector tile.
#include "kiln/kernels/cpu/gemm.h"

#include <Eigen/Core>
#include <omp.h>

#include <algorithm>
#include <cstdlib>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#define KILN_OWN_SGEMM 1
#else
#define KILN_OWN_SGEMM 0
#endif

#include "kiln/core/error.h"

namespace kiln::kernels::cpu {

namespace {

// ---------------------------------------------------------------------------------- Eigen path

template <class T> using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T> using ColMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
using AnyStride = Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>;

// Calls f with an Eigen map of v: row-major or column-major (no copy) when one stride is 1,
// otherwise a general strided map (Eigen copies it inside the product).
template <class T, class F> void with_eigen(MatrixView<const T> v, F&& f) {
  if (v.cs == 1) {
    f(Eigen::Map<const RowMat<T>, 0, Eigen::OuterStride<>>(v.p, v.rows, v.cols, Eigen::OuterStride<>(v.rs)));
  } else if (v.rs == 1) {
    f(Eigen::Map<const ColMat<T>, 0, Eigen::OuterStride<>>(v.p, v.rows, v.cols, Eigen::OuterStride<>(v.cs)));
  } else {
    f(Eigen::Map<const RowMat<T>, 0, AnyStride>(v.p, v.rows, v.cols, AnyStride(v.rs, v.cs)));
  }
}

// C row-major (cs == 1); Eigen parallelises the product itself unless inside a parallel region.
template <class T> void eigen_gemm(MatrixView<const T> a, MatrixView<const T> b, MatrixView<T> c, bool accumulate) {
  Eigen::Map<RowMat<T>, 0, Eigen::OuterStride<>> C(c.p, c.rows, c.cols, Eigen::OuterStride<>(c.rs));
  with_eigen(a, [&](const auto& A) {
    with_eigen(b, [&](const auto& B) {
      if (accumulate) {
        C.noalias() += A * B;
      } else {
        C.noalias() = A * B;
      }
    });
  });
}

// C := 0 (or left alone) for an empty inner dimension, which no kernel loop touches.
template <class T> void empty_product(MatrixView<T> c, bool accumulate) {
  if (accumulate) return;
  for (int64_t i = 0; i < c.rows; ++i)
    for (int64_t j = 0; j < c.cols; ++j) c.p[i * c.rs + j] = T(0);
}

#if KILN_OWN_SGEMM
// ---------------------------------------------------------------------------------- own f32

#if defined(__AVX512F__)
// 16 floats per register, masked loads and stores through k-registers.
struct Simd {
  using V = __m512;
  using Mask = __mmask16;
  static constexpr int W = 16;
  static Mask mask(int64_t n) { return n >= 16 ? Mask(0xFFFF) : n <= 0 ? Mask(0) : Mask((1u << n) - 1u); }
  static bool any(Mask m) { return m != 0; }
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float* p) { return _mm512_load_ps(p); }  // 64-byte aligned
  static V broadcast(float x) { return _mm512_set1_ps(x); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V load(const float* p, Mask m) { return _mm512_maskz_loadu_ps(m, p); }
  static void store(float* p, Mask m, V v) { _mm512_mask_storeu_ps(p, m, v); }
};
constexpr int kMR = 12;  // rows of C per micro-tile

// Reads an up-to-16 x 16 tile (rows x cols valid; the rest read as zero) at src with row stride
// ld and writes its transpose: cols rows of `width` floats at dst with row stride dld, of which
// the first min(rows, width) hold data and the rest zeros. A 16 x 16 transpose in registers is
// three rounds of shuffles: 32-bit pairs, 64-bit pairs, then 128-bit lanes.
inline void transpose_tile(const float* src, int64_t ld, int64_t rows, int64_t cols, float* dst, int64_t dld,
                           int width) {
  const __mmask16 cm = Simd::mask(cols);
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = i < rows ? _mm512_maskz_loadu_ps(cm, src + i * ld) : _mm512_setzero_ps();
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // r[4g + c]: lane L holds column 4L + c of rows 4g..4g+3
  for (int g = 0; g < 4; ++g) {
    const __m512d a = _mm512_castps_pd(t[4 * g]), b = _mm512_castps_pd(t[4 * g + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * g + 2]), d = _mm512_castps_pd(t[4 * g + 3]);
    r[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  const __mmask16 wm = Simd::mask(width);
  for (int c = 0; c < 4; ++c) {
    const __m512 v = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88), w = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xDD);
    const __m512 x = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88),
                 y = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xDD);
    const __m512 out[4] = {_mm512_shuffle_f32x4(v, x, 0x88), _mm512_shuffle_f32x4(w, y, 0x88),
                           _mm512_shuffle_f32x4(v, x, 0xDD), _mm512_shuffle_f32x4(w, y, 0xDD)};
    for (int l = 0; l < 4; ++l)  // out[l] is column 4l + c of the tile
      if (4 * l + c < cols) _mm512_mask_storeu_ps(dst + (4 * l + c) * dld, wm, out[l]);
  }
}
#else
// 8 floats per register; masks are vectors of all-ones/zero lanes (vmaskmovps).
struct Simd {
  using V = __m256;
  using Mask = __m256i;
  static constexpr int W = 8;
  static Mask mask(int64_t n) {
    const int k = static_cast<int>(std::clamp<int64_t>(n, 0, 8));
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static bool any(Mask m) { return !_mm256_testz_si256(m, m); }
  static V zero() { return _mm256_setzero_ps(); }
  static V load(const float* p) { return _mm256_load_ps(p); }  // 32-byte aligned
  static V broadcast(float x) { return _mm256_set1_ps(x); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V load(const float* p, Mask m) { return _mm256_maskload_ps(p, m); }
  static void store(float* p, Mask m, V v) { _mm256_maskstore_ps(p, m, v); }
};
constexpr int kMR = 6;  // rows of C per micro-tile

// The 8 x 8 sibling of the AVX-512 transpose above (same contract): 32-bit pairs, 64-bit pairs,
// then the two 128-bit halves.
inline void transpose_tile(const float* src, int64_t ld, int64_t rows, int64_t cols, float* dst, int64_t dld,
                           int width) {
  const __m256i cm = Simd::mask(cols);
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = i < rows ? _mm256_maskload_ps(src + i * ld, cm) : _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);      // rows 2i, 2i+1: columns 0, 1 | 4, 5
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);  // columns 2, 3 | 6, 7
  }
  for (int g = 0; g < 2; ++g) {  // s[4g + c]: column c (low half) and c + 4 (high half) of rows 4g..4g+3
    r[4 * g] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
    r[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0xEE);
    r[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
    r[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
  }
  const __m256i wm = Simd::mask(width);
  for (int c = 0; c < 4; ++c) {
    if (c < cols) _mm256_maskstore_ps(dst + c * dld, wm, _mm256_permute2f128_ps(r[c], r[4 + c], 0x20));
    if (c + 4 < cols) _mm256_maskstore_ps(dst + (c + 4) * dld, wm, _mm256_permute2f128_ps(r[c], r[4 + c], 0x31));
  }
}
#endif

constexpr int kW = Simd::W;
constexpr int kNR = 2 * kW;    // columns of C per micro-tile (two vectors)
constexpr int64_t kKC = 256;   // inner-dimension slice: an MR x 256 A panel + a 256 x NR B panel (L1)
constexpr int64_t kMC = 144;   // rows per packed A block: 144 x 256 floats = 144 KB (L2)
constexpr int64_t kNC = 2048;  // columns per packed B block: 256 x 2048 floats = 2 MB (L2/L3)
static_assert(kMC % kMR == 0, "an A block is whole panels");

// Per-thread, 64-byte aligned scratch for the packed panels, grown as needed and kept.
struct PackBuffer {
  float* p = nullptr;
  size_t n = 0;
  ~PackBuffer() { std::free(p); }
  float* get(size_t want) {
    if (want > n) {
      std::free(p);
      const size_t bytes = (want * sizeof(float) + 63) / 64 * 64;
      p = static_cast<float*>(std::aligned_alloc(64, bytes));
      KILN_CHECK(p != nullptr, "gemm: out of memory for a ", bytes, "-byte packing buffer");
      n = want;
    }
    return p;
  }
};

// The width of the panel starting at column j0 of an nc-wide block: two vectors, or one for a
// last panel of at most one vector's width (no work wasted on padding there).
inline int panel_width(int64_t remaining) { return remaining > kW ? kNR : kW; }

// One packed panel: dst[k * width + j] = src[j * js + k * ks] for j < valid and k < kc, zeros
// for j in [valid, width). j runs along the panel (C's rows for A, C's columns for B), k along
// the inner dimension.
void pack_panel(const float* src, int64_t js, int64_t ks, int64_t valid, int64_t kc, int width, float* dst) {
  if (js == 1) {  // the panel's values for one k are contiguous: one or two masked vectors per k
    // (not memcpy: for 12 to 32 floats its `rep movs` start-up cost more than the copy)
    for (int64_t k = 0; k < kc; ++k) {
      const float* s = src + k * ks;
      float* d = dst + k * width;
      for (int v = 0; v < width; v += kW) {
        const Simd::V x = Simd::load(s + v, Simd::mask(valid - v));
        Simd::store(d + v, Simd::mask(width - v), x);  // zeros past `valid`
      }
    }
  } else if (ks == 1) {  // contiguous along k (a row of A, a transposed B): register transposes
    for (int64_t k0 = 0; k0 < kc; k0 += kW)
      for (int jj = 0; jj < width; jj += kW)
        transpose_tile(src + jj * js + k0, js, std::clamp<int64_t>(valid - jj, 0, kW), std::min<int64_t>(kW, kc - k0),
                       dst + k0 * width + jj, width, std::min(kW, width - jj));
  } else {  // general strides
    for (int64_t k = 0; k < kc; ++k) std::fill(dst + k * width + valid, dst + (k + 1) * width, 0.0f);
    for (int64_t j = 0; j < valid; ++j)
      for (int64_t k = 0; k < kc; ++k) dst[k * width + j] = src[j * js + k * ks];
  }
}

// B(pc.., jc..) -> panels [nc / width][kc][width], zero-padded on the right.
void pack_b(MatrixView<const float> b, int64_t pc, int64_t kc, int64_t jc, int64_t nc, float* dst) {
  for (int64_t j0 = 0; j0 < nc;) {
    const int w = panel_width(nc - j0);
    pack_panel(b.p + pc * b.rs + (jc + j0) * b.cs, b.cs, b.rs, std::min<int64_t>(w, nc - j0), kc, w, dst);
    dst += kc * w;
    j0 += w;
  }
}

// A(ic.., pc..) -> panels [ceil(mc / MR)][kc][MR], zero-padded at the bottom.
void pack_a(MatrixView<const float> a, int64_t ic, int64_t mc, int64_t pc, int64_t kc, float* dst) {
  for (int64_t i0 = 0; i0 < mc; i0 += kMR) {
    pack_panel(a.p + (ic + i0) * a.rs + pc * a.cs, a.rs, a.cs, std::min<int64_t>(kMR, mc - i0), kc, kMR, dst);
    dst += kc * kMR;
  }
}

// C tile (mr x nr, row stride ldc) = (accumulate ? C : 0) + Ap Bp over kc steps. NV: vectors of
// columns per row (2: the MR x NR tile, 1: a one-vector tile). A is a packed panel
// (ap[k * kMR + r]) when lda is 0; otherwise kMR rows of a row-major A read where they lie
// (ap[r * lda + k]): a row-contiguous A needs no packing, whose transposes cost as much as a
// sixth of the products in a transformer's linears. B is always a packed panel.
// MR: the rows computed, kMR but for a last packed panel of at most a third or two thirds of it,
// where computing all kMR would waste up to two thirds of the panel's work (M = 64, ResNet's
// first stage: 1 panel in 6).
template <int NV, bool kDirectA, int MR = kMR>
void micro_kernel(int64_t kc, const float* ap, int64_t lda, const float* bp, float* c, int64_t ldc, int64_t mr,
                  int64_t nr, bool accumulate) {
  static_assert(MR == kMR || !kDirectA, "a directly read A has whole panels");
  // C's tile is read at the end; asking for it now hides the miss behind the FMAs (C is often
  // far larger than the caches: a weight gradient's [512, 4608] is 9 MB)
  if (accumulate)
    for (int64_t r = 0; r < mr; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
      if (NV == 2) _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + kNR - 1), _MM_HINT_T0);
    }
  Simd::V acc[MR][NV];
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[r][v] = Simd::zero();
  // Direct A: a row pointer for every third row and offsets of 0, 1 and 2 rows reach all kMR
  // rows with few registers.
  const float* rows[kMR / 3];
  for (int i = 0; i < kMR / 3; ++i) rows[i] = ap + 3 * i * lda;
  const int64_t step[3] = {0, lda, 2 * lda};
  for (int64_t k = 0; k < kc; ++k) {
    Simd::V bv[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) bv[v] = Simd::load(bp + kW * v);
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r) {
      const Simd::V av = Simd::broadcast(kDirectA ? rows[r / 3][step[r % 3] + k] : ap[r]);
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[r][v] = Simd::fma(av, bv[v], acc[r][v]);
    }
    if (!kDirectA) ap += kMR;
    bp += kW * NV;
  }
  Simd::Mask mask[NV];
#pragma GCC unroll 2
  for (int v = 0; v < NV; ++v) mask[v] = Simd::mask(nr - kW * v);
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r) {
    if (r >= mr) break;
    float* row = c + r * ldc;
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) {
      if (!Simd::any(mask[v])) continue;
      Simd::V x = acc[r][v];
      if (accumulate) x = Simd::add(x, Simd::load(row + kW * v, mask[v]));
      Simd::store(row + kW * v, mask[v], x);
    }
  }
}

// The micro-kernel on a packed A panel of mr <= kMR rows, at the smallest height that covers them.
template <int NV>
void packed_panel_kernel(int64_t kc, const float* ap, const float* bp, float* c, int64_t ldc, int64_t mr, int64_t nr,
                         bool accumulate) {
  if (mr <= kMR / 3) micro_kernel<NV, false, kMR / 3>(kc, ap, 0, bp, c, ldc, mr, nr, accumulate);
  else if (mr <= 2 * kMR / 3) micro_kernel<NV, false, 2 * kMR / 3>(kc, ap, 0, bp, c, ldc, mr, nr, accumulate);
  else micro_kernel<NV, false>(kc, ap, 0, bp, c, ldc, mr, nr, accumulate);
}

// A packed whole, as PackedLhs holds it: the K slice starting at pc holds ceil(M / kMR) panels of
// kc x kMR floats, each slice mpad = ceil(M / kMR) * kMR floats per inner-dimension step, so
// the panels of rows [i, i + kMR) of slice pc start at pc * mpad + i * kc.
struct PrepackedA {
  const float* panels = nullptr;  // null: pack per block
  int64_t mpad = 0;
  int64_t row0 = 0;  // the first row of A this product reads (a thread's share of the rows)
};

void pack_all_of_a(MatrixView<const float> a, float* dst) {
  const int64_t M = a.rows, K = a.cols, mpad = (M + kMR - 1) / kMR * kMR;
  const int64_t slices = (K + kKC - 1) / kKC;
  const bool par = !omp_in_parallel() && omp_get_max_threads() > 1 && M * K >= (int64_t(1) << 18);
#pragma omp parallel for schedule(static) if (par)
  for (int64_t s = 0; s < slices; ++s) {
    const int64_t pc = s * kKC, kc = std::min(kKC, K - pc);
    pack_a(a, 0, M, pc, kc, dst + pc * mpad);
  }
}

// One thread's product over all of C (row-major, cs == 1).
void own_sgemm(MatrixView<const float> a, MatrixView<const float> b, MatrixView<float> c, bool accumulate,
               PrepackedA pre = {}) {
  thread_local PackBuffer a_buf, b_buf;
  const int64_t M = c.rows, N = c.cols, K = a.cols;
  // A with unit column stride is read in place, but for a last panel of fewer than kMR rows
  // (the kernel reads all kMR), which is packed alone.
  const bool direct = !pre.panels && a.cs == 1;
  float* ap = pre.panels ? nullptr : a_buf.get(static_cast<size_t>((kMC + kMR) * kKC));
  float* bp = b_buf.get(static_cast<size_t>((kNC + kNR) * kKC));
  for (int64_t jc = 0; jc < N; jc += kNC) {
    const int64_t nc = std::min(kNC, N - jc);
    for (int64_t pc = 0; pc < K; pc += kKC) {
      const int64_t kc = std::min(kKC, K - pc);
      const bool acc = accumulate || pc > 0;
      pack_b(b, pc, kc, jc, nc, bp);
      for (int64_t ic = 0; ic < M; ic += kMC) {
        const int64_t mc = std::min(kMC, M - ic);
        const float* apack = ap;
        const int64_t full = direct ? mc / kMR * kMR : 0;  // rows read in place
        if (pre.panels) {
          apack = pre.panels + pc * pre.mpad + (pre.row0 + ic) * kc;
        } else if (!direct) {
          pack_a(a, ic, mc, pc, kc, ap);
        } else if (full < mc) {
          pack_a(a, ic + full, mc - full, pc, kc, ap);
        }
        const float* bpanel = bp;
        for (int64_t j0 = 0; j0 < nc;) {
          const int w = panel_width(nc - j0);
          const int64_t nr = std::min<int64_t>(w, nc - j0);
          for (int64_t i0 = 0; i0 < full; i0 += kMR) {
            float* ct = c.p + (ic + i0) * c.rs + jc + j0;
            const float* arow = a.p + (ic + i0) * a.rs + pc;
            if (w == kNR) {
              micro_kernel<2, true>(kc, arow, a.rs, bpanel, ct, c.rs, kMR, nr, acc);
            } else {
              micro_kernel<1, true>(kc, arow, a.rs, bpanel, ct, c.rs, kMR, nr, acc);
            }
          }
          const float* apanel = apack;
          for (int64_t i0 = full; i0 < mc; i0 += kMR) {
            float* ct = c.p + (ic + i0) * c.rs + jc + j0;
            const int64_t mr = std::min<int64_t>(kMR, mc - i0);
            if (w == kNR) {
              packed_panel_kernel<2>(kc, apanel, bpanel, ct, c.rs, mr, nr, acc);
            } else {
              packed_panel_kernel<1>(kc, apanel, bpanel, ct, c.rs, mr, nr, acc);
            }
            apanel += kc * kMR;
          }
          bpanel += kc * w;
          j0 += w;
        }
      }
    }
  }
}

// Splits C among threads, by columns (each thread packs all of A and its own columns of B) or by
// rows (all of B and its own rows of A): whichever packs less twice, the smaller operand, where
// both leave each thread at least two panels; small products stay on one thread.
void own_sgemm_parallel(MatrixView<const float> a, MatrixView<const float> b, MatrixView<float> c, bool accumulate,
                        int threads, PrepackedA pre = {}) {
  const int64_t M = c.rows, N = c.cols, K = a.cols;
  const double flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  int nt = threads;
  if (flops < 4e6) nt = 1;
  const bool cols_ok = N >= 2 * kNR * nt, rows_ok = M >= 2 * kMR * nt;
  const bool by_cols = cols_ok && (!rows_ok || M <= N);  // by columns A is packed per thread
  if (!by_cols && !rows_ok) nt = 1;
  if (nt <= 1) {
    own_sgemm(a, b, c, accumulate, pre);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num(), n = omp_get_num_threads();
    if (by_cols) {
      const int64_t panels = (N + kNR - 1) / kNR;
      const int64_t j0 = panels * t / n * kNR, j1 = std::min(N, panels * (t + 1) / n * kNR);
      if (j1 > j0)
        own_sgemm(a, {b.p + j0 * b.cs, b.rows, j1 - j0, b.rs, b.cs}, {c.p + j0, c.rows, j1 - j0, c.rs, 1}, accumulate,
                  pre);
    } else {
      const int64_t panels = (M + kMR - 1) / kMR;
      const int64_t i0 = panels * t / n * kMR, i1 = std::min(M, panels * (t + 1) / n * kMR);
      if (i1 > i0)
        own_sgemm({a.p + i0 * a.rs, i1 - i0, a.cols, a.rs, a.cs}, b, {c.p + i0 * c.rs, i1 - i0, c.cols, c.rs, 1},
                  accumulate, {pre.panels, pre.mpad, pre.row0 + i0});
    }
  }
}
#endif  // KILN_OWN_SGEMM

template <class T> void check_shapes(MatrixView<const T> a, MatrixView<const T> b, MatrixView<T> c) {
  KILN_CHECK(a.rows == c.rows && b.cols == c.cols && a.cols == b.rows, "gemm: [", a.rows, ", ", a.cols, "] @ [", b.rows,
             ", ", b.cols, "] -> [", c.rows, ", ", c.cols, "]: shapes do not match");
  KILN_CHECK(c.cs == 1 || c.rs == 1 || c.rows <= 1 || c.cols <= 1,
             "gemm: the output needs a unit stride in one dimension");
}

// The checks and the layout cases both dtypes share; run(a, b, c) gets a row-major C and a
// non-empty product.
template <class T, class Run>
void gemm_checked(MatrixView<const T> a, MatrixView<const T> b, MatrixView<T> c, bool accumulate, Run&& run) {
  check_shapes(a, b, c);
  if (c.rows == 0 || c.cols == 0) return;
  if (c.cs != 1) {
    if (c.cols == 1) {
      c.cs = 1;  // a single column: any row stride works as a row-major leading dimension
    } else {     // column-major C: compute C^T = B^T A^T, which is row-major
      gemm_checked(b.t(), a.t(), c.t(), accumulate, run);
      return;
    }
  }
  if (a.cols == 0) return empty_product(c, accumulate);
  run(a, b, c);
}

}  // namespace

void gemm(MatrixView<const float> a, MatrixView<const float> b, MatrixView<float> c, bool accumulate, int threads) {
  gemm_checked(a, b, c, accumulate, [&](auto a_, auto b_, auto c_) {
#if KILN_OWN_SGEMM
    own_sgemm_parallel(a_, b_, c_, accumulate, threads > 0 ? threads : omp_in_parallel() ? 1 : omp_get_max_threads());
#else
    eigen_gemm(a_, b_, c_, accumulate);
#endif
  });
}

void gemm(MatrixView<const double> a, MatrixView<const double> b, MatrixView<double> c, bool accumulate, int threads) {
  gemm_checked(a, b, c, accumulate, [&](auto a_, auto b_, auto c_) { eigen_gemm(a_, b_, c_, accumulate); });
}

PackedLhs<float>::PackedLhs(MatrixView<const float> a) : a_(a) {
#if KILN_OWN_SGEMM
  // A row-contiguous A is read in place by the micro-kernel: nothing to pack.
  if (a.rows == 0 || a.cols == 0 || a.cs == 1) return;
  tile_rows_ = kMR;
  const int64_t mpad = (a.rows + kMR - 1) / kMR * kMR;
  panels_.resize(static_cast<size_t>(mpad * a.cols));
  pack_all_of_a(a, panels_.data());
#endif
}

void gemm(const PackedLhs<float>& a, MatrixView<const float> b, MatrixView<float> c, bool accumulate, int threads) {
  const MatrixView<const float> av = a.view();
#if KILN_OWN_SGEMM
  // Otherwise the general path (it may transpose the product). Panels packed for another
  // tile (another CPU level's copy of this file) are not read.
  if (a.panels() && a.tile_rows() == kMR && c.cs == 1) {
    check_shapes(av, b, c);
    if (c.rows == 0 || c.cols == 0) return;
    const int64_t mpad = (av.rows + kMR - 1) / kMR * kMR;
    own_sgemm_parallel(av, b, {c.p, c.rows, c.cols, c.rs, 1}, accumulate,
                       threads > 0         ? threads
                       : omp_in_parallel() ? 1
                                           : omp_get_max_threads(),
                       {a.panels(), mpad, 0});
    return;
  }
#endif
  gemm(av, b, c, accumulate, threads);
}

void gemm(const PackedLhs<double>& a, MatrixView<const double> b, MatrixView<double> c, bool accumulate, int threads) {
  gemm(a.view(), b, c, accumulate, threads);
}

bool gemm_uses_own_kernel() { return KILN_OWN_SGEMM != 0; }

namespace {
void gemm_f32(MatrixView<const float> a, MatrixView<const float> b, MatrixView<float> c, bool accumulate, int threads,
              bool packed) {
  if (packed) gemm(PackedLhs<float>(a), b, c, accumulate, threads);
  else gemm(a, b, c, accumulate, threads);
}
}  // namespace

KILN_REGISTER_KERNEL(gemm_f32_in_use, CPU, gemm_f32);

}  // namespace kiln::kernels::cpu
