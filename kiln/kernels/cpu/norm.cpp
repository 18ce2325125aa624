// Fused batch norm and layer/RMS norm on the CPU, forward and backward.
//
// What they compute
//   batch norm, x viewed as [N, C, S]: per channel c, over the N*S elements,
//     y = (x - mean_c) * invstd_c * w_c + b_c,  invstd = 1 / sqrt(var_biased + eps)
//   row norm, x viewed as [R, K]: the same per row (layer norm), or y = x * invstd * w with
//     invstd = 1 / sqrt(mean(x^2) + eps) (RMS norm).
//
// Why they are fast
//   The composite formula (mean, sub, square, mean, add, rsqrt, mul, mul, add) reads and writes the
//   whole tensor ~10 times. Here the forward makes two passes over x (statistics, then y written
//   as x * a + b with per-channel a, b) and the backward two passes over (g, x): the two per-
//   channel sums, then dx written as g * k1 + x * k2 + k3. For batch norm on [N, C, S>1] the
//   threads split the channels; each channel's data is N runs of S contiguous elements, so the
//   inner loops are unit-stride and vectorize. For [N, C] (S = 1) each thread accumulates whole
//   rows into per-thread per-column sums, again unit-stride. Row norms split rows over threads;
//   the weight/bias gradients are per-thread column partials summed at the end.
//
// Fused ReLU (batch_norm_relu): the forward writes max(0, x * a + b) in pass 2; the backward
// recomputes the mask x * a + b > 0 from x with the forward's coefficients and expression
// (bn_pre) and masks g on load in both passes, so it reads (g, x) like the plain backward and
// the separate ReLU forward and backward passes disappear.
//
// Accuracy: sums are accumulated in double, on data shifted by the first element of the channel
// (or row) so that E[x^2] - E[x]^2 does not cancel catastrophically when |mean| >> std.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/kernels/cpu/batch_norm_common.h"
#include "kiln/kernels/math/pointwise.h"
#include "kiln/kernels/math/with_flag.h"
#include "kiln/kernels/norm.h"

