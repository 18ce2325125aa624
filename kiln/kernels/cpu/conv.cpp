// CPU 2-D convolution: forward, backward-to-input and backward-to-weight, each as "form the patch
// matrix, then one GEMM" (gemm() in kiln/kernels/cpu/gemm.h), in two layouts. f32 NCHW 3x3
// stride-1 convolutions that winograd_applies() accepts run Winograd instead
// (kiln/kernels/cpu/winograd.h); the code below runs everything else, and those too when the
// Winograd kernel declines a call.
//
//   NCHW (im2col):  per block of nb samples and per group, col [Cg*kh*kw, nb*OH*OW] is gathered
//                   from the input planes, each sample's columns side by side (a memcpy per
//                   output row when stride_w == 1; one shifted span per tap for "same"-width
//                   unit-stride convolutions), then
//                     out_b [Kg, nb*OH*OW] = W_g  [Kg, Cg*kh*kw] @ col
//                     dcol  [Cg*kh*kw, .]  = W_g^T @ dout_b      -> col2im (scatter-add)
//                     dW_g += dout_b @ col^T
//                   A block holds one sample when its plane is large; small planes are batched
//                   until a block has about 256 columns (nchw_samples_per_block), so the product
//                   is not 16 or 49 columns wide.
//   NHWC (im2row):  per block of whole samples, P [rows = samples*OH*OW, kh*kw*Cg] is copied
//                   from NHWC rows (each tap is Cg contiguous channels; kw*C contiguous values
//                   when groups == 1 and dilation_w == 1), then
//                     out [rows, Kg] (row stride K) = P @ Wr_g^T, Wr = weight as [K, kh, kw, Cg]
//                     dP  = dout @ Wr_g                      -> row2im (scatter-add)
//                     dWr_g += dout^T @ P
//
// The GEMM: this file is compiled once per CPU level (baseline, AVX2, AVX-512) and the level in
// use is picked at run time (KILN_CPU_ISA, kiln::cpu_isa(); docs/kernels.md, "One binary, every
// x86-64"). f32 at the AVX2 and AVX-512 levels runs kiln's own packed GEMM (gemm.cpp); f64, and
// f32 at the baseline level, run Eigen's. The NCHW kernels prepare each group's weight once per
// call as a PackedLhs, not once per block. The bias gradient's sums are Eigen expressions on
// mapped memory.
//
// Why it is fast: the patch matrix is gathered one block at a time (a few hundred KB for one
// sample of a large plane; several samples are batched only up to about 4 MB for NCHW and 1 MB
// for NHWC), so it is still in cache when the GEMM reads it. With at least as many blocks as
// threads, OpenMP splits the batch (each thread has its own patch buffer and the GEMM runs
// single-threaded inside); otherwise the GEMM splits each product among the threads. The weight
// gradient accumulates into one buffer per thread (never one per sample), summed at the end.
// 1x1 / stride 1 / no padding convolutions use the input as the patch matrix (no copy) in an
// NHWC block or a one-sample NCHW block.
//
// Which layout's kernel runs: the tensors' own, unless autotuning is on
// (kiln::set_cpu_conv_autotune(true), kiln/core/cpu_conv.h). Then the first call of each
// (direction, geometry, dtype, layout, thread count, CPU level) also times the other layout's
// kernel on converted copies, conversions included, and the faster choice is cached for the
// process (cleared by kiln::clear_cpu_conv_autotune_cache()).
//
// Two entry points open the NCHW kernel's inner loop to fused kernels (kiln/kernels/conv_block.h):
// conv2d_forward_epilogue (a callback on each block of samples while its output is in cache) and
// conv2d_backward_generated (the GEMMs of the backward fed one generated output-gradient sample
// at a time).
#include <Eigen/Core>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "kiln/core/cpu_conv.h"
#include "kiln/core/cpu_isa_level.h"
#include "kiln/kernels/cpu_conv_settings.h"
#include "kiln/core/error.h"
#include "kiln/kernels/conv.h"
#include "kiln/kernels/copy_fill.h"
#include "kiln/kernels/cpu/gemm.h"
#include "kiln/kernels/cpu/winograd.h"
#include "kiln/kernels/conv_block.h"
#include "kiln/kernels/memory_format.h"

