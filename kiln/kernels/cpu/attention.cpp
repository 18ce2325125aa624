// Blocked scaled-dot-product attention on the CPU (the FlashAttention algorithm, written for
// caches instead of shared memory).
//
// What it computes: out = softmax(q k^T * scale [+ causal mask]) v per batch entry, and
// lse = log(sum(exp(scores))) per query row.
//
// Why it is shaped this way: a [T, T] score matrix per head is O(T^2) memory and, for long T,
// round-trips through DRAM. Here query rows are processed in blocks of kBlock; for each block the
// keys are visited block by block, the kBlock x kBlock scores are computed with one small GEMM,
// and an online softmax keeps a running max m and running sum l per row: when a new block raises
// the max, the accumulated output and sum are rescaled by exp(m_old - m_new). Only one block of
// scores per thread exists at a time. Causal blocks entirely above the diagonal are skipped.
//
// Operands are read where they lie: [B, H, T, D] views with any strides but a unit one in D, so
// the heads of a fused q/k/v projection and an output laid out as [B, T, H, D] need no copies.
//
// Backward recomputes each block of probabilities from the saved lse (P = exp(S - lse)), so
// nothing of size T x T is stored either. With D_i = sum(g_i * out_i):
//   dV = P^T g,  dP = g V^T,  dS = P * (dP - D),  dQ = dS K * scale,  dK = dS^T Q * scale.
// With at least two batch entries (heads) per thread, one pass per head computes each block's P
// and dS once for dQ, dK and dV. Otherwise dQ is computed in one parallel pass over query blocks
// and dK, dV in another over key blocks, so no two threads write the same rows (each pass
// recomputes P; no atomics).
#include <Eigen/Core>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/kernels/attention.h"
#include "kiln/kernels/cpu/gemm.h"
#include "kiln/kernels/cpu/loops.h"