namespace kiln::kernels::cpu {

namespace {

constexpr int64_t kGrain = 32768;  // below this many elements stay on the calling thread

void check_contig(const char* op, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    KILN_CHECK(!t->defined() || t->is_contiguous(), op, ": kernel expects contiguous operands, got sizes ", t->sizes(),
               " strides ", t->strides());
}

// [N, C, S] sizes of a batch-norm operand.
void ncs(const Tensor& x, int64_t& N, int64_t& C, int64_t& S) {
  N = x.size(0);
  C = x.size(1);
  S = 1;
  for (int64_t d = 2; d < x.dim(); ++d) S *= x.size(d);
}

}  // namespace

// ------------------------------------------------------------------------------ batch norm

namespace {

// y = x * a_c + b_c with the per-channel coefficients below: the one expression of the batch-norm
// output (before the optional ReLU). The fused backward recomputes the ReLU mask with it, so the
// mask is the forward's exactly (the same opmath values through the same operations).
template <class T, class O> inline O bn_pre(T x, O a, O b) { return static_cast<O>(x) * a + b; }

// Folds the statistics, weight and bias (either undefined: 1 / 0) into a_c = invstd_c * w_c and
// b_c = bias_c - mean_c * a_c.
template <class T, class O, class ST>
void bn_coefficients(int64_t C, const T* wp, const T* bp, const ST* mp, const ST* ip, std::vector<O>& a,
                     std::vector<O>& b) {
  a.resize(C);
  b.resize(C);
  for (int64_t c = 0; c < C; ++c) {
    O w = wp ? static_cast<O>(wp[c]) : O(1);
    O bb = bp ? static_cast<O>(bp[c]) : O(0);
    a[c] = static_cast<O>(ip[c]) * w;
    b[c] = bb - static_cast<O>(mp[c]) * a[c];
  }
}

// The gradient reaching the batch norm: g itself, or with the fused ReLU g where the
// pre-activation bn_pre(x, a, b) is positive or NaN, else 0 (ReLU's backward with the pre-activation in
// the role of its output, as math::ReluBackward).
template <bool kRelu, class T, class O> inline O bn_grad_in(T g, T x, O a, O b) {
  if constexpr (kRelu) return keep_or_zero(!(bn_pre(x, a, b) <= O(0)), static_cast<O>(g));
  else return static_cast<O>(g);
}

}  // namespace

void batch_norm_forward(const Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& mean,
                        const Tensor& invstd, const Tensor& var, bool training, double eps, bool relu) {
  const char* op = relu ? "batch_norm_relu" : "batch_norm";
  check_contig(op, {&y, &x, &weight, &bias, &mean, &invstd, &var});
  int64_t N, C, S;
  ncs(x, N, C, S);
  const int64_t M = N * S;
  dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using O = opmath_t<T>;
    using ST = stat_t<T>;
    const T* xp = cptr<T>(x);
    T* yp = mptr<T>(y);
    const T* wp = cptr<T>(weight);
    const T* bp = cptr<T>(bias);
    ST* mp = mptr<ST>(mean);
    ST* ip = mptr<ST>(invstd);
    ST* vp = training ? mptr<ST>(var) : nullptr;
    const bool par = x.numel() >= kGrain;

    // ---- pass 1: statistics
    if (training && M > 0) {
      if (S > 1 || N == 1) {
#pragma omp parallel for schedule(dynamic, 1) if (par)
        for (int64_t c = 0; c < C; ++c) {
          const double shift = static_cast<double>(xp[c * S]);
          double s = 0, ss = 0;
          for (int64_t n = 0; n < N; ++n) {
            const T* row = xp + (n * C + c) * S;
#pragma omp simd reduction(+ : s, ss)
            for (int64_t i = 0; i < S; ++i) {
              double d = static_cast<double>(row[i]) - shift;
              s += d;
              ss += d * d;
            }
          }
          double md = s / M, v = std::max(ss / M - md * md, 0.0);
          mp[c] = static_cast<ST>(shift + md);
          vp[c] = static_cast<ST>(v);
          ip[c] = static_cast<ST>(1.0 / std::sqrt(v + eps));
        }
      } else {  // [N, C]: accumulate rows into per-column sums
        std::vector<double> s(C, 0.0), ss(C, 0.0);
#pragma omp parallel if (par)
        {
          std::vector<double> ls(C, 0.0), lss(C, 0.0);
#pragma omp for schedule(static)
          for (int64_t n = 0; n < N; ++n) {
            const T* row = xp + n * C;
#pragma omp simd
            for (int64_t c = 0; c < C; ++c) {
              double d = static_cast<double>(row[c]) - static_cast<double>(xp[c]);
              ls[c] += d;
              lss[c] += d * d;
            }
          }
#pragma omp critical(kiln_bn_stats)
          for (int64_t c = 0; c < C; ++c) {
            s[c] += ls[c];
            ss[c] += lss[c];
          }
        }
        for (int64_t c = 0; c < C; ++c) {
          double md = s[c] / M, v = std::max(ss[c] / M - md * md, 0.0);
          mp[c] = static_cast<ST>(static_cast<double>(xp[c]) + md);
          vp[c] = static_cast<ST>(v);
          ip[c] = static_cast<ST>(1.0 / std::sqrt(v + eps));
        }
      }
    }

    if (!yp) return;  // statistics only (the fused BN + ReLU + max-pool writes its own output)

    // ---- pass 2: y = x * a + b per channel (then max(0, .) with the fused ReLU)
    std::vector<O> a, b;
    bn_coefficients(C, wp, bp, mp, ip, a, b);
    math::with_flag(relu, [&](auto relu_flag) {
      constexpr bool kRelu = decltype(relu_flag)::value;
      auto out = [](T xv, O ac, O bc) {
        const O v = bn_pre(xv, ac, bc);
        if constexpr (kRelu) return static_cast<T>(math::Relu{}(v));
        else return static_cast<T>(v);
      };
      if (S > 1) {
#pragma omp parallel for collapse(2) schedule(static) if (par)
        for (int64_t n = 0; n < N; ++n)
          for (int64_t c = 0; c < C; ++c) {
            const T* xr = xp + (n * C + c) * S;
            T* yr = yp + (n * C + c) * S;
            const O ac = a[c], bc = b[c];
#pragma omp simd
            for (int64_t i = 0; i < S; ++i) yr[i] = out(xr[i], ac, bc);
          }
      } else {
        const O* ap = a.data();
        const O* bq = b.data();
#pragma omp parallel for schedule(static) if (par)
        for (int64_t n = 0; n < N; ++n) {
          const T* xr = xp + n * C;
          T* yr = yp + n * C;
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) yr[c] = out(xr[c], ap[c], bq[c]);
        }
      }
    });
  });
}
KILN_REGISTER_KERNEL(kernels::batch_norm_forward, CPU, batch_norm_forward);