namespace kiln::kernels::cpu {

namespace {

using Eigen::Dynamic;
using Eigen::OuterStride;
template <class T> using RowMat = Eigen::Matrix<T, Dynamic, Dynamic, Eigen::RowMajor>;
template <class T> using MMap = Eigen::Map<RowMat<T>, 0, OuterStride<>>;
template <class T> using CMap = Eigen::Map<const RowMat<T>, 0, OuterStride<>>;

// Output positions o in [lo, hi) whose input index o * s + off lies in [0, n).
inline void valid_range(int64_t out_n, int64_t s, int64_t off, int64_t n, int64_t& lo, int64_t& hi) {
  lo = off >= 0 ? 0 : (-off + s - 1) / s;
  hi = n - 1 - off < 0 ? 0 : (n - 1 - off) / s + 1;
  hi = std::min(hi, out_n);
  lo = std::min(lo, hi);
}

inline bool is_pointwise(const ConvGeometry& g) {
  return g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0;
}

// ------------------------------------------------------------------------- NCHW: im2col

// "Same"-width unit-stride convolutions (stride 1, dilation 1, OW == W: 3x3 pad 1, 5x5 pad 2...):
// a tap (ki, kj) reads the input plane shifted by D = (ki - ph) * W + (kj - pw), so the tap's col
// row is one contiguous span of the plane, except that the |kj - pw| columns at the row ends that
// fall outside the image (and would wrap into the neighbouring row) must be zero, and so must the
// rows above/below the image. One span per tap instead of one small copy per output row: for the
// CNN's 14x14 planes that is 14x fewer copies. Span is [first, last) in col-row coordinates.
struct ShiftedTap {
  int64_t D = 0, first = 0, last = 0, zero_lo = 0, zero_hi = 0;  // zero_lo/hi: invalid columns
  bool empty = true;  // the tap never reads inside the image (tiny planes): its row is all zero
};
inline bool is_same_width_unit_stride(const ConvGeometry& g) {
  return g.sh == 1 && g.sw == 1 && g.dh == 1 && g.dw == 1 && g.OW == g.W;
}
inline ShiftedTap shifted_tap(const ConvGeometry& g, int64_t ki, int64_t kj) {
  const int64_t oh_off = ki - g.ph, ow_off = kj - g.pw;
  const int64_t oh_lo = std::clamp<int64_t>(-oh_off, 0, g.OH);
  const int64_t oh_hi = std::clamp<int64_t>(g.H - oh_off, oh_lo, g.OH);
  ShiftedTap t;
  t.zero_lo = std::max<int64_t>(-ow_off, 0);
  t.zero_hi = std::max<int64_t>(ow_off, 0);
  if (oh_hi <= oh_lo || t.zero_lo + t.zero_hi >= g.W) return t;
  t.empty = false;
  t.D = oh_off * g.W + ow_off;
  t.first = oh_lo * g.W + t.zero_lo;
  t.last = oh_hi * g.W - t.zero_hi;
  return t;
}

// Calls f(c, ki, kj, row) for every tap of Cg channels, row = (c * kh + ki) * kw + kj being its
// row of the im2col matrix.
template <class F> inline void for_each_tap(int64_t Cg, const ConvGeometry& g, F&& f) {
  for (int64_t c = 0; c < Cg; ++c)
    for (int64_t ki = 0; ki < g.kh; ++ki)
      for (int64_t kj = 0; kj < g.kw; ++kj) f(c, ki, kj, (c * g.kh + ki) * g.kw + kj);
}

// Zeroes the columns of a same-width tap's im2col row that wrapped into the neighbouring rows.
template <class T> inline void zero_wrapped_columns(T* row, const ShiftedTap& t, int64_t OW) {
  for (int64_t r = t.first - t.zero_lo + OW; r < t.last; r += OW)
    for (int64_t j = 0; j < t.zero_lo + t.zero_hi; ++j) row[r - t.zero_hi + j] = T(0);
}

// x: one sample's Cg planes [Cg, H, W]; col [Cg*kh*kw, OH*OW] with row stride ld (>= OH*OW:
// a block of samples puts each sample's columns side by side).
template <class T> void im2col(const T* x, T* col, int64_t Cg, const ConvGeometry& g, int64_t ld) {
  const int64_t HW = g.H * g.W, OW = g.OW;
  if (is_same_width_unit_stride(g)) {
    const int64_t OHW = g.OH * OW;
    for_each_tap(Cg, g, [&](int64_t c, int64_t ki, int64_t kj, int64_t tap) {
      T* row = col + tap * ld;
      const ShiftedTap t = shifted_tap(g, ki, kj);
      if (t.empty) {
        std::fill(row, row + OHW, T(0));
        return;
      }
      std::fill(row, row + t.first, T(0));
      std::memcpy(row + t.first, x + c * HW + t.first + t.D, (t.last - t.first) * sizeof(T));
      std::fill(row + t.last, row + OHW, T(0));
      zero_wrapped_columns(row, t, OW);
    });
    return;
  }
  for_each_tap(Cg, g, [&](int64_t c, int64_t ki, int64_t kj, int64_t tap) {
    T* row = col + tap * ld;
    const T* xc = x + c * HW;
    const int64_t off = kj * g.dw - g.pw;
    int64_t lo, hi;
    valid_range(OW, g.sw, off, g.W, lo, hi);
    for (int64_t oh = 0; oh < g.OH; ++oh) {
      T* r = row + oh * OW;
      const int64_t ih = oh * g.sh - g.ph + ki * g.dh;
      if (ih < 0 || ih >= g.H) {
        std::fill(r, r + OW, T(0));
        continue;
      }
      const T* xr = xc + ih * g.W;
      std::fill(r, r + lo, T(0));
      if (g.sw == 1) {
        if (hi > lo) std::memcpy(r + lo, xr + lo + off, (hi - lo) * sizeof(T));
      } else {
        for (int64_t ow = lo; ow < hi; ++ow) r[ow] = xr[ow * g.sw + off];
      }
      std::fill(r + hi, r + OW, T(0));
    }
  });
}

// The adjoint of im2col: dx [Cg, H, W] += scatter(col), col's row stride ld. dx must be zeroed by
// the caller. col is scratch: the same-width path zeroes its wrapped columns so that each tap is
// one span add.
template <class T> void col2im(T* col, T* dx, int64_t Cg, const ConvGeometry& g, int64_t ld) {
  const int64_t HW = g.H * g.W, OW = g.OW;
  if (is_same_width_unit_stride(g)) {
    for_each_tap(Cg, g, [&](int64_t c, int64_t ki, int64_t kj, int64_t tap) {
      T* row = col + tap * ld;
      const ShiftedTap t = shifted_tap(g, ki, kj);
      if (t.empty) return;
      zero_wrapped_columns(row, t, OW);
      T* xs = dx + c * HW + (t.first + t.D);  // t.first + t.D >= 0: the span's first input
      const T* rs = row + t.first;
#pragma omp simd
      for (int64_t i = 0; i < t.last - t.first; ++i) xs[i] += rs[i];
    });
    return;
  }
  for_each_tap(Cg, g, [&](int64_t c, int64_t ki, int64_t kj, int64_t tap) {
    const T* row = col + tap * ld;
    T* xc = dx + c * HW;
    const int64_t off = kj * g.dw - g.pw;
    int64_t lo, hi;
    valid_range(OW, g.sw, off, g.W, lo, hi);
    for (int64_t oh = 0; oh < g.OH; ++oh) {
      const int64_t ih = oh * g.sh - g.ph + ki * g.dh;
      if (ih < 0 || ih >= g.H) continue;
      const T* r = row + oh * OW;
      T* xr = xc + ih * g.W + off;
      if (g.sw == 1) {
#pragma omp simd
        for (int64_t ow = lo; ow < hi; ++ow) xr[ow] += r[ow];
      } else {
        for (int64_t ow = lo; ow < hi; ++ow) xr[ow * g.sw] += r[ow];
      }
    }
  });
}

// ------------------------------------------------------------------------- NHWC: im2row

// x: one block of samples, NHWC; P [samples*OH*OW, kh*kw*Cg] for channels [c0, c0 + Cg).
template <class T> void im2row(const T* x, T* P, int64_t samples, int64_t c0, int64_t Cg, const ConvGeometry& g) {
  const int64_t C = g.C, Ckk = g.kh * g.kw * Cg;
  const bool whole_rows = Cg == C && g.dw == 1;  // kw taps are kw*C contiguous values
  for (int64_t n = 0; n < samples; ++n) {
    const T* xn = x + n * g.H * g.W * C;
    for (int64_t oh = 0; oh < g.OH; ++oh)
      for (int64_t ow = 0; ow < g.OW; ++ow) {
        T* prow = P + ((n * g.OH + oh) * g.OW + ow) * Ckk;
        const int64_t iw0 = ow * g.sw - g.pw;
        for (int64_t ki = 0; ki < g.kh; ++ki) {
          T* dst = prow + ki * g.kw * Cg;
          const int64_t ih = oh * g.sh - g.ph + ki * g.dh;
          if (ih < 0 || ih >= g.H) {
            std::fill(dst, dst + g.kw * Cg, T(0));
            continue;
          }
          const T* xr = xn + ih * g.W * C + c0;
          if (whole_rows && iw0 >= 0 && iw0 + g.kw <= g.W) {
            std::memcpy(dst, xr + iw0 * C, g.kw * C * sizeof(T));
            continue;
          }
          for (int64_t kj = 0; kj < g.kw; ++kj) {
            const int64_t iw = iw0 + kj * g.dw;
            T* d = dst + kj * Cg;
            if (iw < 0 || iw >= g.W) std::fill(d, d + Cg, T(0));
            else std::copy_n(xr + iw * C, Cg, d);
          }
        }
      }
  }
}

// The NHWC patch matrix of samples [n0, n1) and group gi: (n1 - n0) * OH * OW rows of Ckk. A 1x1
// stride-1 convolution (pw) reads the input rows in place; others im2row into buf (large enough).
template <class T>
MatrixView<const T> nhwc_patches(const T* xp, T* buf, int64_t n0, int64_t n1, int64_t gi, int64_t Cg, int64_t Ckk,
                                 bool pw, const ConvGeometry& g) {
  const int64_t rows = (n1 - n0) * g.OH * g.OW;
  const T* xb = xp + n0 * g.H * g.W * g.C;
  if (pw) return row_major(xb + gi * Cg, rows, Ckk, g.C);
  im2row(xb, buf, n1 - n0, gi * Cg, Cg, g);
  return row_major<const T>(buf, rows, Ckk, Ckk);
}

// The adjoint of im2row: dx (block of samples, NHWC, zeroed by the caller) += scatter(P).
template <class T> void row2im(const T* P, T* dx, int64_t samples, int64_t c0, int64_t Cg, const ConvGeometry& g) {
  const int64_t C = g.C, Ckk = g.kh * g.kw * Cg;
  for (int64_t n = 0; n < samples; ++n) {
    T* xn = dx + n * g.H * g.W * C;
    for (int64_t oh = 0; oh < g.OH; ++oh)
      for (int64_t ow = 0; ow < g.OW; ++ow) {
        const T* prow = P + ((n * g.OH + oh) * g.OW + ow) * Ckk;
        const int64_t iw0 = ow * g.sw - g.pw;
        for (int64_t ki = 0; ki < g.kh; ++ki) {
          const int64_t ih = oh * g.sh - g.ph + ki * g.dh;
          if (ih < 0 || ih >= g.H) continue;
          T* xr = xn + ih * g.W * C + c0;
          const T* src = prow + ki * g.kw * Cg;
          for (int64_t kj = 0; kj < g.kw; ++kj) {
            const int64_t iw = iw0 + kj * g.dw;
            if (iw < 0 || iw >= g.W) continue;
            T* d = xr + iw * C;
            const T* s = src + kj * Cg;
#pragma omp simd
            for (int64_t c = 0; c < Cg; ++c) d[c] += s[c];
          }
        }
      }
  }
}

// ------------------------------------------------------------------------- scheduling

// Runs body(thread, begin, end) over [0, n) in blocks of `block`; with at least as many blocks
// as threads the blocks are spread over OpenMP threads (the GEMM then runs single-threaded inside
// each), otherwise everything runs on this thread and the GEMM splits each product among the
// threads (kiln's own at AVX2 and AVX-512, Eigen's at the baseline level and for f64).
// any_order: the blocks' results do not depend on which thread runs them (no per-thread partial
// sums), so they are handed out dynamically -- a thread that starts late or runs slower (a VM's
// vCPUs do) takes fewer. Otherwise a static split keeps reductions bitwise reproducible.
template <class F> void for_blocks(int64_t n, int64_t block, int nthreads, F&& body, bool any_order = false) {
  const int64_t nblocks = (n + block - 1) / block;
  if (nthreads > 1 && nblocks >= nthreads) {
#pragma omp parallel num_threads(nthreads)
    {
      const int t = omp_get_thread_num();
      if (any_order) {
#pragma omp for schedule(dynamic, 1)
        for (int64_t b = 0; b < nblocks; ++b) body(t, b * block, std::min(n, (b + 1) * block));
      } else {
#pragma omp for schedule(static)
        for (int64_t b = 0; b < nblocks; ++b) body(t, b * block, std::min(n, (b + 1) * block));
      }
    }
  } else {
    for (int64_t b = 0; b < nblocks; ++b) body(0, b * block, std::min(n, (b + 1) * block));
  }
}

int threads_for(const ConvGeometry& g) {
  const int nt = omp_get_max_threads();
  const double flops = 2.0 * g.N * g.K * g.OH * g.OW * (g.C / g.groups) * g.kh * g.kw;
  return flops < 2e5 ? 1 : nt;  // tiny convolutions (tests, gradcheck) stay on one thread
}

// Samples per NHWC block: ~512 patch rows make an efficient GEMM; the patch stays under ~1 MB
// (in L2); and the batch still splits into at least two blocks per thread.
int64_t samples_per_block(const ConvGeometry& g) {
  const int64_t rows = std::max<int64_t>(g.OH * g.OW, 1);
  const int64_t row_bytes = std::max<int64_t>(g.kh * g.kw * (g.C / g.groups), 1) * 4;
  int64_t spb = std::max<int64_t>(1, 512 / rows);
  spb = std::min(spb, std::max<int64_t>(1, (1 << 20) / (rows * row_bytes)));
  spb = std::min(spb, std::max<int64_t>(1, g.N / (2 * omp_get_max_threads())));
  return spb;
}

// Samples per NCHW block. One sample's GEMMs have OH*OW columns: a 4x4 plane makes a 16-column
// product that streams the whole weight once per sample. So small planes are batched until a
// block has ~256 columns, within ~4 MB of patch matrix and at least two blocks per thread.
int64_t nchw_samples_per_block(const ConvGeometry& g, int nt) {
  const int64_t ohw = std::max<int64_t>(g.OH * g.OW, 1);
  const int64_t col_bytes = std::max<int64_t>(g.kh * g.kw * (g.C / g.groups), 1) * ohw * 4;
  int64_t spb = std::max<int64_t>(1, (256 + ohw - 1) / ohw);
  spb = std::min(spb, std::max<int64_t>(1, (4 << 20) / col_bytes));
  spb = std::min(spb, std::max<int64_t>(1, g.N / (2 * nt)));
  return spb;
}

// An NCHW block of samples [n0, n1): its GEMMs have cols = nb * OH*OW columns, sample-major.
// nb samples' planes [nb][rows][ohw] <-> one [rows, nb * ohw] matrix, sample-major columns.
template <class T> void planes_to_block(const T* planes, T* block, int64_t nb, int64_t rows, int64_t ohw) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < nb; ++i)
      std::memcpy(block + (r * nb + i) * ohw, planes + (i * rows + r) * ohw, ohw * sizeof(T));
}
template <class T> void block_to_planes(const T* block, T* planes, int64_t nb, int64_t rows, int64_t ohw) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < nb; ++i)
      std::memcpy(planes + (i * rows + r) * ohw, block + (r * nb + i) * ohw, ohw * sizeof(T));
}

