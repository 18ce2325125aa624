#pragma once
// Small checks and steps that several ops files share (internal header, not installed).
#include "kiln/core/autograd.h"
#include "kiln/core/error.h"
#include "kiln/core/tensor.h"

namespace kiln::detail {

// In-place ops write without recording a graph, so they refuse a tensor that requires grad
// while grad mode is on.
inline void check_inplace(const Tensor& t, const char* op) {
  KILN_CHECK(t.defined(), op, ": tensor is undefined");
  KILN_CHECK(!(GradMode::is_enabled() && t.requires_grad()), op,
             ": in-place operation on a tensor that requires grad while grad mode is on; "
             "wrap it in kiln::NoGradGuard or use the out-of-place op");
}

// A loss's per-element values reduced as `reduction` says.
inline Tensor reduce_loss(const Tensor& per_element, Reduction reduction) {
  switch (reduction) {
    case Reduction::None: return per_element;
    case Reduction::Sum: return per_element.sum();
    case Reduction::Mean: return per_element.mean();
  }
  return per_element;
}

}  // namespace kiln::detail
