#pragma once
// Conv2d -> BatchNorm2d -> ReLU, optionally followed by a 2x2 max pool, as one module whose
// forward runs the fused ops: F::conv2d_batch_norm_relu_max_pool2d with the pool (on the CPU one
// kernel that never writes the conv output for a small-patch conv, else conv2d with the
// BatchNorm's statistics in its epilogue + one BN + ReLU + pool kernel), conv2d +
// F::batch_norm_relu without it. Those ops check their kernels' preconditions and run the
// unfused ops where they are not met (a CUDA tensor, a conv bias, channels-last memory,
// autocast, ...), so the module works on every input the chain works on.
//
// It holds the original layers rather than copies: their parameters, buffers (running
// statistics, num_batches_tracked), momentum, eps and training mode are the ones used, so training
// and evaluation behave exactly as the unfused chain. nn::fuse builds it from such a chain in a
// Sequential; it can also be used directly, with the layers registered as "conv", "bn", "pool".
#include <memory>

#include "kiln/nn/activation.h"
#include "kiln/nn/conv.h"
#include "kiln/nn/normalization.h"

namespace kiln::nn {

class ConvBatchNormReLU2d : public Module {
 public:
  // pool: null for conv -> BN -> ReLU; otherwise a MaxPool2d that supports_pool accepts.
  ConvBatchNormReLU2d(std::shared_ptr<Conv2d> conv, std::shared_ptr<BatchNorm2d> bn,
                      std::shared_ptr<MaxPool2d> pool = nullptr);
  // The chain can run as this module: bn normalises conv's output channels.
  static bool supports(const Conv2d& conv, const BatchNorm2d& bn);
  // The pool is the one the fused op computes: a 2x2 window, stride 2, no padding.
  static bool supports_pool(const MaxPool2d& pool);

  Tensor forward(const Tensor& x) override;

  std::shared_ptr<Conv2d> conv;
  std::shared_ptr<BatchNorm2d> bn;
  std::shared_ptr<MaxPool2d> pool;  // null: no pool
};

}  // namespace kiln::nn
