// GPU bench: kiln's GEMM (cuBLASLt, kiln/kernels/cuda/matmul_cublaslt.cpp) against a plain
// cublasGemmEx on the same buffers in the same run (target: >= 95% of it), for bf16, f16 and
// f32 with TF32 at 1024..8192 square and at GPT-2's MLP shapes (8 x 1024 tokens, 768 <-> 3072);
// then the fused linear layer: linear_epilogue (bias + GELU in the cuBLASLt epilogue, with and
// without saving the GELU input) against the GEMM followed by separate bias and GELU kernels,
// and the backward's DGELU_BGRAD epilogue against the GEMM + the fused bias_gelu_backward kernel.
// Every result is validated before timing (kiln vs cublasGemmEx on the GPU, and the 1024 case
// against the CPU); timings are never asserted. Exits 77 without a device.
#include <cublas_v2.h>

#include <cmath>
#include <cstdio>
#include <string>

#include <kiln/kernels/fused.h>
#include <kiln/kernels/matmul.h>
#include <kiln/kernels/pointwise.h>
#include <kiln/kiln.h>

#include "cuda_bench_util.h"

namespace {

namespace gpu = kiln::bench::gpu;
namespace K = kiln::kernels;
using kiln::DType;
using kiln::Tensor;

void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cuBLAS error in %s: %d\n", what, static_cast<int>(s));
    std::exit(2);
  }
}

double max_rel_err(const Tensor& a, const Tensor& b) {
  kiln::NoGradGuard ng;
  Tensor x = a.detach().to(DType::F32), y = b.detach().to(x.device()).to(DType::F32);
  return (kiln::abs(x - y) / (kiln::abs(y) + 1.0)).max().item<double>();
}

// Relative error of a GEMM result with K-term dot products: scaled by sqrt(K) for the inputs
// used here (randn / sqrt(K) on one side keeps outputs O(1)).
double gemm_tol(DType dt) { return dt == DType::BF16 ? 3e-2 : dt == DType::F16 ? 5e-3 : 5e-3; }

