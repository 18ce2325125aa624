// Routes the nn kernels (convolution, pooling) to the backend of their operands' device, after
// checking that all operands agree on it: the CPU kernels (kernels/cpu/{conv,pool}.cpp) or, in
// builds with CUDA, the CUDA ones (kernels/cuda/conv_cudnn.cpp through cuDNN, kernels/cuda/pool.cu).
#include "kiln/config.h"
#include "kiln/core/shape.h"
#include "kiln/kernels/nn_kernels.h"

#if KILN_WITH_CUDA
#include "kiln/kernels/cuda/conv_cuda.h"
#endif

namespace kiln::kernels {

namespace {

bool on_cpu(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor* first = nullptr;
  for (const Tensor* t : ts) {
    if (!t->defined()) continue;  // optional operands (bias)
    if (!first) {
      first = t;
      continue;
    }
    KILN_CHECK(t->device() == first->device(), op, ": expected all tensors on one device, got ",
               first->device(), " (sizes ", first->sizes(), ") and ", t->device(), " (sizes ",
               t->sizes(), ")");
  }
  KILN_CHECK(first, op, ": every operand is undefined");
  if (first->device().is_cpu()) return true;
#if KILN_WITH_CUDA
  if (first->device().is_cuda()) return false;
#endif
  KILN_FAIL(op, ": no kernel in this build for tensors on ", first->device(), " (sizes ",
            first->sizes(), "); kiln was built without CUDA; move the tensors to the CPU with "
            ".cpu()");
}

// The CUDA kernel when built with CUDA (on_cpu() only returns false then).
#if KILN_WITH_CUDA
#define KILN_NN_CUDA(call) cuda::call
#else
#define KILN_NN_CUDA(call) KILN_FAIL("unreachable: CUDA tensor in a build without CUDA")
#endif

}  // namespace

bool has_layout(const Tensor& t, MemoryFormat fmt) {
  if (fmt == MemoryFormat::Contiguous) return t.is_contiguous();
  if (fmt != MemoryFormat::ChannelsLast || t.dim() != 4) return false;
  const int64_t N = t.size(0), C = t.size(1), H = t.size(2), W = t.size(3);
  return (C == 1 || t.stride(1) == 1) && (W == 1 || t.stride(3) == C) &&
         (H == 1 || t.stride(2) == W * C) && (N == 1 || t.stride(0) == H * W * C);
}

MemoryFormat memory_format(const Tensor& t) {
  if (t.dim() != 4) return t.is_contiguous() ? MemoryFormat::Contiguous : MemoryFormat::Other;
  const int64_t C = t.size(1), H = t.size(2), W = t.size(3);
  const IntList& st = t.strides();
  if (st[3] == 1 && st[2] == W && st[1] == H * W && st[0] == C * H * W) return MemoryFormat::Contiguous;
  if (st[1] == 1 && st[3] == C && st[2] == W * C && st[0] == H * W * C) return MemoryFormat::ChannelsLast;
  if (t.is_contiguous()) return MemoryFormat::Contiguous;
  if (has_layout(t, MemoryFormat::ChannelsLast)) return MemoryFormat::ChannelsLast;
  return MemoryFormat::Other;
}

Tensor empty_4d(const IntList& s, const TensorOptions& opts, MemoryFormat fmt) {
  if (fmt != MemoryFormat::ChannelsLast) return empty(s, opts);
  return empty({s[0], s[2], s[3], s[1]}, opts).permute({0, 3, 1, 2});
}

void conv2d_forward(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias,
                    const ConvGeometry& g) {
  if (on_cpu("conv2d", {&out, &x, &weight, &bias}))
    cpu::conv2d_forward(out, x, weight, bias, g);
  else
    KILN_NN_CUDA(conv2d_forward(out, x, weight, bias, g));
}

void conv2d_backward_input(const Tensor& grad_x, const Tensor& grad_out, const Tensor& weight,
                           const ConvGeometry& g) {
  if (on_cpu("conv2d_backward_input", {&grad_x, &grad_out, &weight}))
    cpu::conv2d_backward_input(grad_x, grad_out, weight, g);
  else
    KILN_NN_CUDA(conv2d_backward_input(grad_x, grad_out, weight, g));
}

void conv2d_backward_weight(const Tensor& grad_weight, const Tensor& grad_bias,
                            const Tensor& grad_out, const Tensor& x, const ConvGeometry& g) {
  if (on_cpu("conv2d_backward_weight", {&grad_weight, &grad_bias, &grad_out, &x}))
    cpu::conv2d_backward_weight(grad_weight, grad_bias, grad_out, x, g);
  else
    KILN_NN_CUDA(conv2d_backward_weight(grad_weight, grad_bias, grad_out, x, g));
}

void max_pool2d_forward(const Tensor& out, const Tensor& indices, const Tensor& x,
                        const PoolGeometry& g) {
  if (on_cpu("max_pool2d", {&out, &indices, &x}))
    cpu::max_pool2d_forward(out, indices, x, g);
  else
    KILN_NN_CUDA(max_pool2d_forward(out, indices, x, g));
}

void max_pool2d_backward(const Tensor& grad_x, const Tensor& grad_out, const Tensor& indices,
                         const PoolGeometry& g) {
  if (on_cpu("max_pool2d_backward", {&grad_x, &grad_out, &indices}))
    cpu::max_pool2d_backward(grad_x, grad_out, indices, g);
  else
    KILN_NN_CUDA(max_pool2d_backward(grad_x, grad_out, indices, g));
}

void avg_pool2d_forward(const Tensor& out, const Tensor& x, const PoolGeometry& g,
                        bool count_include_pad) {
  if (on_cpu("avg_pool2d", {&out, &x}))
    cpu::avg_pool2d_forward(out, x, g, count_include_pad);
  else
    KILN_NN_CUDA(avg_pool2d_forward(out, x, g, count_include_pad));
}

void avg_pool2d_backward(const Tensor& grad_x, const Tensor& grad_out, const PoolGeometry& g,
                         bool count_include_pad) {
  if (on_cpu("avg_pool2d_backward", {&grad_x, &grad_out}))
    cpu::avg_pool2d_backward(grad_x, grad_out, g, count_include_pad);
  else
    KILN_NN_CUDA(avg_pool2d_backward(grad_x, grad_out, g, count_include_pad));
}

void adaptive_avg_pool2d_forward(const Tensor& out, const Tensor& x, const PoolGeometry& g) {
  if (on_cpu("adaptive_avg_pool2d", {&out, &x}))
    cpu::adaptive_avg_pool2d_forward(out, x, g);
  else
    KILN_NN_CUDA(adaptive_avg_pool2d_forward(out, x, g));
}

void adaptive_avg_pool2d_backward(const Tensor& grad_x, const Tensor& grad_out,
                                  const PoolGeometry& g) {
  if (on_cpu("adaptive_avg_pool2d_backward", {&grad_x, &grad_out}))
    cpu::adaptive_avg_pool2d_backward(grad_x, grad_out, g);
  else
    KILN_NN_CUDA(adaptive_avg_pool2d_backward(grad_x, grad_out, g));
}

}  // namespace kiln::kernels
