// Fused pointwise kernels on the CPU: bias+GELU forward/backward and bias+dropout+residual
// forward/backward, each one pass over memory instead of the 2-5 passes of the unfused chain.
// Operands are contiguous [R, K] (K = last dimension) with a [K] bias, so a row is a plain typed
// loop the compiler vectorizes (`omp simd`, the branch-free fast exp/erf of math/fast_math.h);
// rows are spread over OpenMP threads.
//
// Bias gradients (column sums of dx) are computed in the same pass: rows are cut into fixed
// chunks (independent of the thread count), each chunk sums its rows into its own partial row
// in double, and the partials are added in chunk order - deterministic, no atomics.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/kernels/cpu/dropout_keep.h"
#include "kiln/kernels/cpu/loops.h"
#include "kiln/kernels/fused.h"
#include "kiln/kernels/matmul.h"
#include "kiln/kernels/pointwise.h"
#include "kiln/kernels/math/fused.h"

namespace kiln::kernels::cpu {

namespace {

struct RowsCols {
  int64_t rows, cols;
};

RowsCols rows_cols(const Tensor& t) {
  const int64_t k = t.dim() == 0 ? 1 : t.size(-1);
  return {k == 0 ? 0 : t.numel() / k, k};
}

// Runs f(tag, rows, cols) with t seen as [rows, cols] (cols: its last dimension), tag the dispatch
// tag of t's dtype.
template <class F> void dispatch_rows(const Tensor& t, const char* name, F&& f) {
  const RowsCols rc = rows_cols(t);
  dispatch_floating(t.dtype(), name, [&](auto tag) { f(tag, rc.rows, rc.cols); });
}

// 1 / (1 - p), the scale of kept elements (0 when everything is dropped).
template <class O> O dropout_scale(double p) { return p >= 1.0 ? O(0) : static_cast<O>(1.0 / (1.0 - p)); }

// Bias as opmath values (f16/bf16 bias widened once, not once per row).
template <class T, class O = opmath_t<T>> std::vector<O> bias_values(const Tensor& bias, int64_t k) {
  std::vector<O> b(static_cast<size_t>(k), O(0));
  if (bias.defined()) {
    const T* p = static_cast<const T*>(bias.data_ptr());
    for (int64_t j = 0; j < k; ++j) b[j] = static_cast<O>(p[j]);
  }
  return b;
}

// Rows per chunk for the column sums: enough chunks for every thread, few enough partials.
int64_t chunk_rows(int64_t rows) { return std::max<int64_t>(16, (rows + 255) / 256); }

// Runs row_fn(r) (which writes row r of dx) over all rows, and sums the stored dx over the rows
// into dbias (if defined). The sum reads back the stored (rounded) values, so it equals sum(dx)
// of the unfused ops.
template <class T, class RowFn>
void rows_with_column_sum(T* dx, const Tensor& dbias, int64_t rows, int64_t cols, RowFn row_fn) {
  const bool parallel = rows * cols >= kParallelGrain;
  if (!dbias.defined()) {
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t r = 0; r < rows; ++r) row_fn(r);
    return;
  }
  const int64_t per = chunk_rows(rows);
  const int64_t chunks = (rows + per - 1) / per;
  std::vector<double> partial(static_cast<size_t>(chunks * cols), 0.0);
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t c = 0; c < chunks; ++c) {
    double* acc = partial.data() + c * cols;
    const int64_t r1 = std::min(rows, (c + 1) * per);
    for (int64_t r = c * per; r < r1; ++r) {
      row_fn(r);
      const T* d = dx + r * cols;
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) acc[j] += static_cast<double>(static_cast<opmath_t<T>>(d[j]));
    }
  }
  T* db = static_cast<T*>(dbias.data_ptr());
  for (int64_t j = 0; j < cols; ++j) {
    double s = 0.0;
    for (int64_t c = 0; c < chunks; ++c) s += partial[c * cols + j];
    db[j] = static_cast<T>(static_cast<opmath_t<T>>(s));
  }
}

