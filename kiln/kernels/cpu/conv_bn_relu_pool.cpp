// Fused conv2d -> BatchNorm -> ReLU -> 2x2/2 max pool on the CPU, for convolutions with a small
// patch (C * kh * kw <= 32, stride 1, groups 1, no conv bias): the first block of a CNN. There
// the conv output y is the biggest tensor of the network while costing almost nothing to compute
// (9 multiply-adds per element for Fashion-MNIST's 1 -> 32 3x3 conv), so the unfused block is
// bound by writing and re-reading y and its gradient (~13 MB each way per batch of 128). Here y
// is never written.
//
// Statistics. y_k = w_k . z for the patch z at each output position (zero padding included), so
// the batch mean and variance of channel k follow from the patch moments over all P = N*OH*OW
// positions, s = sum z and G = sum z z^T:
//   mean_k = w_k . s / P,   var_k = w_k^T (G / P - (s / P)(s / P)^T) w_k.
// One pass over the (small) input gives s and G: per-sample sums in T, f64 across samples.
//
// Forward. Per sample, each channel's conv plane is computed into a cache-resident buffer and
// pooled through y -> relu(fma(y, a_k, b_k)) by max_pool_2x2.h's row kernel (the same code and
// rounding as batch_norm_relu_max_pool2d), writing only the pooled output and a one-byte code
// per window: bit 0 the argmax's column, bit 1 its row, bit 2 whether its ReLU was on (out > 0 or NaN).
// The backward then reads 1 byte per pooled element besides the gradient, not 8 (int32 indices
// and the output for the mask).
//
// Backward. The gradient reaching BatchNorm is gout at each window's argmax where the ReLU was
// on (out > 0 or NaN) and 0 elsewhere. With S_k = sum of those gradients times the patch at their
// argmax and sum_g_k = sum of the gradients:
//   dot_k = sum g (y - mean_k) = w_k . S_k - mean_k sum_g_k,
// batch_norm_backward's coefficients give dy = g k1 + y k2 + k3, and the conv weight gradient is
//   dW_k = sum dy z = k1_k S_k + k2_k G w_k + k3_k s.
// Only pooled-size tensors and the input are read: one gather + FMA per pooled element.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/kernels/cpu/batch_norm_common.h"
#include "kiln/kernels/cpu/max_pool_2x2.h"
#include "kiln/kernels/conv_block.h"
#include "kiln/kernels/norm.h"

namespace kiln::kernels::cpu {

namespace {

constexpr int64_t kLanes = 16;  // one AVX-512 register of floats; the unit of the inner loops

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// The patch geometry of one sample: the zero-padded input planes (rows wide enough for whole
// 16-lane chunks of output columns) and, per tap t = (c, ki, kj), its offset in them.
struct Patches {
  int64_t C, H, W, ph, pw, OH, OW, OWr, Hp, Wp, Ckk, Zs;
  std::vector<int64_t> tap_offset;

  explicit Patches(const ConvGeometry& g)
      : C(g.C),
        H(g.H),
        W(g.W),
        ph(g.ph),
        pw(g.pw),
        OH(g.OH),
        OW(g.OW),
        OWr(round_up(g.OW, kLanes)),
        Hp(g.H + 2 * g.ph),
        Wp(std::max(g.W + 2 * g.pw, round_up(g.OW, kLanes) + (g.kw - 1) * g.dw)),
        Ckk(g.C * g.kh * g.kw),
        Zs(round_up(g.C * g.kh * g.kw + 1, kLanes)) {
    for (int64_t c = 0; c < g.C; ++c)
      for (int64_t ki = 0; ki < g.kh; ++ki)
        for (int64_t kj = 0; kj < g.kw; ++kj) tap_offset.push_back((c * Hp + ki * g.dh) * Wp + kj * g.dw);
  }
  int64_t pad_size() const { return C * Hp * Wp; }

  // pad <- sample xs (C planes of H x W) with zero borders.
  template <class T> void fill_pad(T* pad, const T* xs) const {
    std::fill(pad, pad + pad_size(), T(0));
    for (int64_t c = 0; c < C; ++c)
      for (int64_t h = 0; h < H; ++h)
        std::copy(xs + (c * H + h) * W, xs + (c * H + h + 1) * W, pad + (c * Hp + h + ph) * Wp + pw);
  }