struct NchwBlock {
  int64_t n0, nb, cols;
  bool single;          // one sample: its planes are already a [rows, OH*OW] matrix
  bool in_place_input;  // a single sample of a pointwise convolution: x is the patch matrix
  NchwBlock(const ConvGeometry& g, int64_t n0_, int64_t n1, bool pw)
      : n0(n0_), nb(n1 - n0_), cols((n1 - n0_) * g.OH * g.OW), single(n1 - n0_ == 1), in_place_input(pw && single) {}

  // Sizes buf as [patch matrix (Ckk x cols, unless the input serves in place) | a [K, cols]
  // output or output-gradient block (unless a single sample's planes serve as they are)] and
  // returns the second part.
  template <class T> T* scratch(std::vector<T>& buf, int64_t Ckk, int64_t K) const {
    const int64_t col_size = in_place_input ? 0 : Ckk * cols;
    const int64_t need = col_size + (single ? 0 : K * cols);
    if (static_cast<int64_t>(buf.size()) < need) buf.resize(need);
    return buf.data() + col_size;
  }
  // The block's output gradient (gy: the whole NCHW gradient) as one [K, cols] matrix.
  template <class T> const T* gathered(const T* gy, T* scratch, const ConvGeometry& g) const {
    const T* planes = gy + n0 * g.K * g.OH * g.OW;
    if (single) return planes;
    planes_to_block(planes, scratch, nb, g.K, g.OH * g.OW);
    return scratch;
  }
};

