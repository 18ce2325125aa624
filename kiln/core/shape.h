#pragma once
#include <vector>
// Shape arithmetic shared by ops and kernels.
#include <algorithm>
#include <cstdint>

#include "kiln/core/error.h"
#include "kiln/core/tensor.h"

namespace kiln {

// Maps a possibly negative dim into [0, ndim); a 0-dim tensor accepts 0 and -1.
inline int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  int64_t n = std::max<int64_t>(ndim, 1);
  KILN_CHECK(dim >= -n && dim < n, op, ": dimension ", dim, " out of range for a tensor with ", ndim, " dimensions");
  return dim < 0 ? dim + n : dim;
}

inline IntList contiguous_strides(const IntList& sizes) {
  IntList st(sizes.size());
  int64_t s = 1;
  for (int64_t i = static_cast<int64_t>(sizes.size()) - 1; i >= 0; --i) {
    st[i] = s;
    s *= std::max<int64_t>(sizes[i], 1);
  }
  return st;
}

// NumPy broadcasting of two shapes; `op` names the caller in the error.
IntList broadcast_shapes(const IntList& a, const IntList& b, const char* op);

// Sums `t` down to `shape` (the inverse of broadcasting; used by backward formulas).
Tensor sum_to(const Tensor& t, const IntList& shape);

// Sorted, wrapped, de-duplicated reduction dims; empty `dims` means all.
IntList reduction_dims(const IntList& dims, int64_t ndim, const char* op);

// A new tensor of `like`'s sizes whose strides follow `like`'s dimension order when `like` is
// dense (a permutation of a contiguous layout, channels-last included), so elementwise results
// keep the memory format of their input (PyTorch's preserve_format). Contiguous otherwise.
Tensor empty_preserving_layout(const Tensor& like, const TensorOptions& options);
// The same from a layout alone (sizes and strides), for backward closures that keep the shape of
// an input but not the input itself.
Tensor empty_preserving_layout(const IntList& sizes, const IntList& strides, const TensorOptions& options);

// Sibling views: tensors of equal sizes and strides in one storage at evenly spaced offsets, as
// the parts of unbind/chunk of one tensor are (the q, k and v of a fused projection). For such
// tensors, new ones (options' dtype and device) laid out the same way relative to each other in
// one new buffer, so that gradients written into them tile one base-shaped gradient as the parts
// tile their base, and the unbind's backward needs no copy (docs/architecture.md, "Views").
// Otherwise, or for fewer than two tensors, each an empty_preserving_layout of its own.
std::vector<Tensor> empty_like_siblings(const std::vector<Tensor>& parts, const TensorOptions& options);

// The inverse question, for the backward of views that tile `sizes`/`strides` along dim d at
// `starts` (one part per start; `squeezed`: parts lack dim d, as unbind's): when the parts'
// gradients g already lie in one buffer exactly where the parts lie in their base, that buffer
// viewed as the base's gradient (no copy); undefined otherwise.
Tensor view_of_tiled_parts(const std::vector<Tensor>& g, const IntList& sizes, const IntList& strides, int64_t d,
                           const IntList& starts, bool squeezed);

}  // namespace kiln
