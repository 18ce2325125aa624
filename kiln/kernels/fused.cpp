// Routes the fused kernels (fused.h) to the backend of their operands after checking
// shapes, dtypes, contiguity and devices once, here, for both backends. The CPU's linear
// epilogue is a composition (matmul, then the fused bias+GELU kernel); the CUDA backend fuses
// it into the cuBLASLt GEMM.
#include <initializer_list>
#include <utility>

#include "kiln/config.h"
#include "kiln/core/error.h"
#include "kiln/kernels/fused.h"
#include "kiln/kernels/copy_fill.h"
#include "kiln/kernels/matmul.h"
#include "kiln/kernels/pointwise.h"
#include "kiln/kernels/reduce.h"
#include "kiln/kernels/softmax.h"

namespace kiln::kernels {

namespace {

// Undefined operands are optional (bias, unwanted gradients) and skipped.
void check_data(const char* op, const char* what, const Tensor& t, const Tensor& like) {
  KILN_CHECK(t.defined(), op, ": ", what, " is undefined");
  KILN_CHECK(is_floating(t.dtype()), op, ": expected floating-point tensors, got ", what, " of dtype ", t.dtype());
  KILN_CHECK(t.is_contiguous(), op, ": ", what, " must be contiguous (sizes ", t.sizes(), ")");
  KILN_CHECK(t.dtype() == like.dtype() && t.sizes() == like.sizes(), op, ": ", what, " has sizes ", t.sizes(),
             " and dtype ", t.dtype(), ", expected ", like.sizes(), " and ", like.dtype());
}

// check_data for each named tensor, all like `like`.
void check_data(const char* op, const Tensor& like, std::initializer_list<std::pair<const char*, const Tensor*>> data) {
  for (const auto& [what, t] : data) check_data(op, what, *t, like);
}

// A [K] vector (bias or its gradient) matching the last dimension of `like`; undefined is fine.
void check_vector(const char* op, const char* what, const Tensor& v, const Tensor& like) {
  if (!v.defined()) return;
  const int64_t k = like.dim() == 0 ? 1 : like.size(-1);
  KILN_CHECK(v.dim() == 1 && v.size(0) == k && v.is_contiguous() && v.dtype() == like.dtype(), op, ": ", what,
             " must be a contiguous [", k, "] vector of dtype ", like.dtype(), ", got sizes ", v.sizes(), " dtype ",
             v.dtype());
}

}  // namespace

void bias_gelu(const Tensor& y, const Tensor& x, const Tensor& bias, GeluApprox approx) {
  const char* op = "bias_gelu";
  check_data(op, x, {{"input", &x}, {"output", &y}});
  check_vector(op, "bias", bias, x);
  if (x.numel() == 0) return;
  backend::bias_gelu(y, x, bias, approx);
}

void bias_gelu_backward(const Tensor& dx, const Tensor& dbias, const Tensor& g, const Tensor& x, const Tensor& bias,
                        GeluApprox approx) {
  const char* op = "bias_gelu_backward";
  check_data(op, x, {{"input", &x}, {"grad_output", &g}, {"grad_input", &dx}});
  check_vector(op, "bias", bias, x);
  check_vector(op, "grad_bias", dbias, x);
  if (x.numel() == 0) {
    if (dbias.defined()) fill(dbias, 0.0);
    return;
  }
  backend::bias_gelu_backward(dx, dbias, g, x, bias, approx);
}

void bias_dropout_add(const Tensor& y, const Tensor& x, const Tensor& bias, const Tensor& residual, double p,
                      uint64_t seed, uint64_t offset) {
  const char* op = "bias_dropout_add";
  check_data(op, x, {{"input", &x}, {"residual", &residual}, {"output", &y}});
  check_vector(op, "bias", bias, x);
  KILN_CHECK(p >= 0.0 && p <= 1.0, op, ": probability p must be in [0, 1], got ", p);
  if (x.numel() == 0) return;
  backend::bias_dropout_add(y, x, bias, residual, p, seed, offset);
}

void bias_dropout_add_backward(const Tensor& dx, const Tensor& dbias, const Tensor& g, double p, uint64_t seed,
                               uint64_t offset) {
  const char* op = "bias_dropout_add_backward";
  check_data(op, g, {{"grad_output", &g}, {"grad_input", &dx}});
  check_vector(op, "grad_bias", dbias, g);
  KILN_CHECK(p >= 0.0 && p <= 1.0, op, ": probability p must be in [0, 1], got ", p);
  if (g.numel() == 0) {
    if (dbias.defined()) fill(dbias, 0.0);
    return;
  }
  backend::bias_dropout_add_backward(dx, dbias, g, p, seed, offset);
}

void linear_epilogue(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias, Epilogue epilogue,
                     const Tensor& gelu_aux, GeluApprox approx) {
  const char* op = epilogue == Epilogue::Bias ? "linear_epilogue(bias)" : "linear_epilogue(bias_gelu)";
  KILN_CHECK(x.defined() && weight.defined() && bias.defined() && out.defined(), op,
             ": x, weight, bias and out must be defined");
  KILN_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), op, ": x ", x.sizes(), " and weight ",
             weight.sizes(), " must be [M, K] and [N, K]");
  KILN_CHECK(out.dim() == 2 && out.size(0) == x.size(0) && out.size(1) == weight.size(0) && out.is_contiguous(), op,
             ": out must be a contiguous [", x.size(0), ", ", weight.size(0), "] tensor, got ", out.sizes());
  KILN_CHECK(is_floating(x.dtype()) && weight.dtype() == x.dtype() && out.dtype() == x.dtype(), op,
             ": x, weight and out must share one floating dtype, got ", x.dtype(), ", ", weight.dtype(), ", ",
             out.dtype());
  check_vector(op, "bias", bias, out);
  if (gelu_aux.defined()) {
    KILN_CHECK(epilogue == Epilogue::BiasGelu, op, ": gelu_aux is only written by the BiasGelu epilogue");
    check_data(op, "gelu_aux", gelu_aux, out);
  }
  backend::linear_epilogue(out, x, weight, bias, epilogue, gelu_aux, approx);
}

void matmul_dgelu_bgrad(const Tensor& dpre, const Tensor& dbias, const Tensor& a, const Tensor& b, const Tensor& pre,
                        GeluApprox approx) {
  const char* op = "matmul_dgelu_bgrad";
  check_data(op, pre, {{"pre", &pre}, {"dpre", &dpre}});
  check_vector(op, "grad_bias", dbias, pre);
  KILN_CHECK(pre.dim() == 2 && a.dim() == 2 && b.dim() == 2 && a.size(0) == pre.size(0) && b.size(1) == pre.size(1) &&
                 a.size(1) == b.size(0),
             op, ": expected a [M, K], b [K, N] and pre [M, N], got ", a.sizes(), ", ", b.sizes(), ", ", pre.sizes());
  KILN_CHECK(a.dtype() == pre.dtype() && b.dtype() == pre.dtype(), op, ": dtypes differ: ", a.dtype(), ", ", b.dtype(),
             ", ", pre.dtype());
  KILN_CHECK(!dpre.is_same(pre), op, ": dpre must not be pre");
  backend::matmul_dgelu_bgrad(dpre, dbias, a, b, pre, approx);
}

#if !KILN_WITH_CUDA
// Without CUDA no call ever reaches cuBLASLt (the GPU tests that ask still link, and skip).
bool cuda::last_call_used_epilogue() { return false; }
#endif

}  // namespace kiln::kernels