// for_blocks over NCHW blocks of nchw_samples_per_block(g, nt) samples: body(t, block, buf), buf
// thread t's scratch buffer for block.scratch.
template <class T, class F> void for_nchw_blocks(const ConvGeometry& g, int nt, bool any_order, F&& body) {
  const bool pw = is_pointwise(g);
  std::vector<std::vector<T>> bufs(nt);
  for_blocks(
      g.N, nchw_samples_per_block(g, nt), nt,
      [&](int t, int64_t n0, int64_t n1) { body(t, NchwBlock(g, n0, n1, pw), bufs[t]); }, any_order);
}

// for_blocks over NHWC blocks of samples_per_block(g) samples: body(t, n0, n1, rows, scratch), rows =
// (n1 - n0) * OH*OW output rows and scratch thread t's buffer of rows * Cg*kh*kw values (the block's
// patch matrix or its gradient); none for a pointwise convolution, which reads and writes in place,
// nor without with_scratch.
template <class T, class F>
void for_nhwc_blocks(const ConvGeometry& g, int nt, bool with_scratch, bool any_order, F&& body) {
  const int64_t OHW = g.OH * g.OW, Ckk = g.C / g.groups * g.kh * g.kw;
  const bool sized = with_scratch && !is_pointwise(g);
  std::vector<std::vector<T>> bufs(nt);
  for_blocks(
      g.N, samples_per_block(g), nt,
      [&](int t, int64_t n0, int64_t n1) {
        const int64_t rows = (n1 - n0) * OHW;
        std::vector<T>& buf = bufs[t];
        if (sized && static_cast<int64_t>(buf.size()) < rows * Ckk) buf.resize(rows * Ckk);
        body(t, n0, n1, rows, buf.data());
      },
      any_order);
}

// Weight [K, Cg, kh, kw] -> [K, kh, kw, Cg] (contiguous), the column order of the NHWC patches.
template <class T> std::vector<T> weight_to_hwc(const T* w, const ConvGeometry& g) {
  const int64_t Cg = g.C / g.groups, khw = g.kh * g.kw;
  std::vector<T> r(g.K * Cg * khw);
  for (int64_t k = 0; k < g.K; ++k)
    for (int64_t c = 0; c < Cg; ++c)
      for (int64_t s = 0; s < khw; ++s) r[(k * khw + s) * Cg + c] = w[(k * Cg + c) * khw + s];
  return r;
}

void check_layout(const char* op, const Tensor& t, const char* what, const ConvGeometry& g) {
  KILN_CHECK(has_layout(t, g.channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous), op, ": ", what,
             " (sizes ", t.sizes(), ", strides ", t.strides(), ") is not ",
             g.channels_last ? "channels-last" : "NCHW-contiguous", " as the kernel was asked to read it");
}

// ------------------------------------------------------------------------- forward

// The weight of each group as the GEMMs' left operand, packed once per call rather than once
// per block of samples: W [Kg, Cg*kh*kw] for the forward, W^T for the input gradient.
template <class T> std::vector<PackedLhs<T>> packed_weight(const T* wp, const ConvGeometry& g, bool transposed) {
  const int64_t G = g.groups, Kg = g.K / G, Ckk = g.C / G * g.kh * g.kw;
  std::vector<PackedLhs<T>> out;
  for (int64_t gi = 0; gi < G; ++gi) {
    const auto w = row_major(wp + gi * Kg * Ckk, Kg, Ckk, Ckk);
    out.emplace_back(transposed ? MatrixView<const T>(w.t()) : MatrixView<const T>(w));
  }
  return out;
}

