// Matrix multiply on the GPU through cuBLASLt: f32 (TF32 behind kiln::cuda::set_allow_tf32),
// f64, and f16/bf16 with f32 accumulation; strided batches in one call. kiln's tensors are
// row-major and cuBLAS is column-major, so C = A B is computed as C^T = B^T A^T, which needs no
// copies: a row-major operand is its transpose in column-major terms, and a column-major one
// (a transposed view) is passed with the transpose op.
//
// Alignment: cuBLASLt's heuristic assumes 256-byte aligned matrices unless told otherwise; views
// at an offset (a[1:]) are not, so every call states the real alignment of its operands
// (matmul_alignment.h). The workspace comes from kiln's caching allocator on the current stream,
// so two streams never share one.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <mutex>

#include "kiln/cuda/cuda.h"
#include "kiln/cuda/check.h"
#include "kiln/kernels/copy_fill.h"
#include "kiln/kernels/matmul.h"
#include "kiln/kernels/pointwise.h"
#include "kiln/kernels/reduce.h"
#include "kiln/kernels/softmax.h"
#include "kiln/kernels/cuda/matmul_alignment.h"
#include "kiln/kernels/fused.h"

#define KILN_CUBLAS_CHECK(call)                                                      \
  do {                                                                               \
    cublasStatus_t kiln_st_ = (call);                                                \
    KILN_CHECK(kiln_st_ == CUBLAS_STATUS_SUCCESS, "cuBLASLt error in ", #call, ": ", \
               cublasLtGetStatusString(kiln_st_));                                   \
  } while (0)

namespace kiln::kernels::cuda {

namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

// One cuBLASLt handle per device (a handle is not tied to a stream; the workspace is per call).
cublasLtHandle_t handle_for(int device) {
  static std::mutex mu;
  static cublasLtHandle_t handles[16] = {};
  KILN_CHECK(device >= 0 && device < 16, "matmul: CUDA device index ", device, " out of range");
  std::lock_guard<std::mutex> lock(mu);
  if (!handles[device]) KILN_CUBLAS_CHECK(cublasLtCreate(&handles[device]));
  return handles[device];
}

uint32_t alignment_of(const void* p, uint64_t batch_stride_bytes = 0) {
  return operand_alignment(reinterpret_cast<uintptr_t>(p), batch_stride_bytes);
}

// One operand as cuBLAS sees it: column-major data, whether it must be transposed, and its
// leading dimension.
struct ColMajor {
  cublasOperation_t op;
  int64_t ld;
};

// Row-major [rows, cols] with strides (rs, cs) seen as the column-major transpose ([cols, rows]).
ColMajor as_transposed(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  if (cs == 1 || cols == 1) return {CUBLAS_OP_N, std::max<int64_t>(rs, std::max<int64_t>(cols, 1))};
  return {CUBLAS_OP_T, std::max<int64_t>(cs, std::max<int64_t>(rows, 1))};  // rs == 1: a transposed view
}

Tensor mappable(const Tensor& t) {
  const int64_t n = t.dim(), rs = t.stride(n - 2), cs = t.stride(n - 1), rows = t.size(n - 2), cols = t.size(n - 1);
  bool row_major = (cs == 1 || cols == 1) && rs >= std::max<int64_t>(cols, 1);
  bool col_major = (rs == 1 || rows == 1) && cs >= std::max<int64_t>(rows, 1);
  bool batch_ok = n == 2 || t.stride(0) > 0 || t.size(0) == 1;
  return (row_major || col_major) && batch_ok ? t : contiguous(t);
}

}  // namespace

