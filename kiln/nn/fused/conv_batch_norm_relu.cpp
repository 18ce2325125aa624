#include "kiln/nn/fused/conv_batch_norm_relu.h"

#include "kiln/nn/fused/conv_block.h"

namespace kiln::nn {

namespace F = functional;

ConvBatchNormReLU2d::ConvBatchNormReLU2d(std::shared_ptr<Conv2d> conv_layer, std::shared_ptr<BatchNorm2d> bn_layer,
                                         std::shared_ptr<MaxPool2d> pool_layer)
    : Module("ConvBatchNormReLU2d"), conv(std::move(conv_layer)), bn(std::move(bn_layer)), pool(std::move(pool_layer)) {
  KILN_CHECK(conv && bn, type_name(), ": the conv and the BatchNorm must be given");
  KILN_CHECK(supports(*conv, *bn), type_name(), ": the BatchNorm normalises ", bn->options.num_features(),
             " channels but the conv has ", conv->options.out_channels(), " output channels");
  KILN_CHECK(!pool || supports_pool(*pool), type_name(),
             ": the pool must be a 2x2 window with stride 2 and no "
             "padding, got ",
             pool->extra_repr());
  register_module("conv", conv);
  register_module("bn", bn);
  if (pool) register_module("pool", pool);
}

bool ConvBatchNormReLU2d::supports(const Conv2d& conv, const BatchNorm2d& bn) {
  return conv.options.out_channels() == bn.options.num_features();
}

bool ConvBatchNormReLU2d::supports_pool(const MaxPool2d& pool) {
  return pool.options.kernel_size() == Size2(2) && pool.options.stride() == Size2(2) &&
         pool.options.padding() == Size2(0);
}

Tensor ConvBatchNormReLU2d::forward(const Tensor& x) {
  const auto& o = bn->options;
  if (!pool) {
    Tensor y = (*conv)(x);
    const bool use_batch_stats = bn->count_batch();
    return F::batch_norm_relu(y, bn->running_mean, bn->running_var, bn->weight, bn->bias, use_batch_stats, o.momentum(),
                              o.eps());
  }
  const bool use_batch_stats = bn->count_batch();
  return F::conv2d_batch_norm_relu_max_pool2d(x, conv->weight, conv->bias, conv->params(), bn->running_mean,
                                              bn->running_var, bn->weight, bn->bias, use_batch_stats, o.momentum(),
                                              o.eps());
}

}  // namespace kiln::nn
