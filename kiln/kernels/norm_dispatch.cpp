// Routes the normalisation, dropout, attention and leaky-ReLU kernels (norm_kernels.h) to the
// backend of their operands, after checking that every defined operand is on one device.
#include <initializer_list>

#include "kiln/core/error.h"
#include "kiln/kernels/norm_kernels.h"
#include "kiln/config.h"
#if KILN_WITH_CUDA
#include "kiln/kernels/cuda/attention_cuda.h"
#endif
#include "kiln/config.h"
#if KILN_WITH_CUDA
#include "kiln/kernels/cuda/norm_cuda.h"
#endif

namespace kiln::kernels {

namespace {

// Undefined operands are optional ones (weight, bias, unwanted gradients) and are skipped.
Device common_device(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor* first = nullptr;
  for (const Tensor* t : ts) {
    if (!t->defined()) continue;
    if (!first) {
      first = t;
      continue;
    }
    KILN_CHECK(t->device() == first->device(), op, ": expected all tensors on one device, got ",
               first->device(), " (sizes ", first->sizes(), ") and ", t->device(), " (sizes ",
               t->sizes(), ")");
  }
  KILN_CHECK(first != nullptr, op, ": every operand is undefined");
  return first->device();
}

[[noreturn, maybe_unused]] void no_cuda_kernel(const char* op) {
  KILN_FAIL(op, ": no CUDA kernel in this build yet (the CUDA kernels arrive with the "
            "CUDA-backend issue); move the tensors to the CPU with .cpu()");
}

}  // namespace

void batch_norm_forward(const Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias,
                        const Tensor& mean, const Tensor& invstd, const Tensor& var, bool training,
                        double eps, bool relu) {
  const char* op = relu ? "batch_norm_relu" : "batch_norm";
  if (common_device(op, {&y, &x, &weight, &bias, &mean, &invstd, &var}).is_cpu())
    return cpu::batch_norm_forward(y, x, weight, bias, mean, invstd, var, training, eps, relu);
#if KILN_WITH_CUDA
  cuda::batch_norm_forward(y, x, weight, bias, mean, invstd, var, training, eps, relu);
#else
  no_cuda_kernel(op);
#endif
}

void batch_norm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                         const Tensor& g, const Tensor& x, const Tensor& weight,
                         const Tensor& mean, const Tensor& invstd, bool training, bool relu,
                         const Tensor& bias) {
  const char* op = relu ? "batch_norm_relu_backward" : "batch_norm_backward";
  // bias only takes part (in the ReLU mask) with relu
  const Tensor& b = relu ? bias : Tensor();
  if (common_device(op, {&dx, &dweight, &dbias, &g, &x, &weight, &b, &mean, &invstd}).is_cpu())
    return cpu::batch_norm_backward(dx, dweight, dbias, g, x, weight, mean, invstd, training, relu, b);
#if KILN_WITH_CUDA
  cuda::batch_norm_backward(dx, dweight, dbias, g, x, weight, mean, invstd, training, relu, b);
#else
  no_cuda_kernel(op);
#endif
}

void row_norm_forward(const Tensor& y, const Tensor& mean, const Tensor& invstd, const Tensor& x,
                      const Tensor& weight, const Tensor& bias, bool rms, double eps) {
  const char* op = rms ? "rms_norm" : "layer_norm";
  if (common_device(op, {&y, &mean, &invstd, &x, &weight, &bias}).is_cpu())
    return cpu::row_norm_forward(y, mean, invstd, x, weight, bias, rms, eps);
#if KILN_WITH_CUDA
  cuda::row_norm_forward(y, mean, invstd, x, weight, bias, rms, eps);
#else
  no_cuda_kernel(op);
#endif
}

void row_norm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                       const Tensor& g, const Tensor& x, const Tensor& weight, const Tensor& mean,
                       const Tensor& invstd, bool rms) {
  const char* op = rms ? "rms_norm_backward" : "layer_norm_backward";
  if (common_device(op, {&dx, &dweight, &dbias, &g, &x, &weight, &mean, &invstd}).is_cpu())
    return cpu::row_norm_backward(dx, dweight, dbias, g, x, weight, mean, invstd, rms);
#if KILN_WITH_CUDA
  cuda::row_norm_backward(dx, dweight, dbias, g, x, weight, mean, invstd, rms);
#else
  no_cuda_kernel(op);
#endif
}

void dropout(const Tensor& out, const Tensor& in, double p, uint64_t seed, uint64_t offset) {
  if (common_device("dropout", {&out, &in}).is_cpu()) return cpu::dropout(out, in, p, seed, offset);
#if KILN_WITH_CUDA
  cuda::dropout(out, in, p, seed, offset);
#else
  no_cuda_kernel("dropout");
#endif
}

void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                       const Tensor& v, double scale, bool causal) {
  if (common_device("scaled_dot_product_attention", {&out, &lse, &q, &k, &v}).is_cpu())
    return cpu::attention_forward(out, lse, q, k, v, scale, causal);
#if KILN_WITH_CUDA
  cuda::attention_forward(out, lse, q, k, v, scale, causal);
#else
  no_cuda_kernel("scaled_dot_product_attention");
#endif
}

void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& g,
                        const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, double scale, bool causal) {
  if (common_device("scaled_dot_product_attention_backward",
                    {&dq, &dk, &dv, &g, &q, &k, &v, &out, &lse}).is_cpu())
    return cpu::attention_backward(dq, dk, dv, g, q, k, v, out, lse, scale, causal);
#if KILN_WITH_CUDA
  cuda::attention_backward(dq, dk, dv, g, q, k, v, out, lse, scale, causal);
#else
  no_cuda_kernel("scaled_dot_product_attention_backward");
#endif
}

int64_t attention_block_size() { return cpu::attention_block_size(); }

void leaky_relu(const Tensor& y, const Tensor& x, double slope) {
  if (common_device("leaky_relu", {&y, &x}).is_cpu()) return cpu::leaky_relu(y, x, slope);
#if KILN_WITH_CUDA
  cuda::leaky_relu(y, x, slope);
#else
  no_cuda_kernel("leaky_relu");
#endif
}

void leaky_relu_backward(const Tensor& dx, const Tensor& g, const Tensor& x, double slope) {
  if (common_device("leaky_relu_backward", {&dx, &g, &x}).is_cpu())
    return cpu::leaky_relu_backward(dx, g, x, slope);
#if KILN_WITH_CUDA
  cuda::leaky_relu_backward(dx, g, x, slope);
#else
  no_cuda_kernel("leaky_relu_backward");
#endif
}

}  // namespace kiln::kernels
