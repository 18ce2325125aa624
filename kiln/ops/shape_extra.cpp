// libtorch's shape, creation, logical, norm and einsum helpers, composed of the existing
// differentiable ops (views, reshape, expand, sum, matmul), so they need no kernels of their own
// and run on every device.
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

using autograd::SavedTensor;
using autograd::TensorList;

// ---------------------------------------------------------------- creation

Tensor linspace(double start, double end, int64_t steps, const TensorOptions& opts) {
  KILN_CHECK(steps >= 0, "linspace: number of steps must be non-negative, got ", steps);
  Tensor host = empty({steps}, TensorOptions().dtype(DType::F64));
  auto* p = host.data_ptr<double>();
  if (steps == 1) p[0] = start;
  if (steps > 1) {
    // from both ends, as PyTorch, so that the last value is exactly `end`
    const double step = (end - start) / static_cast<double>(steps - 1);
    const int64_t half = steps / 2;
    for (int64_t i = 0; i < steps; ++i)
      p[i] = i < half ? start + step * static_cast<double>(i)
                      : end - step * static_cast<double>(steps - 1 - i);
  }
  Tensor t = host.to(opts.device(), opts.dtype());
  if (opts.requires_grad()) t.requires_grad_(true);
  return t;
}

Tensor full_like(const Tensor& t, double value, const TensorOptions& opts) {
  TensorOptions o = t.options();
  if (opts.has_dtype()) o.dtype(opts.dtype());
  o.requires_grad(opts.requires_grad());
  return full(t.sizes(), value, o);
}

// ---------------------------------------------------------------- repeat, chunk, split

Tensor Tensor::repeat(const IntList& repeats) const {
  KILN_CHECK(static_cast<int64_t>(repeats.size()) >= dim(), "repeat: the number of repeats (",
             repeats.size(), ") can not be smaller than the number of dimensions (", dim(), ")");
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
std::vector<Tensor> tile_views(const Tensor& base, int64_t d, const IntList& starts,
                               const IntList& lengths, bool squeezed) {
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
  autograd::record(
      std::make_shared<autograd::FunctionNode>(
          squeezed ? "UnbindBackward" : "SplitBackward",
          [=](const TensorList& g) {
            if (GradMode::is_enabled()) return TensorList{squeezed ? stack(g, d) : cat(g, d)};
            // the parts' gradients may already tile one buffer laid out as the base (attention's
            // q, k, v gradients do: empty_like_siblings in kiln/core/shape.h)
            Tensor tiled = view_of_tiled_parts(g, sizes, strides, d, starts, squeezed);
            if (tiled.defined()) return TensorList{tiled};
            Tensor grad = empty_preserving_layout(sizes, strides, g[0].options());
            for (size_t i = 0; i < g.size(); ++i) {
              Tensor place = squeezed ? grad.select(d, starts[i]) : grad.narrow(d, starts[i], lengths[i]);
              place.copy_(g[i]);
            }
            return TensorList{grad};
          }),
      {&base}, outputs);
  return parts;
}

}  // namespace

std::vector<Tensor> Tensor::split(int64_t split_size, int64_t dim_in) const {
  KILN_CHECK(this->dim() > 0, "split: expected a tensor with at least one dimension");
  const int64_t d = wrap_dim(dim_in, this->dim(), "split");
  const int64_t size = this->size(d);
  KILN_CHECK(split_size > 0 || (split_size == 0 && size == 0),
             "split: split_size must be positive, got ", split_size);
  if (size == 0) return {*this};
  IntList lengths;
  for (int64_t start = 0; start < size; start += split_size)
    lengths.push_back(std::min(split_size, size - start));
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
  KILN_CHECK(total == size(d), "split: split sizes ", split_sizes, " sum to ", total,
             " but dimension ", d, " has size ", size(d), " (sizes ", sizes(), ")");
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
               " cannot be inferred to multiply up to the size of dim ", d, " (", n, ") of the input of sizes ", sizes());
    sz[static_cast<size_t>(infer)] = n / known;
  } else {
    KILN_CHECK(known == n, "unflatten: sizes ", sizes_in, " don't multiply up to the size of dim ", d, " (",
               n, ") of the input of sizes ", sizes());
  }
  IntList out(sizes().begin(), sizes().begin() + d);
  out.insert(out.end(), sz.begin(), sz.end());
  out.insert(out.end(), sizes().begin() + d + 1, sizes().end());
  return reshape(out);  // splitting one dim is always expressible as a view
}

