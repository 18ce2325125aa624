// Attention on the GPU: the fused flash-style kernel (kiln/kernels/cuda/attention.cu) behind
// F::scaled_dot_product_attention against the naive composition softmax(q k^T * scale [+ mask]) v
// of kiln ops on the GPU (cuBLASLt matmuls, the softmax kernel, a where for the causal mask), which
// writes the [T, T] scores to memory and keeps them for backward.
//
// Shapes are GPT-2-small-like: [8, 12, T, 64] (batch 8, 12 heads, head dim 64), T = 256 and 1024,
// causal and not, f32 and bf16. Every configuration is validated first: the fused output and
// gradients against the naive ones (exit 1 on a mismatch). Printed: median ms per call (CUDA
// events), the ratio naive / fused (> 1: fused is faster) and the fused forward's TFLOP/s
// (4 * B * H * T^2 * D multiply-adds counted as 2 FLOPs each, halved when causal).
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <kiln/kiln.h>

#include "cuda_bench_util.h"

namespace F = kiln::nn::functional;
using kiln::DType;
using kiln::Tensor;
namespace gpu = kiln::bench::gpu;

namespace {

Tensor naive(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  const int64_t Tq = q.size(-2), Tk = k.size(-2), D = q.size(-1);
  Tensor s = kiln::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(D)));
  if (causal) {
    auto o = kiln::TensorOptions().dtype(DType::I64).device(q.device());
    Tensor future =
        kiln::arange(static_cast<double>(Tq), o).view({Tq, 1}) < kiln::arange(static_cast<double>(Tk), o).view({1, Tk});
    s = kiln::where(future, -INFINITY, s);
  }
  return kiln::matmul(kiln::softmax(s, -1), v);
}

// out, dq, dk, dv for the gradient g of the output.
std::vector<Tensor> forward_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, bool causal,
                                     bool fused) {
  Tensor qq = q.detach().requires_grad_(true), kk = k.detach().requires_grad_(true),
         vv = v.detach().requires_grad_(true);
  Tensor y = fused ? F::scaled_dot_product_attention(qq, kk, vv, causal) : naive(qq, kk, vv, causal);
  y.backward(g);
  return {y.detach(), qq.grad(), kk.grad(), vv.grad()};
}

// max |a - b| / max(1, max |b|)
double rel_err(const Tensor& a, const Tensor& b) {
  Tensor a64 = a.to(DType::F64), b64 = b.to(DType::F64);
  double scale = std::max(1.0, kiln::abs(b64).max().item<double>());
  return kiln::abs(a64 - b64).max().item<double>() / scale;
}

}  // namespace

int main() {
  const cudaDeviceProp prop = gpu::start("bench_cuda_attention");
  const kiln::Device dev = kiln::Device::cuda(0);
  std::printf("device: %s\n", prop.name);
  std::printf("%-32s %10s %10s %7s %9s %11s %11s %7s\n", "shape [B, H, T, D], causal, dtype", "fused fwd", "naive fwd",
              "ratio", "fwd TF/s", "fused f+b", "naive f+b", "ratio");
  const int64_t B = 8, H = 12, D = 64;
  for (DType dt : {DType::F32, DType::BF16})
    for (int64_t T : {256, 1024})
      for (bool causal : {true, false}) {
        auto o = kiln::TensorOptions().dtype(dt).device(dev);
        Tensor q = kiln::randn({B, H, T, D}, o), k = kiln::randn({B, H, T, D}, o), v = kiln::randn({B, H, T, D}, o),
               g = kiln::randn({B, H, T, D}, o);

        // validate: output and gradients of the two versions agree
        const double tol = dt == DType::F32 ? 1e-4 : 3e-2;
        std::vector<Tensor> a = forward_backward(q, k, v, g, causal, true);
        std::vector<Tensor> b = forward_backward(q, k, v, g, causal, false);
        const char* names[] = {"out", "dq", "dk", "dv"};
        for (int i = 0; i < 4; ++i) {
          const double err = rel_err(a[i], b[i]);
          const std::string what = std::string("fused vs naive attention ") + names[i];
          kiln::bench::validate(err < tol, what.c_str(), err);
        }

        auto fwd = [&](bool fused) {
          kiln::NoGradGuard ng;
          Tensor y = fused ? F::scaled_dot_product_attention(q, k, v, causal) : naive(q, k, v, causal);
        };
        const double tf = gpu::time_ms([&] { fwd(true); });
        const double tn = gpu::time_ms([&] { fwd(false); });
        const double tfb = gpu::time_ms([&] { forward_backward(q, k, v, g, causal, true); }, 10, 3);
        const double tnb = gpu::time_ms([&] { forward_backward(q, k, v, g, causal, false); }, 10, 3);
        const double flops = 4.0 * B * H * T * T * D * (causal ? 0.5 : 1.0);
        char shape[64];
        std::snprintf(shape, sizeof shape, "[%lld, %lld, %lld, %lld], %s, %s", (long long)B, (long long)H, (long long)T,
                      (long long)D, causal ? "yes" : "no", kiln::dtype_name(dt));
        std::printf("%-32s %8.3fms %8.3fms %6.2fx %9.2f %9.3fms %9.3fms %6.2fx\n", shape, tf, tn, tn / tf,
                    flops / (tf * 1e-3) / 1e12, tfb, tnb, tnb / tfb);
        // recorded as "[8, 12, 1024, 64] causal bfloat16 forward" / "... fwd+bwd"; fwd+bwd counts
        // 3.5x the forward's FLOPs (the backward's five T x T matmuls against the forward's two)
        const std::string rec = "[" + std::to_string(B) + ", " + std::to_string(H) + ", " + std::to_string(T) + ", " +
                                std::to_string(D) + "] " + (causal ? "causal " : "non-causal ") + kiln::dtype_name(dt);
        gpu::record("attention", rec + " forward", "kiln", tf, gpu::flops(flops));
        gpu::record("attention", rec + " forward", "naive", tn, gpu::flops(flops));
        gpu::record("attention", rec + " fwd+bwd", "kiln", tfb, gpu::flops(3.5 * flops));
        gpu::record("attention", rec + " fwd+bwd", "naive", tnb, gpu::flops(3.5 * flops));
      }
  std::printf(
      "ratio = naive time / fused time. The naive version materialises the [T, T] scores and\n"
      "probabilities: 96 x 1024 x 1024 x 4 B = 384 MiB per f32 matrix at T = 1024.\n"
      "The fused kernel is the scalar first version (no tensor cores): see attention.cu.\n");
  return 0;
}