  // z <- the patch of every output position p = oh * OW + ow, patch-major ([OH * OW, Zs]), from
  // a filled pad. Lanes from Ckk on are left alone (set once by the caller: see backward). One position's
  // patch at a time, so each row of z is written while it is in L1 (z itself is not).
  template <class T> void fill_patches(T* z, const T* pad) const {
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<T, float>) {
      if (Zs == kLanes) {  // one 16-lane gather per position
        alignas(64) int32_t off[kLanes] = {};
        for (int64_t t = 0; t < Ckk; ++t) off[t] = static_cast<int32_t>(tap_offset[t]);
        const __m512i vo = _mm512_load_si512(off);
        const __mmask16 m = static_cast<__mmask16>((1u << Ckk) - 1);
        for (int64_t oh = 0; oh < OH; ++oh)
          for (int64_t ow = 0; ow < OW; ++ow)
            _mm512_mask_storeu_ps(z + (oh * OW + ow) * Zs, m,
                                  _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, vo, pad + oh * Wp + ow, 4));
        return;
      }
    }
#elif defined(__AVX2__)
    if constexpr (std::is_same_v<T, float>) {
      if (Zs == kLanes) {  // the same with two 8-lane gathers per position
        alignas(32) int32_t off[kLanes] = {}, on[kLanes] = {};
        for (int64_t t = 0; t < Ckk; ++t) off[t] = static_cast<int32_t>(tap_offset[t]), on[t] = -1;
        const __m256i vo0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(off));
        const __m256i vo1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(off + 8));
        const __m256i m0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(on));
        const __m256i m1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(on + 8));
        for (int64_t oh = 0; oh < OH; ++oh)
          for (int64_t ow = 0; ow < OW; ++ow) {
            const float* src = pad + oh * Wp + ow;
            float* dst = z + (oh * OW + ow) * Zs;
            _mm256_maskstore_ps(dst, m0,
                                _mm256_mask_i32gather_ps(_mm256_setzero_ps(), src, vo0, _mm256_castsi256_ps(m0), 4));
            _mm256_maskstore_ps(dst + 8, m1,
                                _mm256_mask_i32gather_ps(_mm256_setzero_ps(), src, vo1, _mm256_castsi256_ps(m1), 4));
          }
        return;
      }
    }
#endif
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        const T* src = pad + oh * Wp + ow;
        T* dst = z + (oh * OW + ow) * Zs;
        for (int64_t t = 0; t < Ckk; ++t) dst[t] = src[tap_offset[t]];
      }
  }
};

void check_block(const char* op, const Tensor& x, const Tensor& w, const ConvGeometry& g) {
  KILN_CHECK(x.dim() == 4 && x.is_contiguous() && x.sizes() == IntList({g.N, g.C, g.H, g.W}), op,
             ": expected a contiguous NCHW input of sizes ", IntList({g.N, g.C, g.H, g.W}), ", got sizes ", x.sizes(),
             " strides ", x.strides());
  KILN_CHECK(x.dtype() == DType::F32 || x.dtype() == DType::F64, op, ": the fused kernel takes f32 or f64, got ",
             x.dtype());
  KILN_CHECK(w.dtype() == x.dtype() && w.is_contiguous() && w.sizes() == IntList({g.K, g.C, g.kh, g.kw}), op,
             ": conv weight must be a contiguous ", IntList({g.K, g.C, g.kh, g.kw}), " ", x.dtype(),
             " tensor, got sizes ", w.sizes(), " dtype ", w.dtype());
  KILN_CHECK(g.groups == 1 && g.sh == 1 && g.sw == 1 && !g.channels_last, op,
             ": the fused kernel needs stride 1, groups 1 and NCHW memory");
  KILN_CHECK(g.C * g.kh * g.kw <= kConvBnPoolMaxPatch, op, ": patch C*kh*kw = ", g.C * g.kh * g.kw,
             " is larger than the fused kernel's ", kConvBnPoolMaxPatch);
  KILN_CHECK(g.ph >= 0 && g.pw >= 0 && g.dh >= 1 && g.dw >= 1 && g.OH == g.H + 2 * g.ph - g.dh * (g.kh - 1) &&
                 g.OW == g.W + 2 * g.pw - g.dw * (g.kw - 1),
             op, ": inconsistent geometry (output ", g.OH, "x", g.OW, " for input ", g.H, "x", g.W, ", padding ", g.ph,
             ",", g.pw, ", dilation ", g.dh, ",", g.dw, ")");
  KILN_CHECK(g.OH >= 2 && g.OW >= 2, op, ": the conv output ", g.OH, "x", g.OW,
             " is smaller than the 2x2 pooling window");
}

