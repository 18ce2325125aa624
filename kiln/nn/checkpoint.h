#pragma once
// Activation (gradient) checkpointing: run a segment of the forward pass
// without keeping its intermediate activations, and recompute them during backward.
//
//   auto h = kiln::checkpoint([&](const std::vector<kiln::Tensor>& in) { return block(in[0]); }, {x});
//
// Only the segment's inputs (and the RNG state, so dropout draws the same mask again) are kept.
// Backward re-runs the segment with grad on and backpropagates through it: gradients reach the
// inputs and every parameter used inside. Costs one extra forward of the segment.
#include <functional>
#include <vector>

#include "kiln/nn/container.h"

namespace kiln {

Tensor checkpoint(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& inputs);

// Splits a Sequential into `segments` contiguous runs and checkpoints each one but the last
// (whose activations backward needs first anyway), like torch.utils.checkpoint.checkpoint_sequential.
// A fused run (nn::fuse) that a segment boundary cuts runs unfused.
Tensor checkpoint_sequential(nn::Sequential& seq, int64_t segments, const Tensor& input);

}  // namespace kiln
