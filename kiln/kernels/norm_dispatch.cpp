// The CPU-only fused conv / batch norm / ReLU / max-pool blocks (norm_kernels.h): each checks
// that its operands are on the CPU.
#include "kiln/kernels/dispatch.h"
#include "kiln/kernels/norm_kernels.h"

namespace kiln::kernels {


// CPU only: on other devices kiln::nn::functional::batch_norm_relu_max_pool2d runs
// batch_norm_relu and max_pool2d instead.
void batch_norm_relu_max_pool2x2_forward(const Tensor& out, const Tensor& indices,
                                         const Tensor& pooled_x, const Tensor& x,
                                         const Tensor& weight, const Tensor& bias,
                                         const Tensor& mean, const Tensor& invstd) {
  const char* op = "batch_norm_relu_max_pool2d";
  KILN_CHECK(operand_device(op, out, indices, pooled_x, x, weight, bias, mean, invstd).is_cpu(),
             op, ": the fused kernel is CPU-only (use batch_norm_relu then max_pool2d on ", x.device(), ")");
  cpu::batch_norm_relu_max_pool2x2_forward(out, indices, pooled_x, x, weight, bias, mean, invstd);
}

void batch_norm_relu_max_pool2x2_backward(const Tensor& dx, const Tensor& dweight,
                                          const Tensor& dbias, const Tensor& grad_out,
                                          const Tensor& out, const Tensor& pooled_x,
                                          const Tensor& indices, const Tensor& x,
                                          const Tensor& weight, const Tensor& mean,
                                          const Tensor& invstd, bool training) {
  const char* op = "batch_norm_relu_max_pool2d_backward";
  KILN_CHECK(operand_device(op, dx, dweight, dbias, grad_out, out, pooled_x, indices, x,
                                weight, mean, invstd).is_cpu(),
             op, ": the fused kernel is CPU-only, got ", x.device());
  cpu::batch_norm_relu_max_pool2x2_backward(dx, dweight, dbias, grad_out, out, pooled_x, indices, x,
                                            weight, mean, invstd, training);
}

void conv2d_batch_norm_relu_max_pool2x2_backward(
    const Tensor& dconv_x, const Tensor& dconv_w, const Tensor& dweight, const Tensor& dbias,
    const Tensor& grad_out, const Tensor& out, const Tensor& pooled_x, const Tensor& indices,
    const Tensor& y, const Tensor& conv_x, const Tensor& conv_w, const ConvGeometry& g,
    const Tensor& weight, const Tensor& mean, const Tensor& invstd, bool training) {
  const char* op = "conv2d_batch_norm_relu_max_pool2d_backward";
  KILN_CHECK(operand_device(op, dconv_x, dconv_w, dweight, dbias, grad_out, out, pooled_x, indices, y,
                                conv_x, conv_w, weight, mean, invstd).is_cpu(),
             op, ": the fused kernel is CPU-only, got ", y.device());
  cpu::conv2d_batch_norm_relu_max_pool2x2_backward(dconv_x, dconv_w, dweight, dbias, grad_out, out, pooled_x,
                                                   indices, y, conv_x, conv_w, g, weight, mean, invstd, training);
}

// CPU only: elsewhere kiln::nn::functional::conv2d_batch_norm_relu_max_pool2d runs conv2d and
// batch_norm_relu_max_pool2d instead.
bool conv_batch_norm_stats(const Tensor& mean, const Tensor& invstd, const Tensor& var,
                           const Tensor& patch_sum, const Tensor& gram, const Tensor& x,
                           const Tensor& conv_weight, const ConvGeometry& g, double eps) {
  const char* op = "conv2d_batch_norm_relu_max_pool2d";
  KILN_CHECK(operand_device(op, mean, invstd, var, patch_sum, gram, x, conv_weight).is_cpu(), op,
             ": the fused kernel is CPU-only, got ", x.device());
  return cpu::conv_batch_norm_stats(mean, invstd, var, patch_sum, gram, x, conv_weight, g, eps);
}

void conv_batch_norm_relu_max_pool2x2_forward(const Tensor& out, const Tensor& codes,
                                              const Tensor& x, const Tensor& conv_weight,
                                              const ConvGeometry& g, const Tensor& weight,
                                              const Tensor& bias, const Tensor& mean,
                                              const Tensor& invstd) {
  const char* op = "conv2d_batch_norm_relu_max_pool2d";
  KILN_CHECK(operand_device(op, out, codes, x, conv_weight, weight, bias, mean, invstd).is_cpu(),
             op, ": the fused kernel is CPU-only, got ", x.device());
  cpu::conv_batch_norm_relu_max_pool2x2_forward(out, codes, x, conv_weight, g, weight, bias, mean, invstd);
}

void conv_batch_norm_relu_max_pool2x2_backward(
    const Tensor& dconv_weight, const Tensor& dweight, const Tensor& dbias, const Tensor& grad_out,
    const Tensor& codes, const Tensor& x, const Tensor& conv_weight,
    const ConvGeometry& g, const Tensor& patch_sum, const Tensor& gram, const Tensor& weight,
    const Tensor& mean, const Tensor& invstd, bool training) {
  const char* op = "conv2d_batch_norm_relu_max_pool2d_backward";
  KILN_CHECK(operand_device(op, dconv_weight, dweight, dbias, grad_out, codes, x,
                                conv_weight, patch_sum, gram, weight, mean, invstd).is_cpu(),
             op, ": the fused kernel is CPU-only, got ", x.device());
  cpu::conv_batch_norm_relu_max_pool2x2_backward(dconv_weight, dweight, dbias, grad_out, codes, x,
                                                 conv_weight, g, patch_sum, gram, weight, mean, invstd,
                                                 training);
}

}  // namespace kiln::kernels