// samples_done (NCHW only; empty: none): called once per block of samples [n0, n1), from the
// thread that computed it, right after their output planes are written, while they are in cache.
template <class T>
void forward_impl(const Tensor& out, const Tensor& x, const Tensor& w_t, const Tensor& bias, const ConvGeometry& g,
                  const SamplesDone& samples_done = {}) {
  const T* xp = x.data_ptr<T>();
  const T* wp = w_t.data_ptr<T>();
  const T* bp = bias.defined() ? bias.data_ptr<T>() : nullptr;
  T* op = out.data_ptr<T>();
  const int64_t G = g.groups, Cg = g.C / G, Kg = g.K / G, Ckk = Cg * g.kh * g.kw;
  const int64_t OHW = g.OH * g.OW, HW = g.H * g.W;
  const bool pw = is_pointwise(g);
  const int nt = threads_for(g);
  // out rows [k0, k0 + rows) of ld-strided C := bias (the GEMM then accumulates onto it)
  auto fill_bias = [&](T* c, int64_t k0, int64_t rows, int64_t cols, int64_t ld) {
    for (int64_t k = 0; k < rows; ++k) std::fill(c + k * ld, c + k * ld + cols, bp[k0 + k]);
  };
  if (winograd_applies(g, dtype_of<T>::value) && winograd_forward(xp, wp, bp, op, g, samples_done)) return;
  if (!g.channels_last) {
    const std::vector<PackedLhs<T>> wg = packed_weight(wp, g, false);
    for_nchw_blocks<T>(g, nt, /*any_order=*/true, [&](int, const NchwBlock& b, std::vector<T>& buf) {
      const int64_t n0 = b.n0, n1 = n0 + b.nb;
      T* scratch = b.scratch(buf, Ckk, g.K);
      T* yb = b.single ? op + n0 * g.K * OHW : scratch;  // the block's output as [K, cols]
      for (int64_t gi = 0; gi < G; ++gi) {
        const T* colp = b.in_place_input ? xp + (n0 * g.C + gi * Cg) * HW : buf.data();
        if (!b.in_place_input)
          for (int64_t i = 0; i < b.nb; ++i)
            im2col(xp + ((n0 + i) * g.C + gi * Cg) * HW, buf.data() + i * OHW, Cg, g, b.cols);
        T* yg = yb + gi * Kg * b.cols;
        if (bp) fill_bias(yg, gi * Kg, Kg, b.cols, b.cols);
        gemm(wg[gi], row_major(colp, Ckk, b.cols, b.cols), row_major(yg, Kg, b.cols, b.cols), bp != nullptr);
      }
      if (!b.single) block_to_planes(yb, op + n0 * g.K * OHW, b.nb, g.K, OHW);
      if (samples_done) samples_done(n0, n1);  // the block's output planes are still in cache
    });
    return;
  }
  KILN_CHECK(!samples_done, "conv2d_forward_epilogue: the NCHW kernel only");
  const std::vector<T> wr = weight_to_hwc(wp, g);
  auto block = [&](int, int64_t n0, int64_t n1, int64_t rows, T* patches) {
    for (int64_t gi = 0; gi < G; ++gi) {
      const MatrixView<const T> P = nhwc_patches(xp, patches, n0, n1, gi, Cg, Ckk, pw, g);
      T* o = op + n0 * OHW * g.K + gi * Kg;
      if (bp)
        for (int64_t r = 0; r < rows; ++r) std::copy_n(bp + gi * Kg, Kg, o + r * g.K);
      gemm(P, row_major(wr.data() + gi * Kg * Ckk, Kg, Ckk, Ckk).t(), row_major(o, rows, Kg, g.K), bp != nullptr);
    }
  };
  for_nhwc_blocks<T>(g, nt, /*with_scratch=*/true, /*any_order=*/true, block);
}

// ------------------------------------------------------------------------- backward: input

// The input gradient of a block of nb NCHW samples, gx_b [nb, C, H, W] (overwritten), from their
// output gradient as one [K, cols] matrix dy_b (cols = nb * OH*OW, sample-major columns): per
// group dcol = W^T dY, then col2im per sample; a single pointwise sample gets W^T dY directly.
// col: Cg*kh*kw * cols scratch (unused in the direct case). wt: packed_weight(.., true).
template <class T>
void block_input_grad(T* gx_b, const T* dy_b, int64_t nb, const std::vector<PackedLhs<T>>& wt, T* col,
                      const ConvGeometry& g) {
  const int64_t G = g.groups, Cg = g.C / G, Kg = g.K / G, Ckk = Cg * g.kh * g.kw;
  const int64_t OHW = g.OH * g.OW, HW = g.H * g.W, cols = nb * OHW;
  const bool direct = is_pointwise(g) && nb == 1;
  if (!direct) std::fill(gx_b, gx_b + nb * g.C * HW, T(0));
  for (int64_t gi = 0; gi < G; ++gi) {
    const PackedLhs<T>& Wt = wt[gi];
    const auto dY = row_major(dy_b + gi * Kg * cols, Kg, cols, cols);
    if (direct) {  // col is the input itself: write the gradient in place
      gemm(Wt, dY, row_major(gx_b + gi * Cg * HW, Ckk, OHW, OHW), false);
      continue;
    }
    gemm(Wt, dY, row_major(col, Ckk, cols, cols), false);
    for (int64_t i = 0; i < nb; ++i) col2im(col + i * OHW, gx_b + (i * g.C + gi * Cg) * HW, Cg, g, cols);
  }
}

// dw [K, Cg*kh*kw] += a block's weight gradient: per group dY col(x_b)^T, dy_b as above and x_b
// the block's nb NCHW input samples. col: scratch as above.
template <class T>
void add_block_weight_grad(T* dw, const T* dy_b, const T* x_b, int64_t nb, T* col, const ConvGeometry& g) {
  const int64_t G = g.groups, Cg = g.C / G, Kg = g.K / G, Ckk = Cg * g.kh * g.kw;
  const int64_t OHW = g.OH * g.OW, HW = g.H * g.W, cols = nb * OHW;
  const bool direct = is_pointwise(g) && nb == 1;
  for (int64_t gi = 0; gi < G; ++gi) {
    const T* colp = direct ? x_b + gi * Cg * HW : col;
    if (!direct)
      for (int64_t i = 0; i < nb; ++i) im2col(x_b + (i * g.C + gi * Cg) * HW, col + i * OHW, Cg, g, cols);
    gemm(row_major(dy_b + gi * Kg * cols, Kg, cols, cols), row_major(colp, Ckk, cols, cols).t(),
         row_major(dw + gi * Kg * Ckk, Kg, Ckk, Ckk), true);
  }
}

