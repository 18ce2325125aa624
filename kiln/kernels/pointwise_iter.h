#pragma once
// Shared by the CPU and CUDA pointwise launchers: lays out an output and its inputs as one
// strided N-d iteration space. Inputs are broadcast to the output's shape (stride 0), dimensions
// of size 1 are dropped and neighbouring dimensions that are contiguous for every operand are
// merged, so the common cases collapse to a single flat dimension.
#include <cstdint>
#include <initializer_list>

#include "kiln/core/error.h"
#include "kiln/core/tensor.h"

namespace kiln::kernels {

constexpr int kMaxDims = 12;
constexpr int kMaxOperands = 4;

struct PointwiseIter {
  int ndim = 0;       // after merging; 0 means a single element
  int noperands = 0;  // operand 0 is the output
  int64_t numel = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxOperands][kMaxDims] = {};  // bytes; dimension 0 is the outermost
  char* data[kMaxOperands] = {};
  int64_t elem_size[kMaxOperands] = {};

  // True when every operand steps by exactly its element size along the innermost dimension.
  bool inner_contiguous() const {
    if (ndim == 0) return true;
    for (int k = 0; k < noperands; ++k)
      if (strides[k][ndim - 1] != elem_size[k]) return false;
    return true;
  }
  bool is_flat_contiguous() const { return ndim <= 1 && inner_contiguous(); }
};

inline PointwiseIter make_pointwise_iter(const Tensor& out, std::initializer_list<const Tensor*> ins, const char* op) {
  PointwiseIter it;
  const int64_t nd = out.dim();
  KILN_CHECK(nd <= kMaxDims, op, ": tensors with more than ", kMaxDims, " dimensions are not supported");
  KILN_CHECK(static_cast<int>(ins.size()) + 1 <= kMaxOperands, op, ": too many operands");
  it.noperands = static_cast<int>(ins.size()) + 1;
  it.numel = out.numel();
  int64_t st[kMaxOperands][kMaxDims];
  const Tensor* ops[kMaxOperands];
  ops[0] = &out;
  int k = 1;
  for (const Tensor* t : ins) ops[k++] = t;
  for (k = 0; k < it.noperands; ++k) {
    const Tensor& t = *ops[k];
    KILN_CHECK(t.dim() <= nd, op, ": input of sizes ", t.sizes(), " cannot broadcast to ", out.sizes());
    it.data[k] = static_cast<char*>(t.data_ptr());
    it.elem_size[k] = static_cast<int64_t>(t.element_size());
    const int64_t lead = nd - t.dim();
    for (int64_t d = 0; d < nd; ++d) {
      if (d < lead) {
        st[k][d] = 0;
        continue;
      }
      int64_t s = t.sizes()[d - lead];
      KILN_CHECK(s == out.sizes()[d] || s == 1, op, ": input of sizes ", t.sizes(), " cannot broadcast to ",
                 out.sizes());
      st[k][d] = (s == 1 ? 0 : t.strides()[d - lead]) * it.elem_size[k];
    }
  }
  // Drop size-1 dims, then merge dim d into the previous kept one when contiguous for all.
  int m = 0;
  for (int64_t d = 0; d < nd; ++d) {
    int64_t size = out.sizes()[d];
    if (size == 1) continue;
    if (m > 0) {
      bool mergeable = true;
      for (k = 0; k < it.noperands; ++k)
        if (it.strides[k][m - 1] != st[k][d] * size) {
          mergeable = false;
          break;
        }
      if (mergeable) {
        it.sizes[m - 1] *= size;
        for (k = 0; k < it.noperands; ++k) it.strides[k][m - 1] = st[k][d];
        continue;
      }
    }
    it.sizes[m] = size;
    for (k = 0; k < it.noperands; ++k) it.strides[k][m] = st[k][d];
    ++m;
  }
  it.ndim = m;
  return it;
}

}  // namespace kiln::kernels