// mean / invstd / var ([K], the stat dtype) and BatchNorm's weight / bias / their gradients ([K],
// x's dtype): each checked when defined.
void check_channel_vectors(const char* op, const ConvGeometry& g, DType dt, std::initializer_list<const Tensor*> stats,
                           std::initializer_list<const Tensor*> params) {
  const DType st = dt == DType::F64 ? DType::F64 : DType::F32;
  for (const Tensor* t : stats)
    KILN_CHECK(!t->defined() || (t->is_contiguous() && t->numel() == g.K && t->dtype() == st), op,
               ": statistics must be contiguous [", g.K, "] ", st, " tensors, got sizes ", t->sizes(), " dtype ",
               t->dtype());
  for (const Tensor* t : params)
    KILN_CHECK(!t->defined() || (t->is_contiguous() && t->numel() == g.K && t->dtype() == dt), op,
               ": BatchNorm parameters and their gradients must be contiguous [", g.K, "] ", dt, " tensors, got sizes ",
               t->sizes(), " dtype ", t->dtype());
}

void check_pooled(const char* op, const Tensor& t, const ConvGeometry& g, DType dt) {
  KILN_CHECK(
      t.defined() && t.is_contiguous() && t.dtype() == dt && t.sizes() == IntList({g.N, g.K, g.OH / 2, g.OW / 2}), op,
      ": pooled operand must be a contiguous ", dt, " tensor of sizes ", IntList({g.N, g.K, g.OH / 2, g.OW / 2}),
      ", got sizes ", t.sizes(), " dtype ", t.dtype());
}

template <class F> void dispatch_f32_f64(DType t, F&& f) {
  if (t == DType::F64) f(TypeTag<double>{});
  else f(TypeTag<float>{});
}

// Sum of per-thread partial vectors in thread order (deterministic for a fixed thread count).
std::vector<double> sum_partials(const std::vector<std::vector<double>>& parts, size_t n) {
  std::vector<double> r(n, 0.0);
  for (const auto& p : parts)
    for (size_t i = 0; i < p.size(); ++i) r[i] += p[i];
  return r;
}

bool parallel_worth_it(const ConvGeometry& g) { return g.N * g.K * g.OH * g.OW >= 32768; }

// One pooled row's window codes (max_pool_2x2.h) decoded for the backward, keeping only the
// windows whose ReLU was on (about half): their gradients go to gv and their argmax's flat index
// in the conv plane to pos, packed; returns how many. base: the flat index of the window row's
// first element, ow: the plane's width. gv and pos need 16 elements of slack past the count.
template <class T>
int64_t decode_windows(const uint8_t* codes, const T* g, T* gv, int32_t* pos, int64_t n, int32_t base, int32_t ow) {
  int64_t o = 0, cnt = 0;
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)  // the byte load
  if constexpr (std::is_same_v<T, float>) {
    const __m512i lane2 = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i one = _mm512_set1_epi32(1), two = _mm512_set1_epi32(2), four = _mm512_set1_epi32(4);
    for (; o < n; o += 16) {
      const __mmask16 m = static_cast<__mmask16>(n - o >= 16 ? 0xFFFF : (1u << (n - o)) - 1);
      const __m512i c = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, codes + o));
      const __mmask16 on = static_cast<__mmask16>(_mm512_test_epi32_mask(c, four) & m);
      const __m512i p = _mm512_add_epi32(
          _mm512_add_epi32(_mm512_set1_epi32(base + 2 * static_cast<int32_t>(o)), lane2),
          _mm512_add_epi32(_mm512_and_si512(c, one), _mm512_maskz_set1_epi32(_mm512_test_epi32_mask(c, two), ow)));
      // packed in registers, then full-width stores (the excess is overwritten next or is slack):
      // the gather loop reloads these at once, and a masked store could not forward to it
      _mm512_storeu_ps(gv + cnt, _mm512_maskz_compress_ps(on, _mm512_maskz_loadu_ps(on, g + o)));
      _mm512_storeu_si512(pos + cnt, _mm512_maskz_compress_epi32(on, p));
      cnt += __builtin_popcount(on);
    }
    return cnt;
  }