template <class T>
void backward_input_impl(const Tensor& gx, const Tensor& gy, const Tensor& w_t, const ConvGeometry& g) {
  const T* gyp = gy.data_ptr<T>();
  const T* wp = w_t.data_ptr<T>();
  T* gxp = gx.data_ptr<T>();
  const int64_t G = g.groups, Cg = g.C / G, Kg = g.K / G, Ckk = Cg * g.kh * g.kw;
  const int64_t OHW = g.OH * g.OW, HW = g.H * g.W;
  const bool pw = is_pointwise(g);
  const int nt = threads_for(g);
  if (winograd_applies(g, dtype_of<T>::value)) {
    if (winograd_backward_input(gyp, wp, gxp, g)) return;
  }
  if (!g.channels_last) {
    const std::vector<PackedLhs<T>> wt = packed_weight(wp, g, true);
    for_nchw_blocks<T>(g, nt, /*any_order=*/true, [&](int, const NchwBlock& b, std::vector<T>& buf) {
      T* scratch = b.scratch(buf, Ckk, g.K);
      block_input_grad(gxp + b.n0 * g.C * HW, b.gathered(gyp, scratch, g), b.nb, wt, buf.data(), g);
    });
    return;
  }
  const std::vector<T> wr = weight_to_hwc(wp, g);
  auto block = [&](int, int64_t n0, int64_t n1, int64_t rows, T* dpatches) {
    T* gxb = gxp + n0 * HW * g.C;
    if (!pw) std::fill(gxb, gxb + (n1 - n0) * HW * g.C, T(0));
    for (int64_t gi = 0; gi < G; ++gi) {
      const auto Wg = row_major(wr.data() + gi * Kg * Ckk, Kg, Ckk, Ckk);
      const auto dY = row_major(gyp + n0 * OHW * g.K + gi * Kg, rows, Kg, g.K);
      if (pw) {
        gemm(dY, Wg, row_major(gxb + gi * Cg, rows, Cg, g.C), false);
        continue;
      }
      gemm(dY, Wg, row_major(dpatches, rows, Ckk, Ckk), false);
      row2im(dpatches, gxb, n1 - n0, gi * Cg, Cg, g);
    }
  };
  for_nhwc_blocks<T>(g, nt, /*with_scratch=*/true, /*any_order=*/true, block);
}

// ------------------------------------------------------------------------- backward: weight

template <class T>
void backward_weight_impl(const Tensor& gw, const Tensor& gb, const Tensor& gy, const Tensor& x,
                          const ConvGeometry& g) {
  const T* gyp = gy.data_ptr<T>();
  const T* xp = x.data_ptr<T>();
  const int64_t G = g.groups, Cg = g.C / G, Kg = g.K / G, Ckk = Cg * g.kh * g.kw;
  const int64_t OHW = g.OH * g.OW, HW = g.H * g.W;
  const bool pw = is_pointwise(g);
  const bool want_w = gw.defined(), want_b = gb.defined();
  if (want_w && winograd_applies(g, dtype_of<T>::value) && winograd_backward_weight(xp, gyp, gw.data_ptr<T>(), g)) {
    if (want_b) backward_weight_impl<T>(Tensor(), gb, gy, x, g);
    return;
  }
  const int nt = threads_for(g);
  // Per-thread partial sums: dW in the kernel's column order ([K, Cg*kh*kw] for NCHW,
  // [K, kh*kw*Cg] for NHWC) and db.
  std::vector<std::vector<T>> dws(nt), dbs(nt);
  auto init = [&](int t) {
    if (want_w && dws[t].empty()) dws[t].assign(g.K * Ckk, T(0));
    if (want_b && dbs[t].empty()) dbs[t].assign(g.K, T(0));
  };
  if (!g.channels_last) {
    for_nchw_blocks<T>(g, nt, /*any_order=*/false, [&](int t, const NchwBlock& b, std::vector<T>& buf) {
      init(t);
      if (want_b)
        for (int64_t n = b.n0; n < b.n0 + b.nb; ++n) {
          CMap<T> dY(gyp + n * g.K * OHW, g.K, OHW, OuterStride<>(OHW));
          Eigen::Map<Eigen::Matrix<T, Dynamic, 1>> db(dbs[t].data(), g.K);
          db += dY.rowwise().sum();
        }
      if (!want_w) return;
      T* scratch = b.scratch(buf, Ckk, g.K);
      add_block_weight_grad(dws[t].data(), b.gathered(gyp, scratch, g), xp + b.n0 * g.C * HW, b.nb, buf.data(), g);
    });
  } else {
    auto block = [&](int t, int64_t n0, int64_t n1, int64_t rows, T* patches) {
      init(t);
      for (int64_t gi = 0; gi < G; ++gi) {
        CMap<T> dY(gyp + n0 * OHW * g.K + gi * Kg, rows, Kg, OuterStride<>(g.K));
        if (want_b) {
          Eigen::Map<Eigen::Matrix<T, 1, Dynamic>> db(dbs[t].data() + gi * Kg, Kg);
          db += dY.colwise().sum();
        }
        if (!want_w) continue;
        const MatrixView<const T> P = nhwc_patches(xp, patches, n0, n1, gi, Cg, Ckk, pw, g);
        gemm(row_major(gyp + n0 * OHW * g.K + gi * Kg, rows, Kg, g.K).t(), P,
             row_major(dws[t].data() + gi * Kg * Ckk, Kg, Ckk, Ckk), true);
      }
    };
    for_nhwc_blocks<T>(g, nt, /*with_scratch=*/want_w, /*any_order=*/false, block);
  }
  // Sum the per-thread partials (threads that got no block have empty buffers).
  if (want_w) {
    std::vector<T> sum(g.K * Ckk, T(0));
    for (auto& d : dws)
      if (!d.empty())
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += d[i];
    T* out = gw.data_ptr<T>();
    if (!g.channels_last) {
      std::copy(sum.begin(), sum.end(), out);
    } else {  // [K, kh, kw, Cg] -> [K, Cg, kh, kw]
      const int64_t khw = g.kh * g.kw;
      for (int64_t k = 0; k < g.K; ++k)
        for (int64_t c = 0; c < Cg; ++c)
          for (int64_t s = 0; s < khw; ++s) out[(k * Cg + c) * khw + s] = sum[(k * khw + s) * Cg + c];
    }
  }
  if (want_b) {
    T* out = gb.data_ptr<T>();
    std::fill(out, out + g.K, T(0));
    for (auto& d : dbs)
      if (!d.empty())
        for (int64_t k = 0; k < g.K; ++k) out[k] += d[k];
  }
}

