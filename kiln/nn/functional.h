#pragma once
// kiln::nn::functional: the stateless forms of the layers, each differentiable, with CPU
// kernels (CUDA kernels arrive with the CUDA backend). Convention: `namespace F =
// kiln::nn::functional;` as in the design brief's example.
//
// Layouts follow PyTorch: images are [N, C, H, W] (a channels-last *strided* tensor is accepted
// wherever an NCHW one is, and results keep the input's memory format), conv weights
// [C_out, C_in / groups, kH, kW], sequences for conv1d [N, C, L].
#include <optional>
#include <string>
#include <tuple>

#include "kiln/core/tensor.h"

namespace kiln::nn::functional {

// ---- activations (thin wrappers over the core ops, plus leaky_relu)
inline Tensor relu(const Tensor& x) { return kiln::relu(x); }
inline Tensor gelu(const Tensor& x, const std::string& approximate = "none") { return kiln::gelu(x, approximate); }
inline Tensor silu(const Tensor& x) { return kiln::silu(x); }
inline Tensor tanh(const Tensor& x) { return kiln::tanh(x); }
inline Tensor sigmoid(const Tensor& x) { return kiln::sigmoid(x); }
inline Tensor softmax(const Tensor& x, int64_t dim) { return kiln::softmax(x, dim); }
inline Tensor log_softmax(const Tensor& x, int64_t dim) { return kiln::log_softmax(x, dim); }
Tensor leaky_relu(const Tensor& x, double negative_slope = 0.01);

// ---- linear: x @ weight^T + bias; x [..., in], weight [out, in], bias [out] or undefined
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// ---- convolution
struct Conv2dParams {
  IntList stride{1, 1};
  IntList padding{0, 0};
  IntList dilation{1, 1};
  int64_t groups = 1;
};
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), const Conv2dParams& params = {});
// [N, C, L] with weight [C_out, C_in / groups, K]; scalars for stride/padding/dilation
Tensor conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), int64_t stride = 1,
              int64_t padding = 0, int64_t dilation = 1, int64_t groups = 1);
// weight [C_in, C_out / groups, kH, kW]
struct ConvTranspose2dParams : Conv2dParams {  // conv2d's parameters, plus:
  IntList output_padding{0, 0};
};
Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
                        const ConvTranspose2dParams& params = {});

// ---- pooling (kernel/stride/padding as {h, w}; an empty stride means stride = kernel)
Tensor max_pool2d(const Tensor& x, const IntList& kernel, const IntList& stride = {}, const IntList& padding = {0, 0});
inline Tensor max_pool2d(const Tensor& x, int64_t kernel) { return max_pool2d(x, {kernel, kernel}); }
Tensor avg_pool2d(const Tensor& x, const IntList& kernel, const IntList& stride = {}, const IntList& padding = {0, 0},
                  bool count_include_pad = true);
Tensor adaptive_avg_pool2d(const Tensor& x, const IntList& output_size);

// ---- padding and resizing (kiln/nn/functional/resample.cpp), composed of cat, narrow and
// index_select, so differentiable (and twice differentiable) on every device.
// pad lists (left, right) pairs starting with the last dim, as torch.nn.functional.pad:
// {1, 2} pads the last dim, {1, 1, 2, 2} the last two. mode "constant" pads any number of dims
// with `value`, and a negative amount crops; "reflect" (the edge is not repeated: the amount must
// be smaller than the dim), "replicate" (the edge is repeated) and "circular" (wraps around; at
// most the dim's size) pad the last 1, 2 or 3 dims of an input with one or two more dims
// ([N, C, W] / [C, W], [N, C, H, W] / [C, H, W], [N, C, D, H, W] / [C, D, H, W]), amounts >= 0.
Tensor pad(const Tensor& x, const IntList& pad, const std::string& mode = "constant", double value = 0.0);

struct InterpolateOptions {
  // The output's spatial size, or the factor(s) to scale it by: exactly one of the two. One value
  // applies to every spatial dim. With scale_factor the output is floor(size * factor) and the
  // source coordinates use 1 / factor, as PyTorch (recompute_scale_factor unset).
  KILN_ARG(IntList, size);
  KILN_ARG(std::vector<double>, scale_factor);
  // "nearest" (PyTorch's legacy floor rule), "nearest-exact" (pixel centres), "linear" ([N, C, W]
  // input), "bilinear" or "bicubic" (Keys, A = -0.75; [N, C, H, W] input), "area" (adaptive
  // average pooling).
  KILN_ARG(std::string, mode) = "nearest";
  // linear / bilinear / bicubic: corners of input and output aligned (source = dst * (in - 1) /
  // (out - 1)), else pixel centres (source = (dst + 0.5) * in / out - 0.5; clamped at 0 except
  // for bicubic). The other modes refuse true.
  KILN_ARG(bool, align_corners) = false;
};
// x [N, C, W] or [N, C, H, W] -> the same with the new spatial size; the values and the gradient
// are PyTorch's (bilinear and bicubic run as one pass per dim, which rounds a little differently).
Tensor interpolate(const Tensor& x, const InterpolateOptions& options);

