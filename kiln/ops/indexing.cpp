// Differentiable indexing and joining ops: cat, stack, index_select, gather, embedding, one_hot.
//
// Backward formulas, each itself differentiable (so create_graph works):
//   cat          -> the slices of the gradient along dim (narrow, cast back to each input's dtype)
//   index_select -> index_add of the gradient into zeros    (whose backward is index_select)
//   gather       -> scatter_add of the gradient into zeros  (whose backward is gather)
//   embedding    -> index_select on the flattened indices, so rows used twice get both gradients
#include <algorithm>

#include "kiln/core/autograd.h"
#include "kiln/core/shape.h"
#include "kiln/kernels/indexing.h"
#include "kiln/kernels/copy_fill.h"
#include "kiln/kernels/matmul.h"
#include "kiln/kernels/pointwise.h"
#include "kiln/kernels/reduce.h"
#include "kiln/kernels/softmax.h"

namespace kiln {

using autograd::SavedTensor;
using autograd::TensorList;

namespace {

void check_defined(const Tensor& t, const char* op, const char* what) {
  KILN_CHECK(t.defined(), op, ": ", what, " is undefined");
}

void check_index(const Tensor& index, const char* op) {
  check_defined(index, op, "index");
  KILN_CHECK(index.dtype() == DType::I64 || index.dtype() == DType::I32, op,
             ": index must be an int64 or int32 tensor, got ", index.dtype(), " (sizes ", index.sizes(), ")");
}

void check_same_device(const Tensor& a, const Tensor& index, const char* op) {
  KILN_CHECK(a.device() == index.device(), op, ": expected the input and the index on the same device, got ",
             a.device(), " (sizes ", a.sizes(), ") and ", index.device(), " (sizes ", index.sizes(), ")");
}

// The index ops come in adjoint pairs, each the other's backward: index_select <-> index_add
// into zeros, gather <-> scatter_add into zeros. A read takes `out` out of `a` at `index` along
// `dim`; its gradient is the write of g into zeros of a's sizes, and the write's gradient is the
// read of g.
using IndexWrite = Tensor (*)(const Tensor& grad, const IntList& sizes, int64_t dim, const SavedTensor& index);
using IndexRead = Tensor (*)(const Tensor& a, int64_t dim, const Tensor& index);

void record_index_read(const char* node, const Tensor& a, Tensor& out, const Tensor& index, int64_t dim,
                       IndexWrite adjoint) {
  if (!autograd::any_requires_grad({&a})) return;
  SavedTensor si(index, node);
  IntList in_sizes = a.sizes();
  autograd::record_function(node, {&a}, {&out},
                            [=](const TensorList& g) { return TensorList{adjoint(g[0], in_sizes, dim, si)}; });
}

void record_index_write(const char* node, const Tensor& grad, Tensor& out, const SavedTensor& index, int64_t dim,
                        IndexRead adjoint) {
  if (!autograd::any_requires_grad({&grad})) return;
  autograd::record_function(node, {&grad}, {&out},
                            [=](const TensorList& g) { return TensorList{adjoint(g[0], dim, index.get())}; });
}

// grad (shape of the selection) added into zeros of `sizes` at `index` along `dim`.
Tensor index_add_into_zeros(const Tensor& grad, const IntList& sizes, int64_t dim, const SavedTensor& index) {
  Tensor out = zeros(sizes, grad.options());
  kernels::index_add(out, dim, index.get(), grad, "index_select_backward");
  record_index_write("IndexAddBackward", grad, out, index, dim, index_select);
  return out;
}

// grad (shape of the index) scattered-added into zeros of `sizes` along `dim`.
Tensor scatter_add_into_zeros(const Tensor& grad, const IntList& sizes, int64_t dim, const SavedTensor& index) {
  Tensor out = zeros(sizes, grad.options());
  kernels::scatter_add(out, dim, index.get(), grad, "gather_backward");
  record_index_write("ScatterAddBackward", grad, out, index, dim, gather);
  return out;
}

}  // namespace

// ---------------------------------------------------------------- cat / stack

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  KILN_CHECK(!tensors.empty(), "cat: expected a non-empty list of tensors");
  for (size_t i = 0; i < tensors.size(); ++i) KILN_CHECK(tensors[i].defined(), "cat: tensor ", i, " is undefined");
  const Device dev = tensors[0].device();
  DType dt = tensors[0].dtype();
  for (size_t i = 1; i < tensors.size(); ++i) {
    KILN_CHECK(tensors[i].device() == dev, "cat: expected all tensors on one device, got ", dev,
               " for tensor 0 (sizes ", tensors[0].sizes(), ") and ", tensors[i].device(), " for tensor ", i,
               " (sizes ", tensors[i].sizes(), ")");
    dt = promote_types(dt, tensors[i].dtype());
  }
  // PyTorch's legacy rule: 1-D tensors of size 0 are skipped whatever the other shapes.
  auto skipped = [](const Tensor& t) { return t.dim() == 1 && t.size(0) == 0; };
  int64_t ref = -1;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!skipped(tensors[i])) {
      ref = static_cast<int64_t>(i);
      break;
    }
  }
  const int64_t n = static_cast<int64_t>(tensors.size());
  if (ref < 0) {  // every input is an empty 1-D tensor
    Tensor out = empty({0}, TensorOptions().dtype(dt).device(dev));
    if (autograd::any_requires_grad(tensors)) {
      std::vector<const Tensor*> ins;
      for (const Tensor& t : tensors) ins.push_back(&t);
      std::vector<DType> dts;
      for (const Tensor& t : tensors) dts.push_back(t.dtype());
      autograd::record_function("CatBackward", ins, {&out}, [dts, dev](const TensorList&) {
        TensorList r;
        for (DType d : dts) r.push_back(zeros({0}, TensorOptions().dtype(d).device(dev)));
        return r;
      });
    }
    return out;
  }
  const Tensor& r = tensors[ref];
  KILN_CHECK(r.dim() > 0, "cat: zero-dimensional tensor (tensor ", ref,
             ") cannot be concatenated; unsqueeze it or use stack");
  dim = wrap_dim(dim, r.dim(), "cat");
  IntList out_sizes = r.sizes();
  out_sizes[dim] = 0;
  for (int64_t i = 0; i < n; ++i) {
    const Tensor& t = tensors[i];
    if (skipped(t)) continue;
    KILN_CHECK(t.dim() == r.dim(), "cat: tensors must have the same number of dimensions, got sizes ", r.sizes(),
               " (tensor ", ref, ") and ", t.sizes(), " (tensor ", i, ")");
    for (int64_t d = 0; d < r.dim(); ++d) {
      KILN_CHECK(d == dim || t.size(d) == r.size(d), "cat: sizes of tensors must match except in dimension ", dim,
                 "; got sizes ", r.sizes(), " (tensor ", ref, ") and ", t.sizes(), " (tensor ", i,
                 "), which differ in dimension ", d);
    }
    out_sizes[dim] += t.size(dim);
  }

  Tensor out = empty(out_sizes, TensorOptions().dtype(dt).device(dev));
  std::vector<int64_t> offsets(n, 0), lengths(n, 0);
  {
    NoGradGuard ng;
    int64_t off = 0;
    for (int64_t i = 0; i < n; ++i) {
      const Tensor& t = tensors[i];
      if (skipped(t)) continue;
      offsets[i] = off;
      lengths[i] = t.size(dim);
      if (lengths[i] > 0) kernels::copy(out.narrow(dim, off, lengths[i]), t.detach());
      off += lengths[i];
    }
  }
  if (autograd::any_requires_grad(tensors)) {
    std::vector<const Tensor*> ins;
    std::vector<bool> needs, skip;
    std::vector<DType> dts;
    for (const Tensor& t : tensors) {
      ins.push_back(&t);
      needs.push_back(t.requires_grad());
      skip.push_back(skipped(t));
      dts.push_back(t.dtype());
    }
    autograd::record_function("CatBackward", ins, {&out}, [=](const TensorList& g) {
      TensorList res(n);
      for (int64_t i = 0; i < n; ++i) {
        if (!needs[i]) continue;
        if (skip[i]) {
          res[i] = zeros({0}, TensorOptions().dtype(dts[i]).device(g[0].device()));
          continue;
        }
        Tensor gi = g[0].narrow(dim, offsets[i], lengths[i]);
        res[i] = gi.dtype() == dts[i] ? gi : gi.to(dts[i]);
      }
      return res;
    });
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  KILN_CHECK(!tensors.empty(), "stack: expected a non-empty list of tensors");
  for (size_t i = 0; i < tensors.size(); ++i) {
    KILN_CHECK(tensors[i].defined(), "stack: tensor ", i, " is undefined");
    KILN_CHECK(tensors[i].sizes() == tensors[0].sizes(), "stack: expects each tensor to be equal size, but got ",
               tensors[0].sizes(), " at entry 0 and ", tensors[i].sizes(), " at entry ", i);
  }
  dim = wrap_dim(dim, tensors[0].dim() + 1, "stack");
  std::vector<Tensor> parts;
  parts.reserve(tensors.size());
  for (const Tensor& t : tensors) parts.push_back(t.unsqueeze(dim));
  return cat(parts, dim);
}