void check_geometry(const char* op, const ConvGeometry& g) {
  KILN_CHECK(g.groups >= 1 && g.C % g.groups == 0 && g.K % g.groups == 0, op, ": groups ", g.groups, " must divide C ",
             g.C, " and K ", g.K);
  KILN_CHECK(g.OH >= 0 && g.OW >= 0 && g.sh > 0 && g.sw > 0 && g.dh > 0 && g.dw > 0, op, ": bad geometry");
}

Tensor contiguous_weight(const Tensor& w) { return contiguous(w); }

// ------------------------------------------------------------------------- layout autotuning

enum class Direction : int { Forward = 0, BackwardInput = 1, BackwardWeight = 2 };

using cpu_conv::Autotuner;
using cpu_conv::autotuner;

std::string tune_key(Direction d, const ConvGeometry& g, DType dt) {
  std::vector<int64_t> v = g.fields();
  v.insert(v.end(),
           {static_cast<int64_t>(d), static_cast<int64_t>(dt), omp_get_max_threads(), ::kiln::detail::cpu_isa_level()});
  return "cpu-conv:" + std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t));
}

// The geometry with the other memory format, and a copy of t in it.
ConvGeometry flipped(const ConvGeometry& g) {
  ConvGeometry f = g;
  f.channels_last = !g.channels_last;
  return f;
}
MemoryFormat format_of(const ConvGeometry& g) {
  return g.channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
}
Tensor converted(const Tensor& t, const ConvGeometry& to) {
  Tensor c = empty_4d(t.sizes(), t.options(), format_of(to));
  copy(c, t);
  return c;
}

// Runs `native` (the kernel in the tensors' layout) or `other` (the other layout's kernel on
// converted copies, writing the same outputs). Both overwrite their outputs, so timing runs are
// harmless; the chosen variant runs last, so the result is the one later calls will produce.
template <class Native, class Other>
void run_tuned(Direction d, const ConvGeometry& g, DType dt, Native&& native, Other&& other) {
  Autotuner& tuner = autotuner();
  if (!tuner.enabled.load(std::memory_order_relaxed)) return native();
  const std::string key = tune_key(d, g, dt);
  if (const std::optional<bool> hit = tuner.use_other.find(key)) return *hit ? other() : native();
  auto seconds = [](auto& f) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // The first run of each pays for page faults and scratch buffers: time the second.
  native();
  const double t_native = seconds(native);
  other();
  const double t_other = seconds(other);
  const bool use_other = t_other < t_native;
  tuner.use_other.store(key, use_other);
  if (!use_other) native();
}

// run_tuned for impl(dst, src, geometry), which writes dst: the other layout's variant runs it on
// a converted src into a scratch dst in that layout, then copies the scratch back.
template <class Impl>
void run_tuned_into(Direction d, const ConvGeometry& g, DType dt, const Tensor& dst, const Tensor& src, Impl&& impl) {
  run_tuned(
      d, g, dt, [&] { impl(dst, src, g); },
      [&] {
        const ConvGeometry f = flipped(g);
        Tensor scratch = empty_4d(dst.sizes(), dst.options(), format_of(f));
        impl(scratch, converted(src, f), f);
        copy(dst, scratch);
      });
}

// Runs f(float{}) or f(double{}), the dtypes of the CPU kernels; others are an error.
template <class F> void dispatch_conv_dtype(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::F32: return f(float{});
    case DType::F64: return f(double{});
    default: KILN_FAIL(op, ": dtype ", dt, " is not supported by the CPU kernel");
  }
}

}  // namespace

void conv2d_forward(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias,
                    const ConvGeometry& g) {
  check_geometry("conv2d", g);
  check_layout("conv2d", x, "input", g);
  check_layout("conv2d", out, "output", g);
  if (out.numel() == 0) return;
  Tensor w = contiguous_weight(weight);
  Tensor b = bias.defined() ? contiguous(bias) : Tensor();
  dispatch_conv_dtype(x.dtype(), "conv2d", [&](auto tag) {
    using T = decltype(tag);
    run_tuned_into(Direction::Forward, g, x.dtype(), out, x,
                   [&](const Tensor& o, const Tensor& in, const ConvGeometry& f) { forward_impl<T>(o, in, w, b, f); });
  });
}
KILN_REGISTER_KERNEL(kernels::conv2d_forward, CPU, conv2d_forward);

void conv2d_forward_epilogue(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias,
                             const ConvGeometry& g, const SamplesDone& samples_done) {
  const char* op = "conv2d_forward_epilogue";
  check_geometry(op, g);
  KILN_CHECK(!g.channels_last, op, ": the NCHW kernel only");
  check_layout(op, x, "input", g);
  check_layout(op, out, "output", g);
  if (out.numel() == 0) return;
  Tensor w = contiguous_weight(weight);
  Tensor b = bias.defined() ? contiguous(bias) : Tensor();
  dispatch_conv_dtype(x.dtype(), "conv2d",
                      [&](auto tag) { forward_impl<decltype(tag)>(out, x, w, b, g, samples_done); });
}

