#pragma once
// Fused pointwise kernels (one pass where the plain composition makes several, which pays where
// memory traffic dominates) and the linear layer with a fused epilogue. Raw compute, no autograd:
// the differentiable ops are in kiln/nn/functional/fused.cpp. kernels/fused.cpp checks the
// operands once for both backends and dispatches to the CPU (kernels/cpu/fused.cpp) or CUDA
// (kernels/cuda/fused.cu, matmul_cublaslt.cpp); the per-element math is shared
// (kernels/math/fused.h).
//
// Layout: data operands are contiguous, share one floating dtype, and are seen as [R, K] with
// K = the last dimension; a bias is a contiguous [K] vector (or undefined: no bias) added to
// every row. Column sums (bias gradients) are deterministic on both backends: per-chunk partial
// sums in a fixed order, then a second pass, never atomics.
#include <cstdint>

#include "kiln/core/tensor.h"
#include "kiln/kernels/dispatch.h"

namespace kiln::kernels {

enum class GeluApprox : uint8_t { None, Tanh };  // erf form, or the tanh approximation

// ---- bias + GELU: y = gelu(x + bias).
void bias_gelu(const Tensor& y, const Tensor& x, const Tensor& bias, GeluApprox approx);
// dx = g * gelu'(x + bias); dbias (undefined: not wanted) = sum of dx over the rows, in the
// data dtype (accumulated in f32, f64 for f64 data). dx may be the same tensor as g.
void bias_gelu_backward(const Tensor& dx, const Tensor& dbias, const Tensor& g, const Tensor& x, const Tensor& bias,
                        GeluApprox approx);

// ---- bias + dropout + residual add: y = residual + dropout(x + bias), element i (row-major)
// kept when philox::dropout_uniform(seed, offset, i) >= p and then scaled by 1 / (1 - p) - the mask
// of kernels::dropout for the same (seed, offset). 0 <= p <= 1; p == 0 draws no numbers.
void bias_dropout_add(const Tensor& y, const Tensor& x, const Tensor& bias, const Tensor& residual, double p,
                      uint64_t seed, uint64_t offset);
// dx = g * mask / (1 - p), the mask regenerated from (seed, offset); dbias as above. dx may be g.
// (The residual's gradient is g itself.)
void bias_dropout_add_backward(const Tensor& dx, const Tensor& dbias, const Tensor& g, double p, uint64_t seed,
                               uint64_t offset);

// ---- linear with a fused epilogue: out [M, N] = x [M, K] @ weight [N, K]^T + bias [N], then
// GELU for BiasGelu. x and weight may be any 2-D strided views cuBLAS/Eigen can read (a
// transposed view is fine); out, bias and gelu_aux contiguous. gelu_aux ([M, N] or undefined;
// BiasGelu only) receives the pre-activation x @ weight^T + bias for the backward.
// CUDA: one cuBLASLt GEMM with CUBLASLT_EPILOGUE_BIAS / GELU_BIAS / GELU_AUX_BIAS. cuBLASLt's
// GELU is the tanh approximation, so approx == None (and any case cuBLASLt turns down: f64,
// an aux leading dimension that is not a multiple of 8) runs the GEMM with the bias epilogue
// and the bias_gelu kernel after it. CPU: matmul, then bias_gelu (or a bias add).
enum class Epilogue : uint8_t { Bias, BiasGelu };
void linear_epilogue(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias, Epilogue epilogue,
                     const Tensor& gelu_aux = Tensor(), GeluApprox approx = GeluApprox::Tanh);

// ---- GELU backward fused into the GEMM that produces the incoming gradient:
// dpre [M, N] = (a [M, K] @ b [K, N]) * gelu'(pre), dbias [N] (undefined: not wanted) = column
// sum of dpre. pre and dpre contiguous [M, N]. This is the backward of a GELU whose output feeds
// a linear layer (an MLP's hidden activation: a = the output gradient, b = the next weight).
// CUDA with approx == Tanh: one GEMM with CUBLASLT_EPILOGUE_DGELU_BGRAD (DGELU when dbias is
// undefined); otherwise a GEMM and the bias_gelu_backward kernel.
void matmul_dgelu_bgrad(const Tensor& dpre, const Tensor& dbias, const Tensor& a, const Tensor& b, const Tensor& pre,
                        GeluApprox approx = GeluApprox::Tanh);

// The backends' entry points (same contracts; operands already on one device).
// The backends' slots behind the checked entry points above (arguments already checked).
namespace backend {
inline Kernel<void(const Tensor& y, const Tensor& x, const Tensor& bias, GeluApprox approx)> bias_gelu{"bias_gelu"};
inline Kernel<void(const Tensor& dx, const Tensor& dbias, const Tensor& g, const Tensor& x, const Tensor& bias,
                   GeluApprox approx)>
    bias_gelu_backward{"bias_gelu_backward"};
inline Kernel<void(const Tensor& y, const Tensor& x, const Tensor& bias, const Tensor& residual, double p,
                   uint64_t seed, uint64_t offset)>
    bias_dropout_add{"bias_dropout_add"};
inline Kernel<void(const Tensor& dx, const Tensor& dbias, const Tensor& g, double p, uint64_t seed, uint64_t offset)>
    bias_dropout_add_backward{"bias_dropout_add_backward"};
inline Kernel<void(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias, Epilogue epilogue,
                   const Tensor& gelu_aux, GeluApprox approx)>
    linear_epilogue{"linear_epilogue"};
inline Kernel<void(const Tensor& dpre, const Tensor& dbias, const Tensor& a, const Tensor& b, const Tensor& pre,
                   GeluApprox approx)>
    matmul_dgelu_bgrad{"matmul_dgelu_bgrad"};
}  // namespace backend

namespace cuda {
// Whether the last linear_epilogue / matmul_dgelu_bgrad on a GPU ran cuBLASLt's fused epilogue
// (true) or the unfused fallback: for the tests and the bench. False in builds without CUDA.
bool last_call_used_epilogue();
}  // namespace cuda

}  // namespace kiln::kernels