// ---------------------------------------------------------------- index_select

namespace {
// index_select whose errors (on a GPU: found by the kernel, raised at the next sync) name `op`.
Tensor index_select_named(const Tensor& a, int64_t dim, const Tensor& index, const char* op) {
  check_defined(a, "index_select", "input");
  check_index(index, "index_select");
  check_same_device(a, index, "index_select");
  KILN_CHECK(index.dim() <= 1, "index_select: index must be 0-D or 1-D, got sizes ", index.sizes());
  if (a.dim() == 0) {  // a scalar behaves as a 1-element vector
    wrap_dim(dim, 0, "index_select");
    KILN_CHECK(index.numel() == 1, "index_select: indexing a 0-dim tensor needs exactly one index, got ",
               index.numel());
    return index_select_named(a.unsqueeze(0), 0, index, op).squeeze(0);
  }
  dim = wrap_dim(dim, a.dim(), "index_select");
  Tensor idx = index.dim() == 1 ? index : index.unsqueeze(0);
  IntList sizes = a.sizes();
  sizes[dim] = idx.numel();
  Tensor out = empty(sizes, a.options());
  kernels::index_select(out, a, dim, idx, op);
  record_index_read("IndexSelectBackward", a, out, idx, dim, index_add_into_zeros);
  return out;
}
}  // namespace

Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index) {
  return index_select_named(a, dim, index, "index_select");
}