// ---------------------------------------------------------------- all, any

namespace {
// 1 where a is non-zero (NaN counts as non-zero), as f32.
Tensor nonzero_f32(const Tensor& a) {
  if (a.dtype() == DType::Bool) return a.to(DType::F32);
  return a.ne(0.0).to(DType::F32);
}
Tensor all_any(const Tensor& a, const IntList& dims, bool keepdim, bool is_all, const char* op) {
  KILN_CHECK(a.defined(), op, ": input is undefined");
  NoGradGuard ng;
  Tensor x = a.detach();
  if (x.numel() == 0) {  // all() of nothing is true, any() false
    IntList out_sizes;
    IntList rd = reduction_dims(dims, x.dim(), op);
    for (int64_t d = 0; d < x.dim(); ++d) {
      bool reduced = std::find(rd.begin(), rd.end(), d) != rd.end();
      if (!reduced) out_sizes.push_back(x.size(d));
      else if (keepdim) out_sizes.push_back(1);
    }
    return full(out_sizes, is_all ? 1.0 : 0.0, TensorOptions().dtype(DType::Bool).device(x.device()));
  }
  Tensor nz = nonzero_f32(x);
  Tensor r = is_all ? nz.amin(dims, keepdim) : nz.amax(dims, keepdim);
  return r.gt(0.5);
}
}  // namespace

Tensor Tensor::all() const { return all_any(*this, {}, false, true, "all"); }
Tensor Tensor::all(int64_t dim, bool keepdim) const { return all_any(*this, {dim}, keepdim, true, "all"); }
Tensor Tensor::any() const { return all_any(*this, {}, false, false, "any"); }
Tensor Tensor::any(int64_t dim, bool keepdim) const { return all_any(*this, {dim}, keepdim, false, "any"); }
Tensor all(const Tensor& a) { return a.all(); }
Tensor any(const Tensor& a) { return a.any(); }

// ---------------------------------------------------------------- norm

namespace {
// sign(x) as x's dtype: -1, 0 or 1 (0 at NaN)
Tensor sign_of(const Tensor& x) { return x.gt(0.0).to(x.dtype()) - x.lt(0.0).to(x.dtype()); }
}  // namespace

Tensor norm(const Tensor& x, double p, const IntList& dims_in, bool keepdim) {
  KILN_CHECK(x.defined(), "norm: input is undefined");
  KILN_CHECK(is_floating(x.dtype()), "norm: expected a floating-point tensor, got ", x.dtype());
  KILN_CHECK(!std::isnan(p), "norm: p is NaN");
  IntList dims = reduction_dims(dims_in, x.dim(), "norm");
  if (std::isinf(p)) {  // max / min |x|: amax's gradient splits evenly among ties
    return p > 0 ? kiln::abs(x).amax(dims, keepdim) : kiln::abs(x).amin(dims, keepdim);
  }
  if (p == 0) {  // number of non-zeros: no gradient
    NoGradGuard ng;
    return sum(x.detach().ne(0.0).to(x.dtype()), dims, keepdim);
  }
  if (p == 1) return sum(kiln::abs(x), dims, keepdim);
  // p-norm, with a backward that gives 0 where the norm is 0 (sqrt / pow would give NaN there)
  Tensor out, nk;
  {
    NoGradGuard ng;
    Tensor xd = x.detach();
    Tensor s = p == 2 ? sum(xd * xd, dims, true) : sum(kiln::pow(kiln::abs(xd), p), dims, true);
    nk = p == 2 ? s.sqrt() : kiln::pow(s, 1.0 / p);
    out = keepdim ? nk : sum(nk, dims, false);  // drops the size-1 dims
  }
  if (autograd::any_requires_grad({&x})) {
    SavedTensor sx(x, "norm"), sn(nk, "norm");
    IntList keep_sizes = nk.sizes();
    autograd::record_function("NormBackward", {&x}, {&out}, [=](const TensorList& g) {
      Tensor xv = sx.get();
      // create_graph: the norm must be a function of x for the second derivative
      Tensor n = GradMode::is_enabled() && xv.requires_grad() ? kiln::norm(xv, p, dims, true) : sn.get();
      Tensor gk = g[0].reshape(keep_sizes);
      Tensor scale = where(n == 0.0, 0.0, gk / (p == 2 ? n : kiln::pow(n, p - 1)));
      Tensor dx = p == 2 ? xv * scale
                         : where(xv == 0.0, 0.0, sign_of(xv) * kiln::pow(kiln::abs(xv), p - 1)) * scale;
      return TensorList{dx};
    });
  }
  return out;
}