// c [M, N] = a [M, K] @ b [K, N], row-major, through cublasGemmEx (C^T = B^T A^T).
void gemm_ex(cublasHandle_t h, const Tensor& c, const Tensor& a, const Tensor& b) {
  const int M = static_cast<int>(a.size(0)), Kd = static_cast<int>(a.size(1)), N = static_cast<int>(b.size(1));
  cudaDataType_t t = a.dtype() == DType::BF16 ? CUDA_R_16BF : a.dtype() == DType::F16 ? CUDA_R_16F : CUDA_R_32F;
  cublasComputeType_t ct = a.dtype() == DType::F32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const float alpha = 1.0f, beta = 0.0f;
  check_cublas(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, N, M, Kd, &alpha, b.data_ptr(), t, N, a.data_ptr(), t, Kd,
                            &beta, c.data_ptr(), t, N, ct, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
}

void gemm_row(cublasHandle_t h, DType dt, int64_t M, int64_t Kd, int64_t N, const char* label) {
  const kiln::Device dev = kiln::Device::cuda(0);
  const auto o = kiln::TensorOptions().device(dev);
  Tensor a = kiln::randn({M, Kd}, o).to(dt), b = (kiln::randn({Kd, N}, o) * (1.0 / std::sqrt(double(Kd)))).to(dt);
  Tensor c1 = kiln::empty({M, N}, a.options()), c2 = kiln::empty({M, N}, a.options());
  K::matmul(c1, a, b);
  gemm_ex(h, c2, a, b);
  const std::string name = std::string(label) + " " + kiln::dtype_name(dt) + (dt == DType::F32 ? "(tf32)" : "") + " [" +
                           std::to_string(M) + "x" + std::to_string(Kd) + "] @ [" + std::to_string(Kd) + "x" +
                           std::to_string(N) + "]";
  double e = max_rel_err(c1, c2);
  kiln::bench::validate(e < gemm_tol(dt), (name + ": kiln vs cublasGemmEx").c_str(), e);
  if (M == 1024 && N == 1024) {  // and once against the CPU in f32
    Tensor ref = kiln::matmul(a.cpu().to(DType::F32), b.cpu().to(DType::F32));
    e = max_rel_err(c1, ref);
    kiln::bench::validate(e < gemm_tol(dt), (name + ": kiln vs CPU").c_str(), e);
  }
  const double tk = gpu::time_ms([&] { K::matmul(c1, a, b); }, 10, 5);
  const double tc = gpu::time_ms([&] { gemm_ex(h, c2, a, b); }, 10, 5);
  const double flop = 2.0 * M * N * Kd;
  std::printf("%-52s kiln %8.3f ms %6.1f TFLOP/s | cublasGemmEx %8.3f ms %6.1f TFLOP/s | %5.1f%%\n", name.c_str(), tk,
              flop / tk / 1e9, tc, flop / tc / 1e9, 100.0 * tc / tk);
  gpu::record("matmul", name, "kiln", tk, gpu::flops(flop));
  gpu::record("matmul", name, "cublasGemmEx", tc, gpu::flops(flop));
}

// linear + bias + GELU(tanh): the cuBLASLt epilogue vs GEMM then separate kernels.
void linear_gelu_row(DType dt, int64_t M, int64_t Kd, int64_t N) {
  const kiln::Device dev = kiln::Device::cuda(0);
  const auto o = kiln::TensorOptions().device(dev);
  kiln::NoGradGuard ng;
  Tensor x = kiln::randn({M, Kd}, o).to(dt), w = (kiln::randn({N, Kd}, o) * (1.0 / std::sqrt(double(Kd)))).to(dt);
  Tensor b = kiln::randn({N}, o).to(dt);
  Tensor out = kiln::empty({M, N}, x.options()), aux = kiln::empty({M, N}, x.options());
  const std::string name = std::string(kiln::dtype_name(dt)) + (dt == DType::F32 ? "(tf32)" : "") + " [" +
                           std::to_string(M) + "x" + std::to_string(Kd) + "] -> " + std::to_string(N);
  auto unfused = [&] { return kiln::gelu(kiln::mm(x, w.t()) + b, "tanh"); };  // 3 kernels
  Tensor pre_only = kiln::empty({M, N}, x.options());
  auto two_kernels = [&] {  // GEMM + bias epilogue, then the fused bias_gelu pass (the "none" path)
    K::linear_epilogue(pre_only, x, w, b, K::Epilogue::Bias);
    K::bias_gelu(out, pre_only, Tensor(), K::GeluApprox::Tanh);
  };
  // validation
  K::linear_epilogue(out, x, w, b, K::Epilogue::BiasGelu, aux, K::GeluApprox::Tanh);
  const bool used_aux = K::cuda::last_call_used_epilogue();
  Tensor ref = unfused();
  double e = max_rel_err(out, ref);
  kiln::bench::validate(e < gemm_tol(dt), ("linear_gelu epilogue " + name).c_str(), e);
  e = max_rel_err(aux, kiln::mm(x, w.t()) + b);
  kiln::bench::validate(e < gemm_tol(dt), ("linear_gelu aux " + name).c_str(), e);
  K::linear_epilogue(out, x, w, b, K::Epilogue::BiasGelu, Tensor(), K::GeluApprox::Tanh);
  const bool used_noaux = K::cuda::last_call_used_epilogue();
  e = max_rel_err(out, ref);
  kiln::bench::validate(e < gemm_tol(dt), ("linear_gelu epilogue (no aux) " + name).c_str(), e);

  Tensor y;
  const double t_aux = gpu::time_ms([&] { K::linear_epilogue(out, x, w, b, K::Epilogue::BiasGelu, aux); }, 10, 5);
  const double t_noaux = gpu::time_ms([&] { K::linear_epilogue(out, x, w, b, K::Epilogue::BiasGelu); }, 10, 5);
  const double t_two = gpu::time_ms(two_kernels, 10, 5);
  const double t_un = gpu::time_ms([&] { y = unfused(); }, 10, 5);
  std::printf(
      "linear+bias+gelu %-34s epilogue+aux %7.3f ms%s | epilogue %7.3f ms%s | gemm+bias_gelu %7.3f ms | "
      "gemm+add+gelu %7.3f ms | %4.2fx vs unfused\n",
      name.c_str(), t_aux, used_aux ? "" : " (fallback)", t_noaux, used_noaux ? "" : " (fallback)", t_two, t_un,
      t_un / t_aux);
  // recorded case names: "linear+bias+gelu(tanh) bfloat16 [8192x768] -> 3072"; "kiln" is the
  // epilogue that saves the GELU input (what a training forward runs)
  const double flop = 2.0 * M * N * Kd;
  const std::string fwd_case = "linear+bias+gelu(tanh) " + name;
  gpu::record("matmul", fwd_case, "kiln", t_aux, gpu::flops(flop));
  gpu::record("matmul", fwd_case, "kiln epilogue, no aux", t_noaux, gpu::flops(flop));
  gpu::record("matmul", fwd_case, "kiln gemm+bias_gelu", t_two, gpu::flops(flop));
  gpu::record("matmul", fwd_case, "unfused gemm+add+gelu", t_un, gpu::flops(flop));

  // backward of the GELU feeding the next linear: dpre = (g2 @ W2) * gelu'(pre), dbias
  Tensor g2 = kiln::randn({M, Kd}, o).to(dt), w2 = (kiln::randn({Kd, N}, o) * (1.0 / std::sqrt(double(Kd)))).to(dt);
  Tensor dpre = kiln::empty({M, N}, x.options()), db = kiln::empty({N}, x.options());
  Tensor dpre2 = kiln::empty({M, N}, x.options()), db2 = kiln::empty({N}, x.options()),
         dh = kiln::empty({M, N}, x.options());
  K::matmul_dgelu_bgrad(dpre, db, g2, w2, aux, K::GeluApprox::Tanh);
  const bool used_dgelu = K::cuda::last_call_used_epilogue();
  auto separate = [&] {
    K::matmul(dh, g2, w2);
    K::bias_gelu_backward(dpre2, db2, dh, aux, Tensor(), K::GeluApprox::Tanh);
  };
  separate();
  e = max_rel_err(dpre, dpre2);
  kiln::bench::validate(e < gemm_tol(dt), ("dgelu_bgrad dpre " + name).c_str(), e);
  e = max_rel_err(db, db2) / std::sqrt(double(M));
  kiln::bench::validate(e < gemm_tol(dt), ("dgelu_bgrad dbias " + name).c_str(), e);
  const double t_fused =
      gpu::time_ms([&] { K::matmul_dgelu_bgrad(dpre, db, g2, w2, aux, K::GeluApprox::Tanh); }, 10, 5);
  const double t_sep = gpu::time_ms(separate, 10, 5);
  std::printf("gemm+dgelu+bgrad %-34s epilogue %7.3f ms%s | gemm+bias_gelu_backward %7.3f ms | %4.2fx\n", name.c_str(),
              t_fused, used_dgelu ? "" : " (fallback)", t_sep, t_sep / t_fused);
  const std::string bwd_case = "gemm+dgelu(tanh)+bgrad " + name;
  gpu::record("matmul", bwd_case, "kiln", t_fused, gpu::flops(flop));
  gpu::record("matmul", bwd_case, "kiln gemm+bias_gelu_backward", t_sep, gpu::flops(flop));
}

}  // namespace

int main() {
  const cudaDeviceProp prop = gpu::start("bench_cuda_matmul");
  std::printf("device: %s\n", prop.name);
  kiln::cuda::set_allow_tf32(true);
  cublasHandle_t h = nullptr;
  check_cublas(cublasCreate(&h), "cublasCreate");
  check_cublas(cublasSetStream(h, gpu::current_stream()), "cublasSetStream");
  for (DType dt : {DType::BF16, DType::F16, DType::F32}) {
    for (int64_t s : {1024, 2048, 4096, 8192}) gemm_row(h, dt, s, s, s, "square");
    // GPT-2 124M MLP at 8 x 1024 tokens: c_fc [8192x768] @ [768x3072], c_proj [8192x3072] @ [3072x768]
    gemm_row(h, dt, 8192, 768, 3072, "gpt2 fc");
    gemm_row(h, dt, 8192, 3072, 768, "gpt2 proj");
  }
  cublasDestroy(h);
  for (DType dt : {DType::BF16, DType::F32}) linear_gelu_row(dt, 8192, 768, 3072);
  return 0;
}