#endif
  // branch-free: every window is written, and kept by advancing past it only when its ReLU was
  // on (a branch on that mispredicts about half the time)
  for (; o < n; ++o) {
    const int32_t c = codes[o];
    gv[cnt] = g[o];
    pos[cnt] = base + 2 * static_cast<int32_t>(o) + (c & 1) + ((c >> 1) & 1) * ow;
    cnt += (c >> 2) & 1;
  }
  return cnt;
}

}  // namespace

bool conv_batch_norm_stats(const Tensor& mean, const Tensor& invstd, const Tensor& var, const Tensor& patch_sum,
                           const Tensor& gram, const Tensor& x, const Tensor& conv_weight, const ConvGeometry& g,
                           double eps) {
  const char* op = "conv2d_batch_norm_relu_max_pool2d";
  check_block(op, x, conv_weight, g);
  KILN_CHECK(mean.defined() && invstd.defined(), op, ": mean and invstd are outputs and must be given");
  check_channel_vectors(op, g, x.dtype(), {&mean, &invstd, &var}, {});
  bool conditioned = true;
  const Patches pt(g);
  const int64_t Ckk = pt.Ckk, P = g.N * g.OH * g.OW;
  KILN_CHECK(patch_sum.dtype() == DType::F64 && patch_sum.numel() == Ckk && gram.dtype() == DType::F64 &&
                 gram.numel() == Ckk * Ckk && patch_sum.is_contiguous() && gram.is_contiguous(),
             op, ": patch_sum [", Ckk, "] and gram [", Ckk, ", ", Ckk, "] must be contiguous f64");
  dispatch_f32_f64(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    using ST = stat_t<T>;
    // var_k is a difference of second moments: with per-sample sums in T, an input whose mean
    // dwarfs its spread leaves too few digits (caller falls back to the composite path)
    const double min_var_ratio = std::is_same_v<T, float> ? 1e-3 : 1e-9;
    const T* xp = cptr<T>(x);
    const int nt = parallel_worth_it(g) ? omp_get_max_threads() : 1;
    // per thread, f64: [Ckk * Ckk] gram then [Ckk] sums
    std::vector<std::vector<double>> parts(nt);
#pragma omp parallel num_threads(nt)
    {
      const int tid = omp_get_thread_num();
      // per sample, in T: 16-lane partial sums of z_t * z_u (u >= t) and of z_t
      std::vector<T> pad(pt.pad_size()), gl(Ckk * Ckk * kLanes), sl(Ckk * kLanes);
      std::vector<double>& acc = parts[tid];
      acc.assign(Ckk * Ckk + Ckk, 0.0);
#pragma omp for schedule(static)
      for (int64_t n = 0; n < g.N; ++n) {
        pt.fill_pad(pad.data(), xp + n * g.C * g.H * g.W);
        std::fill(gl.begin(), gl.end(), T(0));
        std::fill(sl.begin(), sl.end(), T(0));
        for (int64_t oh = 0; oh < g.OH; ++oh)
          for (int64_t c0 = 0; c0 < g.OW; c0 += kLanes) {
            // the taps' input vectors for 16 output columns, lanes past OW zeroed by a select (not
            // a multiply: with dilation such a lane can read an input column no patch uses, and a
            // NaN there times 0 would still be NaN)
            T v[kConvBnPoolMaxPatch][kLanes];
            const int64_t valid = g.OW - c0;
            const T* src0 = pad.data() + oh * pt.Wp + c0;
            for (int64_t t = 0; t < Ckk; ++t) {
              const T* src = src0 + pt.tap_offset[t];
#pragma omp simd
              for (int64_t l = 0; l < kLanes; ++l) v[t][l] = l < valid ? src[l] : T(0);
            }
            for (int64_t t = 0; t < Ckk; ++t) {
              T* row = gl.data() + t * Ckk * kLanes;
              for (int64_t u = t; u < Ckk; ++u) {
#pragma omp simd
                for (int64_t l = 0; l < kLanes; ++l) row[u * kLanes + l] += v[t][l] * v[u][l];
              }
#pragma omp simd
              for (int64_t l = 0; l < kLanes; ++l) sl[t * kLanes + l] += v[t][l];
            }
          }
        for (int64_t t = 0; t < Ckk; ++t) {
          for (int64_t u = t; u < Ckk; ++u) {
            double d = 0;
            for (int64_t l = 0; l < kLanes; ++l) d += static_cast<double>(gl[(t * Ckk + u) * kLanes + l]);
            acc[t * Ckk + u] += d;
          }
          double d = 0;
          for (int64_t l = 0; l < kLanes; ++l) d += static_cast<double>(sl[t * kLanes + l]);
          acc[Ckk * Ckk + t] += d;
        }
      }
    }
    const std::vector<double> tot = sum_partials(parts, Ckk * Ckk + Ckk);
    double* sp = mptr<double>(patch_sum);
    double* gp = mptr<double>(gram);
    for (int64_t t = 0; t < Ckk; ++t) {
      sp[t] = tot[Ckk * Ckk + t];
      for (int64_t u = 0; u < Ckk; ++u) gp[t * Ckk + u] = tot[std::min(t, u) * Ckk + std::max(t, u)];
    }
    // mean_k = w_k . mu, var_k = w_k^T (G / P - mu mu^T) w_k, in f64
    std::vector<double> mu(Ckk), cov(Ckk * Ckk);
    for (int64_t t = 0; t < Ckk; ++t) mu[t] = sp[t] / static_cast<double>(P);
    for (int64_t t = 0; t < Ckk; ++t)
      for (int64_t u = 0; u < Ckk; ++u) cov[t * Ckk + u] = gp[t * Ckk + u] / static_cast<double>(P) - mu[t] * mu[u];
    const T* wp = cptr<T>(conv_weight);
    ST* mp = mptr<ST>(mean);
    ST* ip = mptr<ST>(invstd);
    ST* vp = mptr<ST>(var);
    for (int64_t k = 0; k < g.K; ++k) {
      const T* wk = wp + k * Ckk;
      double m = 0, v = 0, second = 0;  // second: E[y^2]
      for (int64_t t = 0; t < Ckk; ++t) {
        m += static_cast<double>(wk[t]) * mu[t];
        double row = 0, row2 = 0;
        for (int64_t u = 0; u < Ckk; ++u) {
          row += cov[t * Ckk + u] * static_cast<double>(wk[u]);
          row2 += gp[t * Ckk + u] * static_cast<double>(wk[u]);
        }
        v += static_cast<double>(wk[t]) * row;
        second += static_cast<double>(wk[t]) * row2 / static_cast<double>(P);
      }
      if (v < min_var_ratio * second) conditioned = false;
      v = std::max(v, 0.0);  // rounding can take a (near-)constant channel's variance below 0
      mp[k] = static_cast<ST>(m);
      if (vp) vp[k] = static_cast<ST>(v);
      ip[k] = static_cast<ST>(1.0 / std::sqrt(v + eps));
    }
  });
  return conditioned;
}

