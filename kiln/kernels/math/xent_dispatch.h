#pragma once
// The dtype dispatch shared by the fused cross-entropy kernels (kiln/kernels/cpu/xent.cpp,
// kiln/kernels/cuda/xent.cu; docs/kernels.md "Fused softmax + cross-entropy").
#include "kiln/core/dtype.h"
#include "kiln/core/tensor.h"

namespace kiln::kernels::xent {

// Runs f(tag, itag), tag for the dtype of the logits [R, C], itag for the targets' index dtype;
// nothing when there are no rows (R = 0).
template <class F> void dispatch_logits_targets(const Tensor& logits, const Tensor& target, const char* op, F&& f) {
  if (logits.size(0) == 0) return;
  dispatch_floating(logits.dtype(), op,
                    [&](auto tag) { dispatch_index(target.dtype(), op, [&](auto itag) { f(tag, itag); }); });
}

}  // namespace kiln::kernels::xent