void batch_norm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& g, const Tensor& x,
                         const Tensor& weight, const Tensor& mean, const Tensor& invstd, bool training, bool relu,
                         const Tensor& bias) {
  const char* op = relu ? "batch_norm_relu_backward" : "batch_norm_backward";
  check_contig(op, {&dx, &dweight, &dbias, &g, &x, &weight, &bias, &mean, &invstd});
  int64_t N, C, S;
  ncs(x, N, C, S);
  const int64_t M = N * S;
  dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using O = opmath_t<T>;
    using ST = stat_t<T>;
    const T* xp = cptr<T>(x);
    const T* gp = cptr<T>(g);
    const T* wp = cptr<T>(weight);
    const ST* mp = cptr<ST>(mean);
    const ST* ip = cptr<ST>(invstd);
    T* dxp = mptr<T>(dx);
    T* dwp = mptr<T>(dweight);
    T* dbp = mptr<T>(dbias);
    const bool par = x.numel() >= kGrain;
    // Only the eval-mode dx needs no sums.
    const bool need_sums = dwp || dbp || (dxp && training);
    // The forward's y = x * a + b coefficients, for the ReLU mask.
    std::vector<O> ra, rb;
    if (relu) bn_coefficients(C, wp, cptr<T>(bias), mp, ip, ra, rb);

    math::with_flag(relu, [&](auto relu_flag) {
      constexpr bool kRelu = decltype(relu_flag)::value;
      // ---- pass 1: sum_g = sum(g), dot = sum(g * (x - mean)) per channel (g masked with relu)
      std::vector<double> sum_g(C, 0.0), dot(C, 0.0);
      if (need_sums && M > 0) {
        if (S > 1 || N == 1) {
#pragma omp parallel for schedule(dynamic, 1) if (par)
          for (int64_t c = 0; c < C; ++c) {
            const double m = static_cast<double>(mp[c]);
            const O rac = kRelu ? ra[c] : O(0), rbc = kRelu ? rb[c] : O(0);
            double s = 0, d = 0;
            for (int64_t n = 0; n < N; ++n) {
              const T* xr = xp + (n * C + c) * S;
              const T* gr = gp + (n * C + c) * S;
#pragma omp simd reduction(+ : s, d)
              for (int64_t i = 0; i < S; ++i) {
                double gv = static_cast<double>(bn_grad_in<kRelu>(gr[i], xr[i], rac, rbc));
                s += gv;
                d += gv * (static_cast<double>(xr[i]) - m);
              }
            }
            sum_g[c] = s;
            dot[c] = d;
          }
        } else {
          std::vector<double> mv(C);
          for (int64_t c = 0; c < C; ++c) mv[c] = static_cast<double>(mp[c]);
          const O* rap = ra.data();
          const O* rbp = rb.data();
#pragma omp parallel if (par)
          {
            std::vector<double> ls(C, 0.0), ld(C, 0.0);
#pragma omp for schedule(static)
            for (int64_t n = 0; n < N; ++n) {
              const T* xr = xp + n * C;
              const T* gr = gp + n * C;
#pragma omp simd
              for (int64_t c = 0; c < C; ++c) {
                double gv =
                    static_cast<double>(bn_grad_in<kRelu>(gr[c], xr[c], kRelu ? rap[c] : O(0), kRelu ? rbp[c] : O(0)));
                ls[c] += gv;
                ld[c] += gv * (static_cast<double>(xr[c]) - mv[c]);
              }
            }
#pragma omp critical(kiln_bn_bwd_sums)
            for (int64_t c = 0; c < C; ++c) {
              sum_g[c] += ls[c];
              dot[c] += ld[c];
            }
          }
        }
      }
      // ---- pass 2: dx = g * k1 + x * k2 + k3 per channel (g masked with relu)
      std::vector<O> k1, k2, k3;
      bn_backward_coefficients(C, M, training, wp, mp, ip, sum_g, dot, dwp, dbp, k1, k2, k3);
      if (!dxp) return;
      if (S > 1) {
#pragma omp parallel for collapse(2) schedule(static) if (par)
        for (int64_t n = 0; n < N; ++n)
          for (int64_t c = 0; c < C; ++c) {
            const int64_t base = (n * C + c) * S;
            const T* xr = xp + base;
            const T* gr = gp + base;
            T* dr = dxp + base;
            const O a1 = k1[c], a2 = k2[c], a3 = k3[c];
            const O rac = kRelu ? ra[c] : O(0), rbc = kRelu ? rb[c] : O(0);
#pragma omp simd
            for (int64_t i = 0; i < S; ++i)
              dr[i] = static_cast<T>(bn_grad_in<kRelu>(gr[i], xr[i], rac, rbc) * a1 +
                                     bn_x_term(static_cast<O>(xr[i]), a2) + a3);
          }
      } else {
        const O* p1 = k1.data();
        const O* p2 = k2.data();
        const O* p3 = k3.data();
        const O* rap = ra.data();
        const O* rbp = rb.data();
#pragma omp parallel for schedule(static) if (par)
        for (int64_t n = 0; n < N; ++n) {
          const T* xr = xp + n * C;
          const T* gr = gp + n * C;
          T* dr = dxp + n * C;
#pragma omp simd
          for (int64_t c = 0; c < C; ++c)
            dr[c] =
                static_cast<T>(bn_grad_in<kRelu>(gr[c], xr[c], kRelu ? rap[c] : O(0), kRelu ? rbp[c] : O(0)) * p1[c] +
                               bn_x_term(static_cast<O>(xr[c]), p2[c]) + p3[c]);
        }
      }
    });
  });
}
KILN_REGISTER_KERNEL(kernels::batch_norm_backward, CPU, batch_norm_backward);