Tensor Tensor::norm(double p) const { return kiln::norm(*this, p); }
Tensor Tensor::norm(double p, const IntList& dims, bool keepdim) const {
  return kiln::norm(*this, p, dims, keepdim);
}

// ---------------------------------------------------------------- einsum

namespace {

struct Operand {
  Tensor t;
  std::string labels;  // one letter per dim, no repeats
};

// Sums out the labels of `a` not in `keep`.
Operand sum_out(Operand a, const std::string& keep) {
  IntList dims;
  std::string rest;
  for (size_t i = 0; i < a.labels.size(); ++i) {
    if (keep.find(a.labels[i]) == std::string::npos) dims.push_back(static_cast<int64_t>(i));
    else rest.push_back(a.labels[i]);
  }
  if (dims.empty()) return a;
  return {sum(a.t, dims, false), rest};
}

Operand permute_to(const Operand& a, const std::string& order) {
  IntList perm;
  for (char c : order) perm.push_back(static_cast<int64_t>(a.labels.find(c)));
  bool identity = true;
  for (size_t i = 0; i < perm.size(); ++i) identity = identity && perm[i] == static_cast<int64_t>(i);
  return {identity ? a.t : a.t.permute(perm), order};
}

// a and b (labels distinct within each) -> the labels in `keep`, in the order
// [shared kept (batch), a-only, b-only].
Operand contract(Operand a, Operand b, const std::string& keep_all) {
  // labels only one side uses and nobody needs are summed out first
  std::string keep_a = keep_all + b.labels, keep_b = keep_all + a.labels;
  a = sum_out(a, keep_a);
  b = sum_out(b, keep_b);
  std::string batch, contracted, a_only, b_only;
  std::map<char, int64_t> size;
  for (size_t i = 0; i < a.labels.size(); ++i) size[a.labels[i]] = a.t.size(static_cast<int64_t>(i));
  for (size_t i = 0; i < b.labels.size(); ++i) size[b.labels[i]] = b.t.size(static_cast<int64_t>(i));
  for (char c : a.labels) {
    if (b.labels.find(c) == std::string::npos) a_only.push_back(c);
    else if (keep_all.find(c) != std::string::npos) batch.push_back(c);
    else contracted.push_back(c);
  }
  for (char c : b.labels)
    if (a.labels.find(c) == std::string::npos) b_only.push_back(c);
  auto prod = [&](const std::string& ls) {
    int64_t p = 1;
    for (char c : ls) p *= size[c];
    return p;
  };
  const int64_t B = prod(batch), M = prod(a_only), K = prod(contracted), N = prod(b_only);
  Tensor am = permute_to(a, batch + a_only + contracted).t.reshape({B, M, K});
  Tensor bm = permute_to(b, batch + contracted + b_only).t.reshape({B, K, N});
  IntList out_sizes;
  for (char c : batch + a_only + b_only) out_sizes.push_back(size[c]);
  return {matmul(am, bm).reshape(out_sizes), batch + a_only + b_only};
}

}  // namespace