template <class F> void with_gelu(GeluApprox approx, F&& f) {
  if (approx == GeluApprox::Tanh) f(math::GeluTanh{}, math::GeluTanhBackward{});
  else f(math::GeluErf{}, math::GeluErfBackward{});
}

}  // namespace

void bias_gelu(const Tensor& y, const Tensor& x, const Tensor& bias, GeluApprox approx) {
  dispatch_rows(x, "bias_gelu", [&](auto tag, int64_t rows, int64_t cols) {
    using T = typename decltype(tag)::type;
    using O = opmath_t<T>;
    const std::vector<O> b = bias_values<T>(bias, cols);
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* yp = static_cast<T*>(y.data_ptr());
    with_gelu(approx, [&](auto act, auto) {
      const math::BiasAct<decltype(act)> f;
      const O* bp = b.data();
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelGrain)
      for (int64_t r = 0; r < rows; ++r) {
        const T* xr = xp + r * cols;
        T* yr = yp + r * cols;
#pragma omp simd
        for (int64_t j = 0; j < cols; ++j) yr[j] = static_cast<T>(f(static_cast<O>(xr[j]), bp[j]));
      }
    });
  });
}
KILN_REGISTER_KERNEL(kernels::backend::bias_gelu, CPU, bias_gelu);

void bias_gelu_backward(const Tensor& dx, const Tensor& dbias, const Tensor& g, const Tensor& x, const Tensor& bias,
                        GeluApprox approx) {
  dispatch_rows(x, "bias_gelu_backward", [&](auto tag, int64_t rows, int64_t cols) {
    using T = typename decltype(tag)::type;
    using O = opmath_t<T>;
    const std::vector<O> b = bias_values<T>(bias, cols);
    const T* xp = static_cast<const T*>(x.data_ptr());
    const T* gp = static_cast<const T*>(g.data_ptr());
    T* dp = static_cast<T*>(dx.data_ptr());
    with_gelu(approx, [&](auto, auto act_backward) {
      const math::BiasActBackward<decltype(act_backward)> f;
      const O* bp = b.data();
      rows_with_column_sum(dp, dbias, rows, cols, [&](int64_t r) {
        const T* xr = xp + r * cols;
        const T* gr = gp + r * cols;
        T* dr = dp + r * cols;
#pragma omp simd
        for (int64_t j = 0; j < cols; ++j)
          dr[j] = static_cast<T>(f(static_cast<O>(gr[j]), static_cast<O>(xr[j]), bp[j]));
      });
    });
  });
}
KILN_REGISTER_KERNEL(kernels::backend::bias_gelu_backward, CPU, bias_gelu_backward);

void bias_dropout_add(const Tensor& y, const Tensor& x, const Tensor& bias, const Tensor& residual, double p,
                      uint64_t seed, uint64_t offset) {
  dispatch_rows(x, "bias_dropout_add", [&](auto tag, int64_t rows, int64_t cols) {
    using T = typename decltype(tag)::type;
    using O = opmath_t<T>;
    const std::vector<O> b = bias_values<T>(bias, cols);
    const O scale = dropout_scale<O>(p);
    const math::BiasDropoutAdd f{math::DropoutMask{seed, offset, static_cast<float>(p)}};
    const T* xp = static_cast<const T*>(x.data_ptr());
    const T* rp = static_cast<const T*>(residual.data_ptr());
    T* yp = static_cast<T*>(y.data_ptr());
    const O* bp = b.data();
#pragma omp parallel for schedule(static) if (rows * cols >= 8192)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t base = r * cols;
      if (p == 0.0) {  // no mask: a vectorizable residual + x + bias
#pragma omp simd
        for (int64_t j = 0; j < cols; ++j)
          yp[base + j] = static_cast<T>(static_cast<O>(rp[base + j]) + (static_cast<O>(xp[base + j]) + bp[j]));
        continue;
      }
      // the mask (dropout_keep: the same bits as the GPU kernels, 64 at a time), then the arithmetic
      for_keep_spans(f.mask.seed, f.mask.offset, f.mask.p, base, cols, [&](int64_t j0, int64_t n, const uint8_t* keep) {
        const int64_t i = base + j0;
#pragma omp simd
        for (int64_t j = 0; j < n; ++j)
          yp[i + j] = static_cast<T>(math::BiasDropoutAdd::apply(static_cast<O>(xp[i + j]), bp[j0 + j],
                                                                 static_cast<O>(rp[i + j]), scale, keep[j] != 0));
      });
    }
  });
}
KILN_REGISTER_KERNEL(kernels::backend::bias_dropout_add, CPU, bias_dropout_add);