// ------------------------------------------------------------------------------ row norms

void row_norm_forward(const Tensor& y, const Tensor& mean, const Tensor& invstd, const Tensor& x, const Tensor& weight,
                      const Tensor& bias, bool rms, double eps) {
  const char* op = rms ? "rms_norm" : "layer_norm";
  check_contig(op, {&y, &mean, &invstd, &x, &weight, &bias});
  const int64_t R = invstd.numel();
  const int64_t K = R > 0 ? x.numel() / R : 0;
  dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using O = opmath_t<T>;
    using ST = stat_t<T>;
    const T* xp = cptr<T>(x);
    T* yp = mptr<T>(y);
    const T* wp = cptr<T>(weight);
    const T* bp = rms ? nullptr : cptr<T>(bias);
    ST* mp = rms ? nullptr : mptr<ST>(mean);
    ST* ip = mptr<ST>(invstd);
#pragma omp parallel for schedule(static) if (x.numel() >= kGrain)
    for (int64_t r = 0; r < R; ++r) {
      const T* xr = xp + r * K;
      T* yr = yp + r * K;
      const double shift = rms || K == 0 ? 0.0 : static_cast<double>(xr[0]);
      double s = 0, ss = 0;
#pragma omp simd reduction(+ : s, ss)
      for (int64_t i = 0; i < K; ++i) {
        double d = static_cast<double>(xr[i]) - shift;
        s += d;
        ss += d * d;
      }
      double m = 0, is;
      if (rms) {
        is = 1.0 / std::sqrt(ss / K + eps);
      } else {
        double md = s / K;
        m = shift + md;
        is = 1.0 / std::sqrt(std::max(ss / K - md * md, 0.0) + eps);
        mp[r] = static_cast<ST>(m);
      }
      ip[r] = static_cast<ST>(is);
      const O mo = static_cast<O>(m), io = static_cast<O>(is);
      if (wp && bp) {
#pragma omp simd
        for (int64_t i = 0; i < K; ++i)
          yr[i] = static_cast<T>((static_cast<O>(xr[i]) - mo) * io * static_cast<O>(wp[i]) + static_cast<O>(bp[i]));
      } else if (wp) {
#pragma omp simd
        for (int64_t i = 0; i < K; ++i)
          yr[i] = static_cast<T>((static_cast<O>(xr[i]) - mo) * io * static_cast<O>(wp[i]));
      } else if (bp) {
#pragma omp simd
        for (int64_t i = 0; i < K; ++i)
          yr[i] = static_cast<T>((static_cast<O>(xr[i]) - mo) * io + static_cast<O>(bp[i]));
      } else {
#pragma omp simd
        for (int64_t i = 0; i < K; ++i) yr[i] = static_cast<T>((static_cast<O>(xr[i]) - mo) * io);
      }
    }
  });
}
KILN_REGISTER_KERNEL(kernels::row_norm_forward, CPU, row_norm_forward);