void conv_batch_norm_relu_max_pool2x2_forward(const Tensor& out, const Tensor& codes, const Tensor& x,
                                              const Tensor& conv_weight, const ConvGeometry& g, const Tensor& weight,
                                              const Tensor& bias, const Tensor& mean, const Tensor& invstd) {
  const char* op = "conv2d_batch_norm_relu_max_pool2d";
  check_block(op, x, conv_weight, g);
  check_pooled(op, out, g, x.dtype());
  check_pooled(op, codes, g, DType::U8);
  KILN_CHECK(mean.defined() && invstd.defined(), op, ": mean and invstd must be given");
  check_channel_vectors(op, g, x.dtype(), {&mean, &invstd}, {&weight, &bias});
  if (out.numel() == 0) return;
  const Patches pt(g);
  dispatch_f32_f64(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto f = affine_maps<T>(weight, bias, mean, invstd, g.K);
    const T* xp = cptr<T>(x);
    T* outp = mptr<T>(out);
    uint8_t* cp = mptr<uint8_t>(codes);
    const int64_t Ckk = pt.Ckk, OWr = pt.OWr, plane = g.OH * OWr;
    constexpr int kBlock = 8;  // channels per step: 8 independent FMA chains hide the latency
    const int64_t Kp = round_up(g.K, kBlock), POH = g.OH / 2, POW = g.OW / 2;
    // conv weights [Kp, Ckk], the rows past K zero
    std::vector<T> wpad(Kp * Ckk, T(0));
    std::copy(cptr<T>(conv_weight), cptr<T>(conv_weight) + g.K * Ckk, wpad.begin());
    const int nt = parallel_worth_it(g) ? omp_get_max_threads() : 1;
#pragma omp parallel num_threads(nt)
    {
      std::vector<T> pad(pt.pad_size()), y(Kp * plane);
#pragma omp for schedule(dynamic, 1)  // samples are independent: a late or slow thread takes fewer
      for (int64_t n = 0; n < g.N; ++n) {
        pt.fill_pad(pad.data(), xp + n * g.C * g.H * g.W);
        // y[k] = conv plane k, 8 channels x 16 columns of R rows at a time (16 accumulators for
        // R = 2): each weight broadcast feeds R multiply-adds and each tap's input vector 8.
        auto conv_rows = [&](auto rows, int64_t oh) {
          constexpr int R = decltype(rows)::value;
          for (int64_t c0 = 0; c0 < OWr; c0 += kLanes) {
            const T* src0 = pad.data() + oh * pt.Wp + c0;
            for (int64_t k0 = 0; k0 < Kp; k0 += kBlock) {
              T acc[R][kBlock][kLanes] = {};
              const T* w0 = wpad.data() + k0 * Ckk;
              for (int64_t t = 0; t < Ckk; ++t) {
                const T* src = src0 + pt.tap_offset[t];
                for (int j = 0; j < kBlock; ++j) {
                  const T wv = w0[j * Ckk + t];
                  for (int r = 0; r < R; ++r) {
#pragma omp simd
                    for (int64_t l = 0; l < kLanes; ++l) acc[r][j][l] += wv * src[r * pt.Wp + l];
                  }
                }
              }
              for (int r = 0; r < R; ++r)
                for (int j = 0; j < kBlock; ++j)
                  std::copy(acc[r][j], acc[r][j] + kLanes, y.data() + (k0 + j) * plane + (oh + r) * OWr + c0);
            }
          }
        };
        int64_t oh = 0;
        for (; oh + 2 <= g.OH; oh += 2) conv_rows(std::integral_constant<int, 2>{}, oh);
        if (oh < g.OH) conv_rows(std::integral_constant<int, 1>{}, oh);
        for (int64_t k = 0; k < g.K; ++k) {
          const T* yk = y.data() + k * plane;
          const int64_t at = (n * g.K + k) * POH * POW;
          for (int64_t r = 0; r < POH; ++r) {
            pool2x2::max_2x2_row_pair(yk + 2 * r * OWr, yk + (2 * r + 1) * OWr, outp + at + r * POW,
                                      static_cast<int32_t*>(nullptr), POW, static_cast<int32_t>(2 * r * g.OW),
                                      static_cast<int32_t>(g.OW), f[k], static_cast<T*>(nullptr), cp + at + r * POW);
          }
        }
      }
    }
  });
}