namespace kiln::kernels::cpu {

namespace {

constexpr int64_t kBlock = 64;

template <class T> using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
// Row blocks of an output whose rows are `st` elements apart (a head of a strided view).
template <class T> using MMap = Eigen::Map<Mat<T>, 0, Eigen::OuterStride<>>;

template <class F> void dispatch_attention(DType t, const char* op, F&& f) {
  if (t == DType::F32) return f(TypeTag<float>{});
  if (t == DType::F64) return f(TypeTag<double>{});
  KILN_FAIL(op, ": the CPU kernel takes float32 or float64 (the op converts 16-bit types), got ", dtype_name(t));
}

// Sets S(i, j) = -inf where key k0 + j lies after query q0 + i (top-left aligned causal mask).
template <class T> void apply_causal(Mat<T>& S, int64_t q0, int64_t k0) {
  const T ninf = -std::numeric_limits<T>::infinity();
  for (int64_t i = 0; i < S.rows(); ++i) {
    int64_t first_masked = std::max<int64_t>(0, q0 + i + 1 - k0);
    for (int64_t j = first_masked; j < S.cols(); ++j) S(i, j) = ninf;
  }
}

// [B, H, T, D] (or [B, T, D], read as H = 1) with any strides but a unit one in D: the heads of
// a fused projection are read where they lie, without copies.
struct Layout {
  int64_t H = 1, sb = 0, sh = 0, st = 0;
  int64_t offset(int64_t bh, int64_t row) const { return (bh / H) * sb + (bh % H) * sh + row * st; }
};

Layout layout_of(const Tensor& t, const char* op) {
  KILN_CHECK((t.dim() == 3 || t.dim() == 4) && t.stride(-1) == 1, op,
             ": the CPU kernel takes [B, T, D] or [B, H, T, D] operands with a unit stride in D, "
             "got sizes ",
             t.sizes(), " strides ", t.strides());
  if (t.dim() == 3) return Layout{1, t.stride(0), 0, t.stride(1)};
  return Layout{t.size(1), t.stride(0), t.stride(1), t.stride(2)};
}

struct Dims {
  int64_t B, Tq, Tk, D, Dv;  // B counts every (batch, head) pair
};

// The blocks' products run on kiln's GEMM (kernels/cpu/gemm.h), one thread each: the loops over
// heads and blocks are the parallel ones. Rows `rs` apart, unit column stride.
template <class T> MatrixView<const T> rows_of(const T* p, int64_t rows, int64_t cols, int64_t rs) {
  return {p, rows, cols, rs, 1};
}
template <class T> MatrixView<T> rows_of(T* p, int64_t rows, int64_t cols, int64_t rs) {
  return {p, rows, cols, rs, 1};
}
template <class T> MatrixView<T> rows_of(Mat<T>& m) { return {m.data(), m.rows(), m.cols(), m.cols(), 1}; }
template <class T> void product(MatrixView<const T> a, MatrixView<const T> b, MatrixView<T> c, bool accumulate) {
  gemm(a, b, c, accumulate, /*threads=*/1);
}

Dims dims_of(const Tensor& q, const Tensor& k, const Tensor& v) {
  const int64_t B = q.dim() == 4 ? q.size(0) * q.size(1) : q.size(0);
  return Dims{B, q.size(-2), k.size(-2), q.size(-1), v.size(-1)};
}

}  // namespace

int64_t attention_block_size() { return kBlock; }

void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       double scale, bool causal) {
  const char* name = "scaled_dot_product_attention";
  KILN_CHECK(lse.is_contiguous(), name, ": lse must be contiguous");
  const Layout lq = layout_of(q, name), lk = layout_of(k, name), lv = layout_of(v, name), lo = layout_of(out, name);
  const Dims d = dims_of(q, k, v);
  const int64_t nqb = (d.Tq + kBlock - 1) / kBlock;
  dispatch_attention(q.dtype(), "scaled_dot_product_attention", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *qp = cptr<T>(q), *kp = cptr<T>(k), *vp = cptr<T>(v);
    T *op = mptr<T>(out), *lp = mptr<T>(lse);
    const T sc = static_cast<T>(scale);
    const T ninf = -std::numeric_limits<T>::infinity();
    const bool par = d.B * d.Tq * d.Tk * (d.D + d.Dv) >= 65536;
#pragma omp parallel for collapse(2) schedule(dynamic, 1) if (par)
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t qb = 0; qb < nqb; ++qb) {
        const int64_t q0 = qb * kBlock, nq = std::min(kBlock, d.Tq - q0);
        const auto Q = rows_of(qp + lq.offset(b, q0), nq, d.D, lq.st);
        Mat<T> acc = Mat<T>::Zero(nq, d.Dv), S, P;
        std::vector<T> m(nq, ninf), l(nq, T(0));
        const int64_t kend = causal ? std::min(d.Tk, q0 + nq) : d.Tk;
        for (int64_t k0 = 0; k0 < kend; k0 += kBlock) {
          const int64_t nk = std::min(kBlock, kend - k0);
          const auto K = rows_of(kp + lk.offset(b, k0), nk, d.D, lk.st);
          const auto V = rows_of(vp + lv.offset(b, k0), nk, d.Dv, lv.st);
          S.resize(nq, nk);
          product<T>(Q, K.t(), rows_of(S), false);
          S *= sc;
          if (causal && k0 + nk - 1 > q0) apply_causal(S, q0, k0);
          P.resize(nq, nk);
          for (int64_t i = 0; i < nq; ++i) {
            const T mnew = std::max(m[i], S.row(i).maxCoeff());
            if (mnew == ninf) {  // every key so far masked for this row
              P.row(i).setZero();
              continue;
            }
            const T corr = m[i] == ninf ? T(0) : std::exp(m[i] - mnew);
            P.row(i) = (S.row(i).array() - mnew).exp().matrix();
            l[i] = l[i] * corr + P.row(i).sum();
            if (corr != T(1)) acc.row(i) *= corr;
            m[i] = mnew;
          }
          product<T>(rows_of(P), V, rows_of(acc), true);
        }
        MMap<T> O(op + lo.offset(b, q0), nq, d.Dv, Eigen::OuterStride<>(lo.st));
        for (int64_t i = 0; i < nq; ++i) {
          // A row with no visible key (only possible for Tk == 0) gets zeros, lse = -inf.
          const T inv = l[i] > T(0) ? T(1) / l[i] : T(0);
          O.row(i) = acc.row(i) * inv;
          lp[b * d.Tq + q0 + i] = l[i] > T(0) ? m[i] + std::log(l[i]) : ninf;
        }
      }
  });
}
KILN_REGISTER_KERNEL(kernels::attention_forward, CPU, attention_forward);

