#pragma once
// kiln::nn::fuse: a pass over any module tree that makes every Sequential in it, and every chain
// a module declares (Module::declare_chain), run its fusable stretches as fused modules:
//
//   Conv2d -> BatchNorm2d -> ReLU [-> MaxPool2d(2)]   ->  ConvBatchNormReLU2d
//   Linear -> GELU                                     ->  LinearGELU
//
//   auto model = std::make_shared<MyCNN>();
//   kiln::nn::fuse(*model);   // after construction, before or after to(device) / load
//
// Only a Sequential's forward, and a declared chain's run_chain, are known to apply their modules
// one after the other, so the pass looks there (at every depth; a model that is itself a
// Sequential, like models::FashionCNN, included; ResNet's blocks declare conv1 -> bn1 -> relu).
// Other hand-written forwards are left alone. A stretch is matched on the exact layer types (a
// subclass may have its own forward) and when the fused module supports it
// (ConvBatchNormReLU2d::supports, supports_pool); a pool it does not support stays a separate
// module after the fused block.
//
// Nothing is copied: the fused modules hold the original layers, which stay registered where
// they were, so parameters(), the state_dict keys, checkpoints, optimizers, train()/eval() and
// to() see the same model, before and after. Training and eval results are those of the unfused
// layers (BatchNorm's running statistics, momentum and num_batches_tracked included), up to
// float rounding. Where a fused kernel's preconditions are not met at run time (device, dtype,
// layout, autocast), the fused op runs the unfused ops. Calling fuse again fuses nothing new;
// Sequential::unfuse() undoes it for one container (or one chain: module.chains()[i]->unfuse()).
#include <cstdint>

#include "kiln/nn/module.h"

namespace kiln::nn {

// Returns the number of chains fused.
int64_t fuse(Module& module);

}  // namespace kiln::nn
