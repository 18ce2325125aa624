// Differentiable 2-D pooling: max_pool2d (argmax indices saved for backward, int32 offsets
// h * W + w within each plane), avg_pool2d (count_include_pad) and adaptive_avg_pool2d. The CPU
// kernels read and write every operand through its strides, so no input is copied; the output
// (and the input gradient) is channels-last when the input is, NCHW-contiguous otherwise.
// f16/bf16 compute in f32 (widened here on the CPU; inside the kernels on CUDA). Double
// backward is not implemented and says so.
#include "kiln/core/autograd.h"
#include "kiln/core/shape.h"
#include "kiln/kernels/conv.h"
#include "kiln/kernels/memory_format.h"
#include "kiln/kernels/pool.h"
#include "kiln/nn/functional.h"
#include "kiln/nn/functional/pair_arg.h"

namespace kiln::nn::functional {

using autograd::SavedTensor;
using autograd::TensorList;
using kernels::PoolGeometry;

namespace {

using detail::pair_arg;

bool is_half(DType d) { return d == DType::F16 || d == DType::BF16; }

void check_input(const char* op, const Tensor& x) {
  KILN_CHECK(x.defined(), op, ": input is undefined");
  KILN_CHECK(x.dim() == 4 || x.dim() == 3, op, ": expected a 4-D input [N, C, H, W] (or 3-D [C, H, W]), got sizes ",
             x.sizes());
  KILN_CHECK(x.is_floating_point(), op, ": expected a floating-point input, got ", x.dtype(), " (sizes ", x.sizes(),
             ")");
}

MemoryFormat out_format(const Tensor& x) {
  return kernels::memory_format(x) == MemoryFormat::ChannelsLast ? MemoryFormat::ChannelsLast
                                                                 : MemoryFormat::Contiguous;
}

// The geometry of an [N, C, H, W] input with an OH x OW output; the window fields are left for
// the caller.
PoolGeometry image_geometry(const Tensor& x, int64_t OH, int64_t OW) {
  PoolGeometry g;
  g.N = x.size(0), g.C = x.size(1), g.H = x.size(2), g.W = x.size(3), g.OH = OH, g.OW = OW;
  return g;
}

// Window geometry with PyTorch's checks (no dilation, floor mode).
PoolGeometry window_geometry(const char* op, const Tensor& x, const IntList& kernel_in, const IntList& stride_in,
                             const IntList& padding_in) {
  const IntList k = pair_arg(op, "kernel_size", kernel_in);
  const IntList s = stride_in.empty() ? k : pair_arg(op, "stride", stride_in);
  const IntList p = pair_arg(op, "padding", padding_in);
  KILN_CHECK(k[0] > 0 && k[1] > 0, op, ": kernel_size must be positive, got ", k);
  KILN_CHECK(s[0] > 0 && s[1] > 0, op, ": stride must be positive, got ", s, " (input sizes ", x.sizes(), ")");
  KILN_CHECK(p[0] >= 0 && p[1] >= 0 && p[0] <= k[0] / 2 && p[1] <= k[1] / 2, op, ": padding ", p,
             " must be non-negative and at most half the kernel size ", k);
  PoolGeometry g = image_geometry(x, 0, 0);
  g.kh = k[0], g.kw = k[1], g.sh = s[0], g.sw = s[1], g.ph = p[0], g.pw = p[1];
  KILN_CHECK(g.H + 2 * g.ph >= g.kh && g.W + 2 * g.pw >= g.kw, op, ": kernel ", k, " is larger than the padded input ",
             g.H + 2 * g.ph, "x", g.W + 2 * g.pw, " (input sizes ", x.sizes(), ", padding ", p, ")");
  g.set_output_size();
  return g;
}

[[noreturn]] void no_double_backward(const char* op) {
  KILN_FAIL(op, ": double backward (create_graph=true through pooling) is not implemented yet");
}

// Records out's backward node: the input gradient is a new tensor like x (in fmt) that
// kernel(dx, grad_out) fills. Double backward is not implemented.
template <class Kernel>
void record_pool_backward(const char* node, const char* op, const Tensor& x, Tensor& out, MemoryFormat fmt,
                          Kernel kernel) {
  if (!autograd::any_requires_grad({&x})) return;
  const IntList xs = x.sizes();
  const TensorOptions opts = x.options();
  autograd::record_function(node, {&x}, {&out}, [=](const TensorList& grads) {
    if (GradMode::is_enabled()) no_double_backward(op);
    Tensor dx = kernels::empty_4d(xs, opts, fmt);
    kernel(dx, grads[0]);
    return TensorList{dx};
  });
}

}  // namespace

Tensor max_pool2d(const Tensor& x, const IntList& kernel, const IntList& stride, const IntList& padding) {
  const char* op = "max_pool2d";
  check_input(op, x);
  if (x.dim() == 3) return max_pool2d(x.unsqueeze(0), kernel, stride, padding).squeeze(0);
  if (is_half(x.dtype()) && x.device().is_cpu())  // the CUDA kernels take f16/bf16
    return max_pool2d(x.to(DType::F32), kernel, stride, padding).to(x.dtype());
  const PoolGeometry g = window_geometry(op, x, kernel, stride, padding);
  const MemoryFormat fmt = out_format(x);
  Tensor xd = x.detach();
  Tensor out = kernels::empty_4d({g.N, g.C, g.OH, g.OW}, x.options(), fmt);
  Tensor idx = kernels::empty_4d({g.N, g.C, g.OH, g.OW}, TensorOptions(DType::I32).device(x.device()), fmt);
  kernels::max_pool2d_forward(out, idx, xd, g);
  record_pool_backward("MaxPool2dBackward", op, x, out, fmt,
                       [idx, g](const Tensor& dx, const Tensor& gy) { kernels::max_pool2d_backward(dx, gy, idx, g); });
  return out;
}

Tensor avg_pool2d(const Tensor& x, const IntList& kernel, const IntList& stride, const IntList& padding,
                  bool count_include_pad) {
  const char* op = "avg_pool2d";
  check_input(op, x);
  if (x.dim() == 3) return avg_pool2d(x.unsqueeze(0), kernel, stride, padding, count_include_pad).squeeze(0);
  if (is_half(x.dtype()) && x.device().is_cpu())  // the CUDA kernels take f16/bf16
    return avg_pool2d(x.to(DType::F32), kernel, stride, padding, count_include_pad).to(x.dtype());
  const PoolGeometry g = window_geometry(op, x, kernel, stride, padding);
  const MemoryFormat fmt = out_format(x);
  Tensor out = kernels::empty_4d({g.N, g.C, g.OH, g.OW}, x.options(), fmt);
  kernels::avg_pool2d_forward(out, x.detach(), g, count_include_pad);
  record_pool_backward("AvgPool2dBackward", op, x, out, fmt,
                       [g, count_include_pad](const Tensor& dx, const Tensor& gy) {
                         kernels::avg_pool2d_backward(dx, gy, g, count_include_pad);
                       });
  return out;
}

Tensor adaptive_avg_pool2d(const Tensor& x, const IntList& output_size) {
  const char* op = "adaptive_avg_pool2d";
  check_input(op, x);
  if (x.dim() == 3) return adaptive_avg_pool2d(x.unsqueeze(0), output_size).squeeze(0);
  if (is_half(x.dtype()) && x.device().is_cpu())
    return adaptive_avg_pool2d(x.to(DType::F32), output_size).to(x.dtype());
  const IntList os = pair_arg(op, "output_size", output_size);
  KILN_CHECK(os[0] > 0 && os[1] > 0, op, ": output_size must be positive, got ", os, " (input sizes ", x.sizes(), ")");
  KILN_CHECK(x.size(2) > 0 && x.size(3) > 0, op, ": empty spatial input, sizes ", x.sizes());
  const PoolGeometry g = image_geometry(x, os[0], os[1]);
  const MemoryFormat fmt = out_format(x);
  Tensor out = kernels::empty_4d({g.N, g.C, g.OH, g.OW}, x.options(), fmt);
  kernels::adaptive_avg_pool2d_forward(out, x.detach(), g);
  record_pool_backward("AdaptiveAvgPool2dBackward", op, x, out, fmt,
                       [g](const Tensor& dx, const Tensor& gy) { kernels::adaptive_avg_pool2d_backward(dx, gy, g); });
  return out;
}

}  // namespace kiln::nn::functional
