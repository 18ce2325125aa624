#pragma once
// The conv-block ops: the fused functional ops behind nn::ConvBatchNormReLU2d, which nn::fuse
// puts in place of a Conv2d -> BatchNorm2d -> ReLU [-> MaxPool2d(2)] stretch. They live here, with
// the fusion pass and the fused modules, rather than in kiln/nn/functional.h: a model reaches them
// through nn::fuse, and plain batch_norm and conv2d know nothing of them (they are built on
// conv2d's detail::conv2d_with_forward hook and batch_norm's argument checks). Their kernels are
// the conv-block family of kiln/kernels/conv_block.h.
#include "kiln/core/tensor.h"
#include "kiln/nn/functional.h"

namespace kiln::nn::functional {

// max_pool2d(batch_norm_relu(...), 2) fused, for [N, C, H, W] input: the tail of a VGG-style conv
// block. On contiguous NCHW CPU tensors one kernel pools max(0, bn(x)) without writing the
// normalised tensor, and the backward goes from the pooled gradient straight to dx, dweight and
// dbias (bench_norm). Where the kernel's preconditions (kernels::supports_batch_norm_relu_max_pool2x2
// in kiln/kernels/conv_block.h) are not met or under autocast (CUDA, channels-last, ...) it runs
// the two ops. Double backward is not supported on the fused path.
Tensor batch_norm_relu_max_pool2d(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                                  const Tensor& weight, const Tensor& bias, bool training, double momentum = 0.1,
                                  double eps = 1e-5);
// max_pool2d(batch_norm_relu(conv2d(x, conv_weight, conv_bias, params), ...), 2): a CNN's first
// conv block, fused on the CPU when the conv's patch is small (C * kh * kw <= 32), stride 1, groups
// 1, no conv bias, x f32/f64 contiguous NCHW not needing its gradient, outside
// autocast. The conv output -- the block's largest tensor -- is never written: batch statistics
// come from the input's patch moments, each channel's conv plane is computed in cache and pooled
// through the BatchNorm + ReLU at once, and the backward goes from the pooled gradient straight to
// the conv weight's and BatchNorm's gradients (kiln/kernels/cpu/conv_bn_relu_pool.cpp;
// bench_norm). Everywhere else it runs conv2d and batch_norm_relu_max_pool2d, same results; on
// the CPU with NCHW memory in training, conv2d then takes the BatchNorm's batch statistics in its
// epilogue while each sample's output is in cache (one pass less over the conv output), and when
// gradients are wanted the two are one node whose backward builds the conv output's gradient one
// sample at a time in cache for the conv's weight and input GEMMs instead of storing it. The
// choice is made up front from the kernels' supports_* (kiln/kernels/conv_block.h); see
// docs/guide.md, "Fusion". nn::ConvBatchNormReLU2d (what nn::fuse makes of a conv block) calls it.
// Double backward is not supported on the fused path.
Tensor conv2d_batch_norm_relu_max_pool2d(const Tensor& x, const Tensor& conv_weight, const Tensor& conv_bias,
                                         const Conv2dParams& params, const Tensor& running_mean,
                                         const Tensor& running_var, const Tensor& weight, const Tensor& bias,
                                         bool training, double momentum = 0.1, double eps = 1e-5);
}  // namespace kiln::nn::functional