namespace {

// A cuBLASLt epilogue and its operands (DEFAULT: none). `bias` is read (BIAS, GELU_BIAS,
// GELU_AUX_BIAS) or written (DGELU_BGRAD: the bias gradient); `aux` is the GELU input, written by
// GELU_AUX_BIAS and read by DGELU(_BGRAD), with leading dimension aux_ld (a multiple of 8).
struct EpilogueArgs {
  cublasLtEpilogue_t kind = CUBLASLT_EPILOGUE_DEFAULT;
  void* bias = nullptr;
  void* aux = nullptr;
  int64_t aux_ld = 0;
};

// c = a @ b (+ epilogue) through one cuBLASLt call; a and b already mappable. Without an
// epilogue a missing algorithm is an error; with one, anything short of success (a bias or aux
// pointer below kEpilogueAlignment, no algorithm, a heuristic or launch status other than
// success) returns false so the caller can fall back to a plain matmul and kiln's own kernels.
bool lt_matmul(const Tensor& c, const Tensor& a, const Tensor& b, const EpilogueArgs& ep) {
  const bool has_epilogue = ep.kind != CUBLASLT_EPILOGUE_DEFAULT;
  if (has_epilogue && ((ep.bias && alignment_of(ep.bias) < kEpilogueAlignment) ||
                       (ep.aux && alignment_of(ep.aux) < kEpilogueAlignment)))
    return false;
  const bool batched = c.dim() == 3;
  const int64_t batch = batched ? c.size(0) : 1;
  const int64_t M = c.size(-2), N = c.size(-1), K = a.size(-1);

  cudaDataType_t dt;
  cublasComputeType_t compute;
  cudaDataType_t scale_type;
  switch (a.dtype()) {
    case DType::F32:
      dt = CUDA_R_32F;
      compute = kiln::cuda::allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
      scale_type = CUDA_R_32F;
      break;
    case DType::F64:
      dt = CUDA_R_64F;
      compute = CUBLAS_COMPUTE_64F;
      scale_type = CUDA_R_64F;
      break;
    case DType::F16:
      dt = CUDA_R_16F;
      compute = CUBLAS_COMPUTE_32F;
      scale_type = CUDA_R_32F;
      break;
    case DType::BF16:
      dt = CUDA_R_16BF;
      compute = CUBLAS_COMPUTE_32F;
      scale_type = CUDA_R_32F;
      break;
    default: KILN_FAIL("matmul: dtype ", a.dtype(), " is not supported on CUDA");
  }

  // C^T [N, M] = X [N, K] * Y [K, M] with X = B^T, Y = A^T (column-major).
  ColMajor x = as_transposed(K, N, b.stride(-2), b.stride(-1));
  ColMajor y = as_transposed(M, K, a.stride(-2), a.stride(-1));
  const int dev = c.device().index;
  kiln::cuda::internal::DeviceGuard device_guard(dev);
  cublasLtHandle_t handle = handle_for(dev);
  cudaStream_t stream = static_cast<cudaStream_t>(kiln::cuda::current_stream(dev).handle);

  cublasLtMatmulDesc_t op_desc = nullptr;
  cublasLtMatrixLayout_t lx = nullptr, ly = nullptr, lc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  auto cleanup = [&] {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (ly) cublasLtMatrixLayoutDestroy(ly);
    if (lx) cublasLtMatrixLayoutDestroy(lx);
    if (op_desc) cublasLtMatmulDescDestroy(op_desc);
  };
  bool ran = false;
  try {
    KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op_desc, compute, scale_type));
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_desc, CUBLASLT_MATMUL_DESC_TRANSA, &x.op, sizeof(x.op)));
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_desc, CUBLASLT_MATMUL_DESC_TRANSB, &y.op, sizeof(y.op)));
    if (has_epilogue) {
      // In C^T's column-major terms the bias runs along the N rows of D: one value per output
      // feature, broadcast over the M columns - and the bias gradient sums over those columns.
      KILN_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(op_desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep.kind, sizeof(ep.kind)));
      if (ep.bias)
        KILN_CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(op_desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ep.bias, sizeof(ep.bias)));
      if (ep.aux) {
        KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ep.aux,
                                                         sizeof(ep.aux)));
        KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ep.aux_ld,
                                                         sizeof(ep.aux_ld)));
      }
    }
    // Stored shapes (before the op): X is [N, K] or, transposed, [K, N]; likewise Y.
    const uint64_t xr = x.op == CUBLAS_OP_N ? N : K, xc = x.op == CUBLAS_OP_N ? K : N;
    const uint64_t yr = y.op == CUBLAS_OP_N ? K : M, yc = y.op == CUBLAS_OP_N ? M : K;
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lx, dt, xr, xc, x.ld));
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ly, dt, yr, yc, y.ld));
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc, dt, N, M, N));
    if (batched) {
      const int32_t count = static_cast<int32_t>(batch);
      const int64_t sx = b.stride(0), sy = a.stride(0), sc = M * N;
      for (auto [layout, stride] : {std::pair{lx, sx}, std::pair{ly, sy}, std::pair{lc, sc}}) {
        KILN_CUBLAS_CHECK(
            cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
        KILN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                           sizeof(stride)));
      }
    }
    KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = kWorkspaceBytes;
    KILN_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    // cuBLASLt's A is X (from b), its B is Y (from a), C = D = c.
    const size_t es = element_size(a.dtype());
    const uint64_t bx = batched ? b.stride(0) * es : 0, by = batched ? a.stride(0) * es : 0;
    const uint64_t bc = batched ? static_cast<uint64_t>(M * N) * es : 0;
    const uint32_t align[4] = {alignment_of(b.data_ptr(), bx), alignment_of(a.data_ptr(), by),
                               alignment_of(c.data_ptr(), bc), alignment_of(c.data_ptr(), bc)};
    const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; ++i)
      KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align[i], sizeof(align[i])));
    cublasLtMatmulHeuristicResult_t heuristic{};
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle, op_desc, lx, ly, lc, lc, pref, 1, &heuristic, &found);
    if (has_epilogue && (st != CUBLAS_STATUS_SUCCESS || found == 0)) {
      cleanup();  // no algorithm for this epilogue: the caller falls back
      return false;
    }
    KILN_CUBLAS_CHECK(st);
    KILN_CHECK(found > 0, "matmul: cuBLASLt found no algorithm for [", M, ", ", K, "] @ [", K, ", ", N, "] in ",
               a.dtype(), " (operand alignments ", align[1], ", ", align[0], ", ", align[2], " bytes)");
    const double alpha_d = 1.0, beta_d = 0.0;
    const float alpha_f = 1.0f, beta_f = 0.0f;
    const void* alpha = scale_type == CUDA_R_64F ? static_cast<const void*>(&alpha_d) : &alpha_f;
    const void* beta = scale_type == CUDA_R_64F ? static_cast<const void*>(&beta_d) : &beta_f;
    // The algorithm's own workspace, stream-ordered: a call on another stream never gets this
    // block while this one may still run.
    const size_t need = heuristic.workspaceSize;
    Tensor workspace;
    if (need > 0) workspace = empty({static_cast<int64_t>(need)}, TensorOptions().dtype(DType::U8).device(c.device()));
    st = cublasLtMatmul(handle, op_desc, alpha, b.data_ptr(), lx, a.data_ptr(), ly, beta, c.data_ptr(), lc,
                        c.data_ptr(), lc, &heuristic.algo, need > 0 ? workspace.data_ptr() : nullptr, need, stream);
    if (has_epilogue && st == CUBLAS_STATUS_NOT_SUPPORTED) {
      cleanup();  // refused before launching anything: the caller falls back
      return false;
    }
    KILN_CUBLAS_CHECK(st);
    ran = true;
  } catch (...) {
    cleanup();
    throw;
  }
  cleanup();
  return ran;
}