void conv_batch_norm_relu_max_pool2x2_backward(const Tensor& dconv_weight, const Tensor& dweight, const Tensor& dbias,
                                               const Tensor& gout, const Tensor& codes, const Tensor& x,
                                               const Tensor& conv_weight, const ConvGeometry& g,
                                               const Tensor& patch_sum, const Tensor& gram, const Tensor& weight,
                                               const Tensor& mean, const Tensor& invstd, bool training) {
  const char* op = "conv2d_batch_norm_relu_max_pool2d_backward";
  check_block(op, x, conv_weight, g);
  check_pooled(op, gout, g, x.dtype());
  check_pooled(op, codes, g, DType::U8);
  KILN_CHECK(mean.defined() && invstd.defined(), op, ": mean and invstd must be given");
  check_channel_vectors(op, g, x.dtype(), {&mean, &invstd}, {&weight, &dweight, &dbias});
  const Patches pt(g);
  const int64_t Ckk = pt.Ckk, Zs = pt.Zs;
  KILN_CHECK(!training || (patch_sum.defined() && gram.defined() && patch_sum.numel() == Ckk &&
                           gram.numel() == Ckk * Ckk && patch_sum.dtype() == DType::F64 && gram.dtype() == DType::F64),
             op, ": training needs the forward's f64 patch_sum [", Ckk, "] and gram [", Ckk, ", ", Ckk, "]");
  KILN_CHECK(!dconv_weight.defined() || (dconv_weight.is_contiguous() && dconv_weight.sizes() == conv_weight.sizes()),
             op, ": dconv_weight must be contiguous like the conv weight");
  dispatch_f32_f64(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    using ST = stat_t<T>;
    const T* xp = cptr<T>(x);
    const T* gp = cptr<T>(gout);
    const uint8_t* cp = cptr<uint8_t>(codes);
    const int64_t POW = g.OW / 2, POHW = (g.OH / 2) * POW;
    // ---- S_k and sum_g_k: per sample, the patches once, then per channel a 4-way unrolled
    // gather + FMA over the pooled elements (4 accumulators hide the FMA latency). Lane Ckk of
    // every patch row is 1, so that lane of S_k sums the gradients: sum_g_k comes for free
    // instead of as a serial scalar sum.
    const int nt = parallel_worth_it(g) ? omp_get_max_threads() : 1;
    std::vector<std::vector<double>> parts(nt);  // per thread: [K * Zs] S (lane Ckk: sum_g)
#pragma omp parallel num_threads(nt)
    {
      const int tid = omp_get_thread_num();
      std::vector<T> pad(pt.pad_size()), z(g.OH * g.OW * Zs, T(0));
      for (int64_t p = 0; p < g.OH * g.OW; ++p) z[p * Zs + Ckk] = T(1);
      std::vector<T> gv_buf(POHW + kLanes);  // + slack for decode_windows' full-width stores
      std::vector<int32_t> pos_buf(POHW + kLanes);
      std::vector<double>& acc = parts[tid];
      acc.assign(g.K * Zs, 0.0);
#pragma omp for schedule(static)
      for (int64_t n = 0; n < g.N; ++n) {
        pt.fill_pad(pad.data(), xp + n * g.C * g.H * g.W);
        pt.fill_patches(z.data(), pad.data());
        for (int64_t k = 0; k < g.K; ++k) {
          const int64_t at = (n * g.K + k) * POHW;
          const T* gpl = gp + at;
          const uint8_t* cpl = cp + at;
          // the plane's gradients where the ReLU was on and their argmax positions (flat in the
          // conv output plane), vectorised ahead of the gather loop
          int64_t active = 0;
          for (int64_t r = 0; r < g.OH / 2; ++r)
            active += decode_windows(cpl + r * POW, gpl + r * POW, gv_buf.data() + active, pos_buf.data() + active, POW,
                                     static_cast<int32_t>(2 * r * g.OW), static_cast<int32_t>(g.OW));
          for (int64_t c0 = 0; c0 < Zs; c0 += kLanes) {
            T s[4][kLanes] = {};
            auto add = [&](T(&a)[kLanes], int64_t o) {
              const T gv = gv_buf[o];
              const T* zp = z.data() + static_cast<int64_t>(pos_buf[o]) * Zs + c0;
#pragma omp simd
              for (int64_t l = 0; l < kLanes; ++l) a[l] += gv * zp[l];
            };
            int64_t o = 0;
            for (; o + 4 <= active; o += 4) {
              add(s[0], o);
              add(s[1], o + 1);
              add(s[2], o + 2);
              add(s[3], o + 3);
            }
            for (; o < active; ++o) add(s[0], o);
            for (int64_t l = 0; l < kLanes; ++l)
              acc[k * Zs + c0 + l] += static_cast<double>(s[0][l] + s[1][l]) + static_cast<double>(s[2][l] + s[3][l]);
          }
        }
      }
    }
    const std::vector<double> tot = sum_partials(parts, g.K * Zs);
    const T* cw = cptr<T>(conv_weight);
    const T* wp = cptr<T>(weight);
    const ST* mp = cptr<ST>(mean);
    const ST* isp = cptr<ST>(invstd);
    std::vector<double> sum_g(g.K), dot(g.K);
    for (int64_t k = 0; k < g.K; ++k) {
      sum_g[k] = tot[k * Zs + Ckk];
      double d = 0;
      for (int64_t t = 0; t < Ckk; ++t) d += static_cast<double>(cw[k * Ckk + t]) * tot[k * Zs + t];
      dot[k] = d - static_cast<double>(mp[k]) * sum_g[k];
    }
    // coefficients in f64: k2 G w + k3 s below cancel for channels with a large mean
    std::vector<double> k1, k2, k3;
    const int64_t M = g.N * g.OH * g.OW;
    bn_backward_coefficients(g.K, M, training, wp, mp, isp, sum_g, dot, mptr<T>(dweight), mptr<T>(dbias), k1, k2, k3);
    if (!dconv_weight.defined()) return;
    // ---- dW_k = k1_k S_k + k2_k G w_k + k3_k s
    const double* sp = training ? cptr<double>(patch_sum) : nullptr;
    const double* gr = training ? cptr<double>(gram) : nullptr;
    T* dw = mptr<T>(dconv_weight);
    for (int64_t k = 0; k < g.K; ++k)
      for (int64_t t = 0; t < Ckk; ++t) {
        double v = k1[k] * tot[k * Zs + t];
        if (training) {
          double gw = 0;
          for (int64_t u = 0; u < Ckk; ++u) gw += gr[t * Ckk + u] * static_cast<double>(cw[k * Ckk + u]);
          v += k2[k] * gw + k3[k] * sp[t];
        }
        dw[k * Ckk + t] = static_cast<T>(v);
      }
  });
}

}  // namespace kiln::kernels::cpu

