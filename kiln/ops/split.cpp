// repeat, and the views that tile a tensor along one dim (split, chunk, unbind) with the
// one backward node they share; unflatten. Composed of views and reshapes, on every device.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <string>

#include "kiln/core/autograd.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"

namespace kiln {

using autograd::TensorList;

// ---------------------------------------------------------------- repeat, chunk, split

Tensor Tensor::repeat(const IntList& repeats) const {
  KILN_CHECK(static_cast<int64_t>(repeats.size()) >= dim(), "repeat: the number of repeats (", repeats.size(),
             ") can not be smaller than the number of dimensions (", dim(), ")");
  for (int64_t r : repeats) KILN_CHECK(r >= 0, "repeat: repeats must be non-negative, got ", repeats);
  const size_t n = repeats.size();
  IntList padded(n - static_cast<size_t>(dim()), 1);
  for (int64_t s : sizes()) padded.push_back(s);
  // [s0, s1, ...] -> [1, s0, 1, s1, ...] -> expand [r0, s0, r1, s1, ...] -> [r0 s0, r1 s1, ...]
  IntList inter, expanded, out;
  for (size_t i = 0; i < n; ++i) {
    inter.push_back(1);
    inter.push_back(padded[i]);
    expanded.push_back(repeats[i]);
    expanded.push_back(padded[i]);
    out.push_back(repeats[i] * padded[i]);
  }
  return reshape(padded).reshape(inter).expand(expanded).reshape(out);
}

namespace {

// split, chunk and unbind: views that tile `base` along dim `d` share one backward node. It writes
// each part's gradient into its place in one base-sized gradient laid out like the base (so when
// the base is itself a permuted view, e.g. the q, k, v of a fused projection, the permute's
// backward is free), where one node per view would zero-fill a base-sized tensor per part and
// sum them. `starts` are the parts' offsets along d; `squeezed`: unbind's parts lack dim d.
// Under create_graph the backward is cat / stack, which are differentiable.
std::vector<Tensor> tile_views(const Tensor& base, int64_t d, const IntList& starts, const IntList& lengths,
                               bool squeezed) {
  std::vector<Tensor> parts;
  {
    NoGradGuard ng;
    for (size_t i = 0; i < starts.size(); ++i)
      parts.push_back(squeezed ? base.select(d, starts[i]) : base.narrow(d, starts[i], lengths[i]));
  }
  if (!autograd::any_requires_grad({&base})) return parts;
  const IntList sizes = base.sizes(), strides = base.strides();
  std::vector<Tensor*> outputs;
  for (Tensor& p : parts) outputs.push_back(&p);
  autograd::record(std::make_shared<autograd::FunctionNode>(
                       squeezed ? "UnbindBackward" : "SplitBackward",
                       autograd::fused_or_composite(
                           [=](const TensorList& g) {
                             // the parts' gradients may already tile one buffer laid out as the base (attention's
                             // q, k, v gradients do: empty_like_siblings in kiln/core/shape.h)
                             Tensor tiled = view_of_tiled_parts(g, sizes, strides, d, starts, squeezed);
                             if (tiled.defined()) return TensorList{tiled};
                             Tensor grad = empty_preserving_layout(sizes, strides, g[0].options());
                             for (size_t i = 0; i < g.size(); ++i) {
                               Tensor place =
                                   squeezed ? grad.select(d, starts[i]) : grad.narrow(d, starts[i], lengths[i]);
                               place.copy_(g[i]);
                             }
                             return TensorList{grad};
                           },
                           [=](const TensorList& g) { return TensorList{squeezed ? stack(g, d) : cat(g, d)}; })),
                   {&base}, outputs);
  return parts;
}

}  // namespace

std::vector<Tensor> Tensor::split(int64_t split_size, int64_t dim_in) const {
  KILN_CHECK(this->dim() > 0, "split: expected a tensor with at least one dimension");
  const int64_t d = wrap_dim(dim_in, this->dim(), "split");
  const int64_t size = this->size(d);
  KILN_CHECK(split_size > 0 || (split_size == 0 && size == 0), "split: split_size must be positive, got ", split_size);
  if (size == 0) return {*this};
  IntList lengths;
  for (int64_t start = 0; start < size; start += split_size) lengths.push_back(std::min(split_size, size - start));
  return split(lengths, d);
}

std::vector<Tensor> Tensor::split(const IntList& split_sizes, int64_t dim_in) const {
  KILN_CHECK(this->dim() > 0, "split: expected a tensor with at least one dimension");
  const int64_t d = wrap_dim(dim_in, this->dim(), "split");
  int64_t total = 0;
  for (int64_t s : split_sizes) {
    KILN_CHECK(s >= 0, "split: split sizes must be non-negative, got ", split_sizes);
    total += s;
  }
  KILN_CHECK(total == size(d), "split: split sizes ", split_sizes, " sum to ", total, " but dimension ", d,
             " has size ", size(d), " (sizes ", sizes(), ")");
  IntList starts;
  int64_t start = 0;
  for (int64_t s : split_sizes) {
    starts.push_back(start);
    start += s;
  }
  return tile_views(*this, d, starts, split_sizes, false);
}

std::vector<Tensor> Tensor::unbind(int64_t dim_in) const {
  KILN_CHECK(this->dim() > 0, "unbind: expected a tensor with at least one dimension");
  const int64_t d = wrap_dim(dim_in, this->dim(), "unbind");
  IntList starts(static_cast<size_t>(size(d)));
  std::iota(starts.begin(), starts.end(), 0);
  return tile_views(*this, d, starts, IntList(starts.size(), 1), true);
}

std::vector<Tensor> Tensor::chunk(int64_t chunks, int64_t dim_in) const {
  KILN_CHECK(chunks > 0, "chunk: expected a positive number of chunks, got ", chunks);
  KILN_CHECK(this->dim() > 0, "chunk: expected a tensor with at least one dimension");
  const int64_t d = wrap_dim(dim_in, this->dim(), "chunk");
  const int64_t size = this->size(d);
  const int64_t each = (size + chunks - 1) / chunks;
  if (each == 0) {  // size 0: `chunks` empty pieces, as PyTorch
    return split(IntList(static_cast<size_t>(chunks), 0), d);
  }
  return split(each, d);
}

std::vector<Tensor> chunk(const Tensor& a, int64_t chunks, int64_t dim) { return a.chunk(chunks, dim); }
std::vector<Tensor> split(const Tensor& a, int64_t split_size, int64_t dim) { return a.split(split_size, dim); }
std::vector<Tensor> split(const Tensor& a, const IntList& split_sizes, int64_t dim) {
  return a.split(split_sizes, dim);
}
std::vector<Tensor> unbind(const Tensor& a, int64_t dim) { return a.unbind(dim); }

// ---------------------------------------------------------------- unflatten

Tensor Tensor::unflatten(int64_t dim_in, const IntList& sizes_in) const {
  KILN_CHECK(defined(), "unflatten: input is undefined");
  KILN_CHECK(dim() > 0, "unflatten: cannot unflatten a 0-dim tensor");
  const int64_t d = wrap_dim(dim_in, dim(), "unflatten");
  KILN_CHECK(!sizes_in.empty(), "unflatten: sizes must be non-empty");
  IntList sz = sizes_in;
  int64_t infer = -1, known = 1;
  for (size_t i = 0; i < sz.size(); ++i) {
    if (sz[i] == -1) {
      KILN_CHECK(infer < 0, "unflatten: only one dimension can be inferred (-1), got sizes ", sizes_in);
      infer = static_cast<int64_t>(i);
    } else {
      KILN_CHECK(sz[i] >= 0, "unflatten: invalid size ", sz[i], " in sizes ", sizes_in);
      known *= sz[i];
    }
  }
  const int64_t n = size(d);
  if (infer >= 0) {
    KILN_CHECK(known != 0 && n % known == 0, "unflatten: sizes ", sizes_in,
               " cannot be inferred to multiply up to the size of dim ", d, " (", n, ") of the input of sizes ",
               sizes());
    sz[static_cast<size_t>(infer)] = n / known;
  } else {
    KILN_CHECK(known == n, "unflatten: sizes ", sizes_in, " don't multiply up to the size of dim ", d, " (", n,
               ") of the input of sizes ", sizes());
  }
  IntList out(sizes().begin(), sizes().begin() + d);
  out.insert(out.end(), sz.begin(), sz.end());
  out.insert(out.end(), sizes().begin() + d + 1, sizes().end());
  return reshape(out);  // splitting one dim is always expressible as a view
}

}  // namespace kiln