thread_local bool t_used_epilogue = false;

}  // namespace

void matmul(const Tensor& c, const Tensor& a_in, const Tensor& b_in) {
  KILN_CHECK(c.is_contiguous(), "matmul: output must be contiguous");
  KILN_CHECK(a_in.dtype() == b_in.dtype() && c.dtype() == a_in.dtype(), "matmul: dtype mismatch");
  if (c.numel() == 0) return;
  if (a_in.size(-1) == 0) {
    fill(c, 0.0);
    return;
  }
  Tensor a = mappable(a_in), b = mappable(b_in);
  lt_matmul(c, a, b, EpilogueArgs{});
}

// ---------------------------------------------------------------- fused epilogues
// (contracts in kiln/kernels/fused.h; shapes and dtypes checked by kernels/fused.cpp)

bool last_call_used_epilogue() { return t_used_epilogue; }

void linear_epilogue(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias, Epilogue epilogue,
                     const Tensor& gelu_aux, GeluApprox approx) {
  t_used_epilogue = false;
  if (out.numel() == 0) return;
  const int64_t N = out.size(1), K = x.size(1);
  const bool gelu = epilogue == Epilogue::BiasGelu;
  Tensor a = mappable(x), b = mappable(weight.detach().t());
  EpilogueArgs ep;
  ep.bias = bias.data_ptr();
  // cuBLASLt's GELU is the tanh approximation; its aux buffer needs a leading dimension that is
  // a multiple of 8.
  if (K > 0 && (!gelu || (approx == GeluApprox::Tanh && (!gelu_aux.defined() || N % 8 == 0)))) {
    ep.kind = !gelu                ? CUBLASLT_EPILOGUE_BIAS
              : gelu_aux.defined() ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                   : CUBLASLT_EPILOGUE_GELU_BIAS;
    if (gelu && gelu_aux.defined()) {
      ep.aux = gelu_aux.data_ptr();
      ep.aux_ld = N;
    }
    if (lt_matmul(out, a, b, ep)) {
      t_used_epilogue = true;
      return;
    }
  }
  // Fallback: the pre-activation from a GEMM with the bias epilogue (or a GEMM and a bias add),
  // then one bias_gelu pass.
  const Tensor& pre = gelu && gelu_aux.defined() ? gelu_aux : out;
  EpilogueArgs bias_only;
  bias_only.kind = CUBLASLT_EPILOGUE_BIAS;
  bias_only.bias = bias.data_ptr();
  if (K == 0 || !lt_matmul(pre, a, b, bias_only)) {
    matmul(pre, x, weight.detach().t());
    binary(BinaryOp::Add, pre, pre, bias, 1.0, 0.0);
  }
  if (gelu) bias_gelu(out, pre, Tensor(), approx);
}
KILN_REGISTER_KERNEL(kernels::backend::linear_epilogue, CUDA, linear_epilogue);