namespace kiln::kernels {

bool supports_conv_batch_norm_relu_max_pool2x2(const Tensor& x, const Tensor& conv_weight, const ConvGeometry& g) {
  if (!x.defined() || !conv_weight.defined() || !x.device().is_cpu() || !conv_weight.device().is_cpu()) return false;
  if ((x.dtype() != DType::F32 && x.dtype() != DType::F64) || conv_weight.dtype() != x.dtype()) return false;
  if (x.dim() != 4 || conv_weight.dim() != 4 || !x.is_contiguous() || g.channels_last) return false;
  if (g.groups != 1 || g.sh != 1 || g.sw != 1 || conv_weight.size(1) != g.C || g.N < 1 || g.K < 1) return false;
  if (g.C * g.kh * g.kw > kConvBnPoolMaxPatch || g.OH < 2 || g.OW < 2) return false;
  // each thread keeps a sample's conv planes in a buffer: meant for cache-sized planes
  return g.K * g.OH * (g.OW + 16) * static_cast<int64_t>(x.element_size()) <= (int64_t{8} << 20);
}

KILN_REGISTER_KERNEL(conv_batch_norm_stats, CPU, cpu::conv_batch_norm_stats);
KILN_REGISTER_KERNEL(conv_batch_norm_relu_max_pool2x2_forward, CPU, cpu::conv_batch_norm_relu_max_pool2x2_forward);
KILN_REGISTER_KERNEL(conv_batch_norm_relu_max_pool2x2_backward, CPU, cpu::conv_batch_norm_relu_max_pool2x2_backward);

}  // namespace kiln::kernels