Tensor einsum(const std::string& equation, const std::vector<Tensor>& tensors) {
  std::string eq;
  for (char c : equation)
    if (c != ' ') eq.push_back(c);
  KILN_CHECK(eq.find("...") == std::string::npos, "einsum: \"...\" (ellipsis) is not supported: ",
             equation);
  const size_t arrow = eq.find("->");
  std::string lhs = eq.substr(0, arrow);
  std::vector<std::string> specs;
  size_t start = 0;
  while (true) {
    size_t comma = lhs.find(',', start);
    specs.push_back(lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  KILN_CHECK(specs.size() == tensors.size(), "einsum: the equation \"", equation, "\" names ",
             specs.size(), " operands but ", tensors.size(), " tensors were given");
  std::map<char, int> count;
  std::map<char, int64_t> size;
  std::vector<Operand> ops;
  for (size_t k = 0; k < specs.size(); ++k) {
    const std::string& s = specs[k];
    const Tensor& t = tensors[k];
    KILN_CHECK(t.defined(), "einsum: operand ", k, " is undefined");
    for (char c : s)
      KILN_CHECK(std::isalpha(static_cast<unsigned char>(c)), "einsum: invalid subscript '", c,
                 "' in \"", equation, "\" (letters, ',' and '->' only)");
    KILN_CHECK(static_cast<int64_t>(s.size()) == t.dim(), "einsum: operand ", k, " has ", t.dim(),
               " dims (sizes ", t.sizes(), ") but its subscripts \"", s, "\" name ", s.size());
    Operand op{t, s};
    std::set<char> distinct(s.begin(), s.end());
    if (distinct.size() != s.size()) {
      // a repeated label: only a square matrix's diagonal ("ii") is supported
      KILN_CHECK(s.size() == 2 && s[0] == s[1] && t.size(0) == t.size(1), "einsum: repeated "
                 "subscripts within an operand are supported only as \"ii\" on a square matrix, got \"",
                 s, "\" with sizes ", t.sizes());
      Tensor idx = arange(static_cast<double>(t.size(0)), TensorOptions().dtype(DType::I64).device(t.device()));
      Tensor eye = (idx.unsqueeze(1) == idx.unsqueeze(0)).to(t.dtype());
      op = {sum(t * eye, {1}, false), std::string(1, s[0])};
    }
    for (size_t i = 0; i < op.labels.size(); ++i) {
      char c = op.labels[i];
      int64_t n = op.t.size(static_cast<int64_t>(i));
      auto it = size.find(c);
      KILN_CHECK(it == size.end() || it->second == n, "einsum: subscript '", c, "' has size ", n,
                 " for operand ", k, " but size ", it == size.end() ? 0 : it->second,
                 " elsewhere (no broadcasting)");
      size[c] = n;
      ++count[c];
    }
    ops.push_back(std::move(op));
  }
  std::string out;
  if (arrow != std::string::npos) {
    out = eq.substr(arrow + 2);
    std::set<char> seen;
    for (char c : out) {
      KILN_CHECK(std::isalpha(static_cast<unsigned char>(c)), "einsum: invalid output subscript '",
                 c, "' in \"", equation, "\"");
      KILN_CHECK(size.count(c), "einsum: output subscript '", c, "' does not appear in the inputs");
      KILN_CHECK(seen.insert(c).second, "einsum: output subscript '", c, "' appears twice");
    }
  } else {  // implicit: the labels used once, in alphabetical order
    for (auto& [c, n] : count)
      if (n == 1) out.push_back(c);
  }
  // Fold left: keep what later operands or the output need.
  Operand acc = ops[0];
  for (size_t k = 1; k < ops.size(); ++k) {
    std::string keep = out;
    for (size_t j = k + 1; j < ops.size(); ++j) keep += ops[j].labels;
    acc = contract(acc, ops[k], keep);
  }
  acc = sum_out(acc, out);
  return permute_to(acc, out).t;
}

}  // namespace kiln