void row_norm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& g, const Tensor& x,
                       const Tensor& weight, const Tensor& mean, const Tensor& invstd, bool rms) {
  const char* op = rms ? "rms_norm_backward" : "layer_norm_backward";
  check_contig(op, {&dx, &dweight, &dbias, &g, &x, &weight, &mean, &invstd});
  const int64_t R = invstd.numel();
  const int64_t K = R > 0 ? x.numel() / R : 0;
  dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using O = opmath_t<T>;
    using ST = stat_t<T>;
    const T* xp = cptr<T>(x);
    const T* gp = cptr<T>(g);
    const T* wp = cptr<T>(weight);
    const ST* mp = rms ? nullptr : cptr<ST>(mean);
    const ST* ip = cptr<ST>(invstd);
    T* dxp = mptr<T>(dx);
    T* dwp = mptr<T>(dweight);
    T* dbp = rms ? nullptr : mptr<T>(dbias);
    std::vector<double> dw_all(dwp ? K : 0, 0.0), db_all(dbp ? K : 0, 0.0);
#pragma omp parallel if (x.numel() >= kGrain)
    {
      std::vector<double> dw_loc(dwp ? K : 0, 0.0), db_loc(dbp ? K : 0, 0.0);
      std::vector<O> gw(dxp ? K : 0);
#pragma omp for schedule(static)
      for (int64_t r = 0; r < R; ++r) {
        const T* xr = xp + r * K;
        const T* gr = gp + r * K;
        const O m = rms ? O(0) : static_cast<O>(mp[r]);
        const O is = static_cast<O>(ip[r]);
        if (dwp) {
          double* d = dw_loc.data();
#pragma omp simd
          for (int64_t i = 0; i < K; ++i)
            d[i] += static_cast<double>(static_cast<O>(gr[i]) * (static_cast<O>(xr[i]) - m) * is);
        }
        if (dbp) {
          double* d = db_loc.data();
#pragma omp simd
          for (int64_t i = 0; i < K; ++i) d[i] += static_cast<double>(gr[i]);
        }
        if (!dxp) continue;
        // gw = g * w; a = sum(gw) (layer norm only); b = sum(gw * xhat)
        double a = 0, b = 0;
        O* gwp = gw.data();
#pragma omp simd reduction(+ : a, b)
        for (int64_t i = 0; i < K; ++i) {
          O v = static_cast<O>(gr[i]) * (wp ? static_cast<O>(wp[i]) : O(1));
          gwp[i] = v;
          a += static_cast<double>(v);
          b += static_cast<double>(v) * static_cast<double>((static_cast<O>(xr[i]) - m) * is);
        }
        // dx = invstd * (gw - a / K - xhat * b / K), xhat = (x - m) * invstd (a = 0 for rms)
        const O ca = rms ? O(0) : static_cast<O>(a / K);
        const O cb = static_cast<O>(b / K);
        T* dr = dxp + r * K;
#pragma omp simd
        for (int64_t i = 0; i < K; ++i) {
          O xh = (static_cast<O>(xr[i]) - m) * is;
          dr[i] = static_cast<T>(is * (gwp[i] - ca - xh * cb));
        }
      }
#pragma omp critical(kiln_row_norm_bwd)
      {
        for (int64_t i = 0; i < static_cast<int64_t>(dw_loc.size()); ++i) dw_all[i] += dw_loc[i];
        for (int64_t i = 0; i < static_cast<int64_t>(db_loc.size()); ++i) db_all[i] += db_loc[i];
      }
    }
    for (int64_t i = 0; i < static_cast<int64_t>(dw_all.size()); ++i) dwp[i] = static_cast<T>(dw_all[i]);
    for (int64_t i = 0; i < static_cast<int64_t>(db_all.size()); ++i) dbp[i] = static_cast<T>(db_all[i]);
  });
}
KILN_REGISTER_KERNEL(kernels::row_norm_backward, CPU, row_norm_backward);

}  // namespace kiln::kernels::cpu