void bias_dropout_add_backward(const Tensor& dx, const Tensor& dbias, const Tensor& g, double p, uint64_t seed,
                               uint64_t offset) {
  dispatch_rows(g, "bias_dropout_add_backward", [&](auto tag, int64_t rows, int64_t cols) {
    using T = typename decltype(tag)::type;
    using O = opmath_t<T>;
    const O scale = dropout_scale<O>(p);
    const math::DropoutGrad f{math::DropoutMask{seed, offset, static_cast<float>(p)}};
    const T* gp = static_cast<const T*>(g.data_ptr());
    T* dp = static_cast<T*>(dx.data_ptr());
    rows_with_column_sum(dp, dbias, rows, cols, [&](int64_t r) {
      const int64_t base = r * cols;
      if (p == 0.0) {  // nothing dropped: dx = g
#pragma omp simd
        for (int64_t j = 0; j < cols; ++j) dp[base + j] = gp[base + j];
        return;
      }
      for_keep_spans(f.mask.seed, f.mask.offset, f.mask.p, base, cols, [&](int64_t j0, int64_t n, const uint8_t* keep) {
        const int64_t i = base + j0;
#pragma omp simd
        for (int64_t j = 0; j < n; ++j)
          dp[i + j] = static_cast<T>(math::DropoutGrad::apply(static_cast<O>(gp[i + j]), scale, keep[j] != 0));
      });
    });
  });
}
KILN_REGISTER_KERNEL(kernels::backend::bias_dropout_add_backward, CPU, bias_dropout_add_backward);

// The linear epilogues on the CPU are compositions: the GEMM into the pre-activation buffer,
// then one fused bias(+GELU) pass.
void linear_epilogue(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias, Epilogue epilogue,
                     const Tensor& gelu_aux, GeluApprox approx) {
  const Tensor weight_t = weight.detach().t();
  if (epilogue == Epilogue::Bias) {
    kernels::matmul(out, x, weight_t);
    kernels::binary(BinaryOp::Add, out, out, bias, 1.0, 0.0);
    return;
  }
  const Tensor& pre = gelu_aux.defined() ? gelu_aux : out;
  kernels::matmul(pre, x, weight_t);
  cpu::bias_gelu(out, pre, bias, approx);
  if (gelu_aux.defined()) kernels::binary(BinaryOp::Add, gelu_aux, gelu_aux, bias, 1.0, 0.0);
}
KILN_REGISTER_KERNEL(kernels::backend::linear_epilogue, CPU, linear_epilogue);

void matmul_dgelu_bgrad(const Tensor& dpre, const Tensor& dbias, const Tensor& a, const Tensor& b, const Tensor& pre,
                        GeluApprox approx) {
  kernels::matmul(dpre, a, b);
  cpu::bias_gelu_backward(dpre, dbias, dpre, pre, Tensor(), approx);
}
KILN_REGISTER_KERNEL(kernels::backend::matmul_dgelu_bgrad, CPU, matmul_dgelu_bgrad);

}  // namespace kiln::kernels::cpu