// ---------------------------------------------------------------- gather

Tensor gather(const Tensor& a, int64_t dim, const Tensor& index) {
  check_defined(a, "gather", "input");
  check_index(index, "gather");
  check_same_device(a, index, "gather");
  dim = wrap_dim(dim, a.dim(), "gather");
  KILN_CHECK(index.dim() == a.dim(), "gather: index must have as many dimensions as the input, got index sizes ",
             index.sizes(), " and input sizes ", a.sizes());
  for (int64_t d = 0; d < a.dim(); ++d) {
    KILN_CHECK(d == dim || index.size(d) <= a.size(d), "gather: index sizes ", index.sizes(),
               " exceed the input sizes ", a.sizes(), " in dimension ", d, " (only dimension ", dim, " may be larger)");
  }
  Tensor out = empty(index.sizes(), a.options());
  kernels::gather(out, a, dim, index, "gather");
  record_index_read("GatherBackward", a, out, index, dim, scatter_add_into_zeros);
  return out;
}

// ---------------------------------------------------------------- embedding / one_hot

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  check_defined(weight, "embedding", "weight");
  check_index(indices, "embedding");
  check_same_device(weight, indices, "embedding");
  KILN_CHECK(weight.dim() == 2, "embedding: weight must be 2-D [num_embeddings, embedding_dim], got sizes ",
             weight.sizes());
  const int64_t V = weight.size(0), D = weight.size(1);
  // On the CPU the range is checked here; on a GPU the lookup kernel checks each index and the
  // error is raised at the next synchronisation (docs/kernels.md, "Index bounds on the GPU").
  if (indices.numel() > 0 && indices.device().is_cpu()) {
    auto [lo, hi] = kernels::index_min_max(indices, "embedding");
    KILN_CHECK(lo >= 0 && hi < V, "embedding: index ", lo < 0 ? lo : hi, " is out of range for a weight with ", V,
               " embeddings (sizes ", weight.sizes(), ")");
  }
  Tensor flat = indices.dim() == 0 ? indices.unsqueeze(0) : indices.reshape({indices.numel()});
  IntList out_sizes = indices.sizes();
  out_sizes.push_back(D);
  return index_select_named(weight, 0, flat, "embedding").reshape(out_sizes);
}

Tensor one_hot(const Tensor& indices, int64_t num_classes) {
  check_defined(indices, "one_hot", "indices");
  KILN_CHECK(indices.dtype() == DType::I64 || indices.dtype() == DType::I32,
             "one_hot: indices must be an int64 or int32 tensor, got ", indices.dtype(), " (sizes ", indices.sizes(),
             ")");
  KILN_CHECK(num_classes >= -1, "one_hot: num_classes must be -1 (inferred) or non-negative, got ", num_classes);
  if (indices.numel() == 0) {
    KILN_CHECK(num_classes != -1,
               "one_hot: cannot infer the number of classes from an empty tensor "
               "(sizes ",
               indices.sizes(), "); pass num_classes");
  } else {
    auto [lo, hi] = kernels::index_min_max(indices, "one_hot");
    KILN_CHECK(lo >= 0, "one_hot: class values must be non-negative, got ", lo);
    if (num_classes == -1) num_classes = hi + 1;
    KILN_CHECK(hi < num_classes, "one_hot: class value ", hi, " is out of range for num_classes ", num_classes);
  }
  IntList out_sizes = indices.sizes();
  out_sizes.push_back(num_classes);
  Tensor out = zeros(out_sizes, TensorOptions().dtype(DType::I64).device(indices.device()));
  if (indices.numel() == 0) return out;
  NoGradGuard ng;
  Tensor idx = indices.unsqueeze(-1);
  Tensor src = ones({}, TensorOptions().dtype(DType::I64).device(indices.device())).expand(idx.sizes());
  kernels::scatter_add(out, -1, idx, src, "one_hot");
  return out;
}

// ---------------------------------------------------------------- methods

Tensor Tensor::index_select(int64_t dim, const Tensor& index) const { return kiln::index_select(*this, dim, index); }

Tensor Tensor::gather(int64_t dim, const Tensor& index) const { return kiln::gather(*this, dim, index); }

}  // namespace kiln