void matmul_dgelu_bgrad(const Tensor& dpre, const Tensor& dbias, const Tensor& a_in, const Tensor& b_in,
                        const Tensor& pre, GeluApprox approx) {
  t_used_epilogue = false;
  if (dpre.numel() == 0) {
    if (dbias.defined()) fill(dbias, 0.0);
    return;
  }
  const int64_t N = dpre.size(1), K = a_in.size(1);
  if (approx == GeluApprox::Tanh && K > 0 && N % 8 == 0) {
    Tensor a = mappable(a_in), b = mappable(b_in);
    EpilogueArgs ep;
    ep.kind = dbias.defined() ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU;
    ep.bias = dbias.defined() ? dbias.data_ptr() : nullptr;
    ep.aux = pre.data_ptr();
    ep.aux_ld = N;
    if (lt_matmul(dpre, a, b, ep)) {
      t_used_epilogue = true;
      return;
    }
  }
  matmul(dpre, a_in, b_in);
  bias_gelu_backward(dpre, dbias, dpre, pre, Tensor(), approx);
}
KILN_REGISTER_KERNEL(kernels::backend::matmul_dgelu_bgrad, CUDA, matmul_dgelu_bgrad);

}  // namespace kiln::kernels::cuda

namespace kiln::kernels {
KILN_REGISTER_KERNEL(matmul, CUDA, cuda::matmul);
}  // namespace kiln::kernels