namespace {

template <class T>
void backward_generated_impl(const Tensor& gx, const Tensor& gw, const Tensor& x, const Tensor& w_t,
                             const ConvGeometry& g, const std::function<void(int64_t, void*)>& make_dy) {
  const T* xp = x.data_ptr<T>();
  const T* wp = w_t.data_ptr<T>();
  T* gxp = gx.defined() ? gx.data_ptr<T>() : nullptr;
  const int64_t Ckk = g.C / g.groups * g.kh * g.kw;
  const int64_t OHW = g.OH * g.OW, HW = g.H * g.W;
  const bool pw = is_pointwise(g), want_w = gw.defined();
  if (winograd_applies(g, dtype_of<T>::value) &&
      winograd_backward_generated(xp, wp, gxp, want_w ? gw.data_ptr<T>() : nullptr, g, make_dy))
    return;
  const int nt = threads_for(g);
  std::vector<std::vector<T>> dws(nt), dys(nt), cols(nt);
  std::vector<PackedLhs<T>> wt;
  if (gxp) wt = packed_weight(wp, g, true);
  // static split: the weight gradient's per-thread sums are combined in thread order below
  for_blocks(g.N, 1, nt, [&](int t, int64_t n, int64_t) {
    auto& dy = dys[t];
    auto& col = cols[t];
    if (dy.empty()) {
      dy.resize(g.K * OHW);
      if (!pw) col.resize(Ckk * OHW);
      if (want_w) dws[t].assign(g.K * Ckk, T(0));
    }
    make_dy(n, dy.data());
    if (want_w) add_block_weight_grad(dws[t].data(), dy.data(), xp + n * g.C * HW, 1, col.data(), g);
    // col is free again: the weight gradient is done with it
    if (gxp) block_input_grad(gxp + n * g.C * HW, dy.data(), 1, wt, col.data(), g);
  });
  if (want_w) {
    T* out = gw.data_ptr<T>();
    std::fill(out, out + g.K * Ckk, T(0));
    for (auto& d : dws)
      if (!d.empty())
        for (int64_t i = 0; i < g.K * Ckk; ++i) out[i] += d[i];
  }
}

}  // namespace

void conv2d_backward_generated(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& x, const Tensor& weight,
                               const ConvGeometry& g, const std::function<void(int64_t n, void* dy)>& make_dy) {
  const char* op = "conv2d_backward_generated";
  check_geometry(op, g);
  KILN_CHECK(!g.channels_last, op, ": the NCHW kernel only");
  check_layout(op, x, "input", g);
  if (grad_x.defined()) check_layout(op, grad_x, "grad_input", g);
  KILN_CHECK(!grad_weight.defined() || (grad_weight.is_contiguous() && grad_weight.sizes() == weight.sizes()), op,
             ": grad_weight must be contiguous like the weight");
  if (g.N == 0) {
    if (grad_weight.defined()) fill(grad_weight, 0.0);
    return;
  }
  Tensor w = contiguous_weight(weight);
  dispatch_conv_dtype(x.dtype(), op,
                      [&](auto tag) { backward_generated_impl<decltype(tag)>(grad_x, grad_weight, x, w, g, make_dy); });
}

void conv2d_backward_input(const Tensor& grad_x, const Tensor& grad_out, const Tensor& weight, const ConvGeometry& g) {
  check_geometry("conv2d_backward_input", g);
  check_layout("conv2d_backward_input", grad_x, "grad_input", g);
  check_layout("conv2d_backward_input", grad_out, "grad_output", g);
  if (grad_x.numel() == 0) return;
  if (grad_out.numel() == 0) {
    fill(grad_x, 0.0);
    return;
  }
  Tensor w = contiguous_weight(weight);
  dispatch_conv_dtype(grad_x.dtype(), "conv2d_backward_input", [&](auto tag) {
    using T = decltype(tag);
    run_tuned_into(
        Direction::BackwardInput, g, grad_x.dtype(), grad_x, grad_out,
        [&](const Tensor& gx, const Tensor& gy, const ConvGeometry& f) { backward_input_impl<T>(gx, gy, w, f); });
  });
}
KILN_REGISTER_KERNEL(kernels::conv2d_backward_input, CPU, conv2d_backward_input);

void conv2d_backward_weight(const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_out, const Tensor& x,
                            const ConvGeometry& g) {
  check_geometry("conv2d_backward_weight", g);
  check_layout("conv2d_backward_weight", x, "input", g);
  check_layout("conv2d_backward_weight", grad_out, "grad_output", g);
  KILN_CHECK(!grad_weight.defined() || grad_weight.is_contiguous(),
             "conv2d_backward_weight: grad_weight must be contiguous");
  if (grad_out.numel() == 0) {
    if (grad_weight.defined()) fill(grad_weight, 0.0);
    if (grad_bias.defined()) fill(grad_bias, 0.0);
    return;
  }
  dispatch_conv_dtype(x.dtype(), "conv2d_backward_weight", [&](auto tag) {
    using T = decltype(tag);
    run_tuned(
        Direction::BackwardWeight, g, x.dtype(),
        [&] { backward_weight_impl<T>(grad_weight, grad_bias, grad_out, x, g); },
        [&] {
          const ConvGeometry f = flipped(g);
          backward_weight_impl<T>(grad_weight, grad_bias, converted(grad_out, f), converted(x, f), f);
        });
  });
}
KILN_REGISTER_KERNEL(kernels::conv2d_backward_weight, CPU, conv2d_backward_weight);

// Both gradients: a Winograd convolution whose samples fit a chunk transforms grad_out once for
// both (winograd_backward_both); anything else (or a non-finite value there) runs the two
// kernels above, which also keep the autotuner's choices when it is on.
void conv2d_backward(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_out,
                     const Tensor& x, const Tensor& weight, const ConvGeometry& g) {
  check_geometry("conv2d_backward", g);
  check_layout("conv2d_backward", x, "input", g);
  check_layout("conv2d_backward", grad_x, "grad_input", g);
  check_layout("conv2d_backward", grad_out, "grad_output", g);
  KILN_CHECK(grad_weight.defined() && grad_weight.is_contiguous() && grad_weight.sizes() == weight.sizes(),
             "conv2d_backward: grad_weight must be contiguous like the weight");
  if (x.dtype() == DType::F32 && grad_out.numel() > 0 && grad_x.numel() > 0 && !autotuner().enabled &&
      winograd_applies(g, x.dtype())) {
    const Tensor w = contiguous_weight(weight);
    if (winograd_backward_both(x.data_ptr<float>(), grad_out.data_ptr<float>(), w.data_ptr<float>(),
                               grad_x.data_ptr<float>(), grad_weight.data_ptr<float>(), g)) {
      if (grad_bias.defined()) conv2d_backward_weight(Tensor(), grad_bias, grad_out, x, g);
      return;
    }
  }
  conv2d_backward_input(grad_x, grad_out, weight, g);
  conv2d_backward_weight(grad_weight, grad_bias, grad_out, x, g);
}
KILN_REGISTER_KERNEL(kernels::conv2d_backward, CPU, conv2d_backward);

}  // namespace kiln::kernels::cpu