// ---- normalisation
// x [N, C, *]. In training mode uses batch statistics and, when running_mean/var are defined,
// updates them in place: running = (1 - momentum) * running + momentum * batch (unbiased var).
// In eval mode normalises with the running statistics.
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum = 0.1, double eps = 1e-5);
// relu(batch_norm(...)) fused (cuDNN's / oneDNN's BN + activation): same arguments, checks,
// autocast and running-statistics update as batch_norm. One kernel pass writes max(0, bn(x)); the
// backward recomputes the ReLU mask from x (it saves x, weight and bias, not the output), so the
// separate ReLU forward and backward passes disappear. nn::fuse runs Conv2d -> BatchNorm2d -> ReLU
// with it (nn::ConvBatchNormReLU2d).
Tensor batch_norm_relu(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                       const Tensor& bias, bool training, double momentum = 0.1, double eps = 1e-5);
Tensor layer_norm(const Tensor& x, const IntList& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
Tensor group_norm(const Tensor& x, int64_t num_groups, const Tensor& weight = Tensor(), const Tensor& bias = Tensor(),
                  double eps = 1e-5);
Tensor rms_norm(const Tensor& x, const IntList& normalized_shape, const Tensor& weight = Tensor(), double eps = 1e-6);

// ---- regularisation: zeroes with probability p and scales by 1/(1-p) in training; the mask
// comes from the device's Philox generator (reproducible under manual_seed).
Tensor dropout(const Tensor& x, double p = 0.5, bool training = true);

// ---- fused ops (kiln/nn/functional/fused.cpp): one kernel, forward and backward, where the plain
// composition runs several; same results and same dropout mask as the composition.
// gelu(x + bias), bias [K] over the last dimension (undefined: no bias); approximate as in gelu.
Tensor bias_gelu(const Tensor& x, const Tensor& bias, const std::string& approximate = "none");
// residual + dropout(x + bias, p, training): the Philox mask of dropout() for the same seed,
// regenerated (not stored) by the backward. residual has x's sizes; bias [K] or undefined.
Tensor bias_dropout_add(const Tensor& x, const Tensor& bias, const Tensor& residual, double p = 0.5,
                        bool training = true);
// x * 0.5 * (1 + erf(x / sqrt(2))) as a single kernel (the same as gelu(x)).
Tensor fused_gelu(const Tensor& x);
// gelu(linear(x, weight, bias)) with the bias and GELU fused into the GEMM's epilogue (cuBLASLt on
// CUDA) and the pre-activation saved for the backward. The default is the tanh form, which is
// what cuBLASLt's epilogue computes (and GPT-2's MLP uses); "none" runs the GEMM + bias epilogue
// and a separate bias_gelu pass on CUDA.
Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias, const std::string& approximate = "tanh");

// ---- embedding
inline Tensor embedding(const Tensor& indices, const Tensor& weight) { return kiln::embedding(weight, indices); }

// ---- losses (reduction as in PyTorch)
inline Tensor cross_entropy(const Tensor& input, const Tensor& target, int64_t ignore_index = -100,
                            double label_smoothing = 0.0, Reduction reduction = Reduction::Mean) {
  return kiln::cross_entropy(input, target, ignore_index, label_smoothing, reduction);
}
inline Tensor nll_loss(const Tensor& log_probs, const Tensor& target, int64_t ignore_index = -100,
                       Reduction reduction = Reduction::Mean) {
  return kiln::nll_loss(log_probs, target, ignore_index, reduction);
}
inline Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean) {
  return kiln::mse_loss(input, target, reduction);
}
Tensor l1_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);
Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean,
                      double beta = 1.0);
Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target,
                                        Reduction reduction = Reduction::Mean, const Tensor& pos_weight = Tensor());

// ---- attention: q, k, v [..., T, D] (any leading dims); softmax(q k^T / sqrt(D) [+ causal
// mask]) v. A blocked implementation on the CPU that never materialises more than one block of
// scores per row.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal = false);
// torch's full form: attn_mask bool (true: the key takes part) or floating (added to the scores),
// broadcast to [..., Tq, Tk], not together with is_causal; dropout_p on the attention
// probabilities (always applied: pass 0 in eval, as nanoGPT does); scale instead of 1 / sqrt(D).
// Without a mask and dropout this is the blocked path above; with either, the composite
// softmax(q k^T * scale + mask) v of differentiable ops (materialises the scores). As torch's, a
// query whose keys are all masked attends to nothing: its output row is 0, its gradients 0.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask,
                                    double dropout_p = 0.0, bool is_causal = false,
                                    std::optional<double> scale = std::nullopt);
// The full form's composite, returning also the probabilities it multiplies v by ([..., Tq, Tk],
// after dropout): what nn::MultiheadAttention returns as its attention weights. Unlike the full
// form, a query whose keys are all masked gets NaN probabilities and output (a plain softmax, as
// torch's nn.MultiheadAttention when it returns the weights).
std::tuple<Tensor, Tensor> scaled_dot_product_attention_and_weights(const Tensor& q, const Tensor& k, const Tensor& v,
                                                                    const Tensor& attn_mask, double dropout_p = 0.0,
                                                                    bool is_causal = false,
                                                                    std::optional<double> scale = std::nullopt);

}  // namespace kiln::nn::functional