void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& g, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, double scale,
                        bool causal) {
  const char* name = "scaled_dot_product_attention_backward";
  KILN_CHECK(lse.is_contiguous(), name, ": lse must be contiguous");
  const Layout lq = layout_of(q, name), lk = layout_of(k, name), lv = layout_of(v, name), lo = layout_of(out, name),
               lg = layout_of(g, name);
  const Layout ldq = dq.defined() ? layout_of(dq, name) : Layout{};
  const Layout ldk = dk.defined() ? layout_of(dk, name) : Layout{};
  const Layout ldv = dv.defined() ? layout_of(dv, name) : Layout{};
  const Dims d = dims_of(q, k, v);
  const int64_t nqb = (d.Tq + kBlock - 1) / kBlock;
  const int64_t nkb = (d.Tk + kBlock - 1) / kBlock;
  dispatch_attention(q.dtype(), "scaled_dot_product_attention_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *qp = cptr<T>(q), *kp = cptr<T>(k), *vp = cptr<T>(v);
    const T *gp = cptr<T>(g), *op = cptr<T>(out), *lp = cptr<T>(lse);
    T *dqp = mptr<T>(dq), *dkp = mptr<T>(dk), *dvp = mptr<T>(dv);  // null: that gradient is not wanted
    const T sc = static_cast<T>(scale);
    const bool par = d.B * d.Tq * d.Tk * (d.D + d.Dv) >= 65536;

    // D_i = sum_j g_ij * out_ij
    std::vector<T> Drow(d.B * d.Tq);
#pragma omp parallel for schedule(static) if (par)
    for (int64_t r = 0; r < d.B * d.Tq; ++r) {
      const T* gr = gp + lg.offset(r / d.Tq, r % d.Tq);
      const T* orow = op + lo.offset(r / d.Tq, r % d.Tq);
      T s = 0;
      for (int64_t j = 0; j < d.Dv; ++j) s += gr[j] * orow[j];
      Drow[r] = s;
    }

    // P and dS of one (query block, key block) pair.
    auto block = [&](int64_t b, int64_t q0, int64_t nq, int64_t k0, int64_t nk, Mat<T>& P, Mat<T>& dS, bool need_ds) {
      P.resize(nq, nk);
      product<T>(rows_of(qp + lq.offset(b, q0), nq, d.D, lq.st), rows_of(kp + lk.offset(b, k0), nk, d.D, lk.st).t(),
                 rows_of(P), false);
      P *= sc;
      if (causal && k0 + nk - 1 > q0) apply_causal(P, q0, k0);
      for (int64_t i = 0; i < nq; ++i) {
        const T L = lp[b * d.Tq + q0 + i];
        if (std::isinf(L)) P.row(i).setZero();
        else P.row(i) = (P.row(i).array() - L).exp().matrix();
      }
      if (!need_ds) return;
      dS.resize(nq, nk);
      product<T>(rows_of(gp + lg.offset(b, q0), nq, d.Dv, lg.st), rows_of(vp + lv.offset(b, k0), nk, d.Dv, lv.st).t(),
                 rows_of(dS), false);  // dP
      // dS, with the scale of dQ = dS K * scale and dK = dS^T Q * scale folded in
      for (int64_t i = 0; i < nq; ++i)
        dS.row(i) = (P.row(i).array() * (dS.row(i).array() - Drow[b * d.Tq + q0 + i]) * sc).matrix();
    };

    // One pass when every thread can own whole batch entries (heads): each block's P and dS are
    // computed once and feed dQ, dK and dV together (the two passes below compute them twice,
    // which is what lets them split one head's rows across threads).
    const int threads = par ? omp_get_max_threads() : 1;
    if (dqp && dkp && dvp && d.B >= 2 * threads) {
#pragma omp parallel for schedule(dynamic, 1) if (par)
      for (int64_t b = 0; b < d.B; ++b) {
        for (int64_t i = 0; i < d.Tq; ++i) std::fill_n(dqp + ldq.offset(b, i), d.D, T(0));
        Mat<T> dK, dV, P, dS;
        for (int64_t k0 = 0; k0 < d.Tk; k0 += kBlock) {
          const int64_t nk = std::min(kBlock, d.Tk - k0);
          dK.setZero(nk, d.D);
          dV.setZero(nk, d.Dv);
          const int64_t qstart = causal ? (std::min(k0, d.Tq) / kBlock) * kBlock : 0;
          for (int64_t q0 = qstart; q0 < d.Tq; q0 += kBlock) {
            const int64_t nq = std::min(kBlock, d.Tq - q0);
            if (causal && q0 + nq - 1 < k0) continue;
            block(b, q0, nq, k0, nk, P, dS, true);
            product<T>(rows_of(P).t(), rows_of(gp + lg.offset(b, q0), nq, d.Dv, lg.st), rows_of(dV), true);
            product<T>(rows_of(dS).t(), rows_of(qp + lq.offset(b, q0), nq, d.D, lq.st), rows_of(dK), true);
            product<T>(rows_of(dS), rows_of(kp + lk.offset(b, k0), nk, d.D, lk.st),
                       rows_of(dqp + ldq.offset(b, q0), nq, d.D, ldq.st), true);
          }
          MMap<T>(dkp + ldk.offset(b, k0), nk, d.D, Eigen::OuterStride<>(ldk.st)) = dK;
          MMap<T>(dvp + ldv.offset(b, k0), nk, d.Dv, Eigen::OuterStride<>(ldv.st)) = dV;
        }
      }
      return;
    }
    if (dqp) {
#pragma omp parallel for collapse(2) schedule(dynamic, 1) if (par)
      for (int64_t b = 0; b < d.B; ++b)
        for (int64_t qb = 0; qb < nqb; ++qb) {
          const int64_t q0 = qb * kBlock, nq = std::min(kBlock, d.Tq - q0);
          const auto dQ = rows_of(dqp + ldq.offset(b, q0), nq, d.D, ldq.st);
          for (int64_t i = 0; i < nq; ++i) std::fill(dQ.p + i * dQ.rs, dQ.p + i * dQ.rs + d.D, T(0));
          Mat<T> P, dS;
          const int64_t kend = causal ? std::min(d.Tk, q0 + nq) : d.Tk;
          for (int64_t k0 = 0; k0 < kend; k0 += kBlock) {
            const int64_t nk = std::min(kBlock, kend - k0);
            block(b, q0, nq, k0, nk, P, dS, true);
            product<T>(rows_of(dS), rows_of(kp + lk.offset(b, k0), nk, d.D, lk.st), dQ, true);
          }
        }
    }
    if (dkp || dvp) {
#pragma omp parallel for collapse(2) schedule(dynamic, 1) if (par)
      for (int64_t b = 0; b < d.B; ++b)
        for (int64_t kb = 0; kb < nkb; ++kb) {
          const int64_t k0 = kb * kBlock, nk = std::min(kBlock, d.Tk - k0);
          Mat<T> dK = Mat<T>::Zero(nk, d.D), dV = Mat<T>::Zero(nk, d.Dv), P, dS;
          // Causal: only queries i >= k0 see this block.
          const int64_t qstart = causal ? (std::min(k0, d.Tq) / kBlock) * kBlock : 0;
          for (int64_t q0 = qstart; q0 < d.Tq; q0 += kBlock) {
            const int64_t nq = std::min(kBlock, d.Tq - q0);
            if (causal && q0 + nq - 1 < k0) continue;
            block(b, q0, nq, k0, nk, P, dS, dkp != nullptr);
            if (dvp) product<T>(rows_of(P).t(), rows_of(gp + lg.offset(b, q0), nq, d.Dv, lg.st), rows_of(dV), true);
            if (dkp) product<T>(rows_of(dS).t(), rows_of(qp + lq.offset(b, q0), nq, d.D, lq.st), rows_of(dK), true);
          }
          if (dkp) MMap<T>(dkp + ldk.offset(b, k0), nk, d.D, Eigen::OuterStride<>(ldk.st)) = dK;
          if (dvp) MMap<T>(dvp + ldv.offset(b, k0), nk, d.Dv, Eigen::OuterStride<>(ldv.st)) = dV;
        }
    }
  });
}
KILN_REGISTER_KERNEL(kernels::attention_backward, CPU, attention_backward);

}  // namespace kiln::kernels::cpu
