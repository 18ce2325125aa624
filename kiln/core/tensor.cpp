// Tensor metadata, views, conversions and creation. Math ops live in kiln/ops/.
#include "kiln/core/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "kiln/core/autograd.h"
#include "kiln/cuda/cuda.h"
#include "kiln/core/shape.h"

namespace kiln {

TensorImpl::TensorImpl() = default;
TensorImpl::~TensorImpl() = default;

int64_t TensorImpl::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

namespace {

void check_sizes(const IntList& sizes, const char* op) {
  for (int64_t s : sizes) KILN_CHECK(s >= 0, op, ": negative size in ", sizes);
}

Tensor make_view(const Tensor& base, IntList sizes, IntList strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->sizes = std::move(sizes);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = base.dtype();
  return Tensor(std::move(impl));
}

// Records a view op: `backward` maps the view's gradient to the base's gradient.
template <class F> Tensor record_view(const char* name, const Tensor& base, Tensor view, F&& backward) {
  if (autograd::any_requires_grad({&base})) {
    autograd::record_function(name, {&base}, {&view}, [bw = std::forward<F>(backward)](const autograd::TensorList& g) {
      return autograd::TensorList{bw(g[0])};
    });
  }
  return view;
}

// Gradient of a strided sub-view: zeros of the base shape with `grad` written into the same
// sub-view. Differentiable itself (its backward takes the sub-view again) for create_graph.
template <class MakeView> Tensor scatter_into_zeros(const Tensor& grad, const IntList& base_sizes, MakeView make) {
  Tensor result = zeros(base_sizes, grad.options());
  {
    NoGradGuard ng;
    make(result).copy_(grad);
  }
  if (autograd::any_requires_grad({&grad})) {
    autograd::record_function("SliceBackwardBackward", {&grad}, {&result},
                              [make](const autograd::TensorList& g) { return autograd::TensorList{make(g[0])}; });
  }
  return result;
}

}  // namespace

// ---------------------------------------------------------------- metadata

const IntList& Tensor::sizes() const {
  KILN_CHECK(defined(), "sizes(): tensor is undefined");
  return impl_->sizes;
}
const IntList& Tensor::strides() const {
  KILN_CHECK(defined(), "strides(): tensor is undefined");
  return impl_->strides;
}
int64_t Tensor::size(int64_t d) const { return sizes()[wrap_dim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return strides()[wrap_dim(d, dim(), "stride")]; }
int64_t Tensor::dim() const { return static_cast<int64_t>(sizes().size()); }
int64_t Tensor::numel() const { return defined() ? impl_->numel() : 0; }
int64_t Tensor::storage_offset() const { return impl_->offset; }
DType Tensor::dtype() const {
  KILN_CHECK(defined(), "dtype(): tensor is undefined");
  return impl_->dtype;
}
Device Tensor::device() const {
  KILN_CHECK(defined(), "device(): tensor is undefined");
  return impl_->storage->device();
}
TensorOptions Tensor::options() const { return TensorOptions().dtype(dtype()).device(device()); }
bool Tensor::is_pinned() const { return defined() && impl_->storage->is_pinned(); }
const std::shared_ptr<Storage>& Tensor::storage() const {
  KILN_CHECK(defined(), "storage(): tensor is undefined");
  return impl_->storage;
}

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;
  int64_t expected = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (impl_->sizes[i] == 1) continue;
    if (impl_->strides[i] != expected) return false;
    expected *= impl_->sizes[i];
  }
  return true;
}

void* Tensor::data_ptr() const {
  KILN_CHECK(defined(), "data_ptr(): tensor is undefined");
  auto* base = static_cast<char*>(impl_->storage->data());
  return base ? base + impl_->offset * static_cast<int64_t>(element_size()) : nullptr;
}

template <class T> T* Tensor::data_ptr() const {
  KILN_CHECK(dtype() == dtype_of<T>::value, "data_ptr<", dtype_name(dtype_of<T>::value), ">(): tensor has dtype ",
             dtype_name(dtype()));
  return static_cast<T*>(data_ptr());
}

template <class T> T Tensor::item() const {
  KILN_CHECK(numel() == 1, "item(): expected a tensor with one element, got sizes ", sizes());
  Tensor host = device().is_cpu() ? *this : to(Device::cpu());
  if constexpr (std::is_integral_v<T>) {  // exact for 64-bit integers (no trip through double)
    if (!is_floating(dtype())) {
      return dispatch_all(dtype(), "item", [&](auto tag) {
        using S = typename decltype(tag)::type;
        return static_cast<T>(*static_cast<S*>(host.data_ptr()));
      });
    }
  }
  double v = dispatch_all(dtype(), "item", [&](auto tag) {
    using S = typename decltype(tag)::type;
    return static_cast<double>(static_cast<opmath_t<S>>(*static_cast<S*>(host.data_ptr())));
  });
  if constexpr (std::is_same_v<T, double>) return v;
  else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) return T(static_cast<float>(v));
  else return static_cast<T>(v);
}

#define KILN_INSTANTIATE_ACCESSORS(T)      \
  template T* Tensor::data_ptr<T>() const; \
  template T Tensor::item<T>() const;
KILN_INSTANTIATE_ACCESSORS(float)
KILN_INSTANTIATE_ACCESSORS(double)
KILN_INSTANTIATE_ACCESSORS(Half)
KILN_INSTANTIATE_ACCESSORS(BFloat16)
KILN_INSTANTIATE_ACCESSORS(int64_t)
KILN_INSTANTIATE_ACCESSORS(int32_t)
KILN_INSTANTIATE_ACCESSORS(uint8_t)
KILN_INSTANTIATE_ACCESSORS(bool)
#undef KILN_INSTANTIATE_ACCESSORS

uint64_t Tensor::version() const { return storage()->version(); }

// ---------------------------------------------------------------- creation

Tensor empty(const IntList& sizes, const TensorOptions& opts) {
  check_sizes(sizes, "empty");
  auto impl = std::make_shared<TensorImpl>();
  impl->sizes = sizes;
  impl->strides = contiguous_strides(sizes);
  impl->dtype = opts.dtype();
  size_t nbytes = static_cast<size_t>(impl->numel()) * element_size(opts.dtype());
  Allocator* alloc = opts.pinned_memory() ? pinned_allocator() : allocator_for(opts.device());
  KILN_CHECK(!opts.pinned_memory() || opts.device().is_cpu(),
             "empty: pinned_memory applies to CPU tensors, got device ", opts.device());
  if (opts.device().is_cuda()) cuda::check_device(opts.device(), "empty");
  impl->storage = std::make_shared<Storage>(nbytes, opts.device(), alloc);
  Tensor t(std::move(impl));
  if (opts.requires_grad()) t.requires_grad_(true);
  return t;
}

Tensor empty_preserving_layout(const Tensor& like, const TensorOptions& options) {
  if (like.dim() < 2 || like.is_contiguous()) return empty(like.sizes(), options);
  return empty_preserving_layout(like.sizes(), like.strides(), options);
}

Tensor empty_preserving_layout(const IntList& sizes, const IntList& strides, const TensorOptions& options) {
  const int64_t nd = static_cast<int64_t>(sizes.size());
  if (nd < 2) return empty(sizes, options);
  // Order dims by decreasing stride; dense when each stride is the product of the sizes inside it.
  IntList order(nd);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return strides[a] > strides[b]; });
  int64_t expected = 1;
  for (int64_t i = nd - 1; i >= 0; --i) {
    const int64_t d = order[i];
    if (sizes[d] == 1) continue;
    if (strides[d] != expected) return empty(sizes, options);
    expected *= sizes[d];
  }
  IntList permuted(nd), inverse(nd);
  for (int64_t i = 0; i < nd; ++i) {
    permuted[i] = sizes[order[i]];
    inverse[order[i]] = i;
  }
  NoGradGuard ng;
  return empty(permuted, options).permute(inverse);
}

namespace {
// The spacing of sibling views (equal sizes, strides, dtype and storage, offsets in an evenly
// spaced increasing run), or 0 when the tensors are not siblings.
int64_t sibling_step(const std::vector<Tensor>& parts) {
  if (parts.size() < 2) return 0;
  const Tensor& a = parts[0];
  if (!a.defined()) return 0;
  const int64_t step = parts[1].defined() ? parts[1].storage_offset() - a.storage_offset() : 0;
  if (step <= 0) return 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Tensor& p = parts[i];
    if (!p.defined() || p.storage() != a.storage() || p.dtype() != a.dtype() || p.sizes() != a.sizes() ||
        p.strides() != a.strides() || p.storage_offset() != a.storage_offset() + static_cast<int64_t>(i) * step)
      return 0;
  }
  return step;
}
}  // namespace

std::vector<Tensor> empty_like_siblings(const std::vector<Tensor>& parts, const TensorOptions& options) {
  std::vector<Tensor> out;
  const int64_t step = sibling_step(parts);
  if (step > 0) {
    // the parts' base: [n, part sizes...] with the step as the new dim's stride
    IntList sizes = parts[0].sizes(), strides = parts[0].strides();
    sizes.insert(sizes.begin(), static_cast<int64_t>(parts.size()));
    strides.insert(strides.begin(), step);
    Tensor base = empty_preserving_layout(sizes, strides, options);
    NoGradGuard ng;
    for (size_t i = 0; i < parts.size(); ++i) out.push_back(base.select(0, static_cast<int64_t>(i)));
    return out;
  }
  for (const Tensor& p : parts) out.push_back(p.defined() ? empty_preserving_layout(p, options) : Tensor());
  return out;
}

Tensor view_of_tiled_parts(const std::vector<Tensor>& g, const IntList& sizes, const IntList& strides, int64_t d,
                           const IntList& starts, bool squeezed) {
  if (g.empty() || g.size() != starts.size() || !g[0].defined()) return {};
  const int64_t base_offset = g[0].storage_offset() - starts[0] * strides[d];
  if (base_offset < 0) return {};
  int64_t covered = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const Tensor& p = g[i];
    if (!p.defined() || p.storage() != g[0].storage() || p.dtype() != g[0].dtype() ||
        p.storage_offset() != base_offset + starts[i] * strides[d])
      return {};
    IntList psizes = sizes, pstrides = strides;
    const int64_t length = squeezed ? 1 : p.size(d);
    if (squeezed) {
      psizes.erase(psizes.begin() + d);
      pstrides.erase(pstrides.begin() + d);
    } else {
      psizes[static_cast<size_t>(d)] = length;
    }
    if (p.sizes() != psizes || (p.numel() > 1 && p.strides() != pstrides)) return {};
    if (starts[i] != covered) return {};  // the parts tile dim d in order, so the view only
    covered += length;                    // addresses elements some part holds
  }
  if (covered != sizes[static_cast<size_t>(d)]) return {};
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = g[0].storage();
  impl->sizes = sizes;
  impl->strides = strides;
  impl->offset = base_offset;
  impl->dtype = g[0].dtype();
  return Tensor(std::move(impl));
}

Tensor from_blob(void* data, const IntList& sizes, std::function<void(void*)> deleter, const TensorOptions& opts) {
  return from_blob(data, sizes, contiguous_strides(sizes), std::move(deleter), opts);
}

Tensor from_blob(void* data, const IntList& sizes, const IntList& strides, std::function<void(void*)> deleter,
                 const TensorOptions& opts) {
  check_sizes(sizes, "from_blob");
  KILN_CHECK(sizes.size() == strides.size(), "from_blob: sizes ", sizes, " and strides ", strides, " differ in length");
  KILN_CHECK(data != nullptr || std::accumulate(sizes.begin(), sizes.end(), int64_t{1}, std::multiplies<>()) == 0,
             "from_blob: null data pointer");
  int64_t extent = 1;  // elements spanned
  for (size_t i = 0; i < sizes.size(); ++i) {
    KILN_CHECK(strides[i] >= 0, "from_blob: negative strides are not supported: ", strides);
    if (sizes[i] == 0) {
      extent = 0;
      break;
    }
    extent += (sizes[i] - 1) * strides[i];
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage =
      std::make_shared<Storage>(data, extent * element_size(opts.dtype()), opts.device(), std::move(deleter));
  impl->sizes = sizes;
  impl->strides = strides;
  impl->dtype = opts.dtype();
  Tensor t(std::move(impl));
  if (opts.requires_grad()) t.requires_grad_(true);
  return t;
}

// ---------------------------------------------------------------- conversions

void Tensor::set_data(const Tensor& src) {
  KILN_CHECK(defined() && src.defined(), "set_data: tensor is undefined");
  KILN_CHECK(!requires_grad() || is_floating(src.dtype()),
             "set_data: a tensor that requires grad "
             "needs floating-point data, got ",
             src.dtype());
  impl_->storage = src.impl_->storage;
  impl_->sizes = src.impl_->sizes;
  impl_->strides = src.impl_->strides;
  impl_->offset = src.impl_->offset;
  impl_->dtype = src.impl_->dtype;
}

// ---------------------------------------------------------------- views

namespace {
// Infers one -1 and checks the element count.
IntList infer_sizes(IntList sizes, int64_t numel, const char* op) {
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == -1) {
      KILN_CHECK(infer < 0, op, ": only one dimension can be -1, got ", sizes);
      infer = static_cast<int64_t>(i);
    } else {
      KILN_CHECK(sizes[i] >= 0, op, ": invalid size ", sizes);
      known *= sizes[i];
    }
  }
  if (infer >= 0) {
    KILN_CHECK(known != 0 && numel % known == 0, op, ": shape ", sizes, " is invalid for input of size ", numel);
    sizes[infer] = numel / known;
  } else {
    KILN_CHECK(known == numel, op, ": shape ", sizes, " is invalid for input of size ", numel);
  }
  return sizes;
}

// Strides for viewing (sizes, strides) as new_sizes without a copy, or empty when impossible
// (same algorithm as PyTorch's computeStride: match chunks of contiguous dimensions).
bool view_strides(const IntList& sizes, const IntList& strides, const IntList& new_sizes, IntList& out) {
  out.assign(new_sizes.size(), 0);
  int64_t numel = 1;
  for (int64_t s : sizes) numel *= s;
  if (numel <= 1) {  // empty or a single element (0-dim included): any layout works
    out = contiguous_strides(new_sizes);
    return true;
  }
  int64_t view_d = static_cast<int64_t>(new_sizes.size()) - 1;
  int64_t chunk_base_stride = strides.empty() ? 1 : strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t td = static_cast<int64_t>(sizes.size()) - 1; td >= 0; --td) {
    tensor_numel *= sizes[td];
    if (td == 0 || (sizes[td - 1] != 1 && strides[td - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_sizes[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_sizes[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (td > 0) {
        chunk_base_stride = strides[td - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}
}  // namespace

Tensor Tensor::view(const IntList& new_sizes_in) const {
  IntList new_sizes = infer_sizes(new_sizes_in, numel(), "view");
  IntList st;
  KILN_CHECK(view_strides(sizes(), strides(), new_sizes, st), "view: sizes ", new_sizes,
             " are not compatible with the input's sizes ", sizes(), " and strides ", strides(), "; use reshape()");
  IntList old = sizes();
  return record_view("ViewBackward", *this, make_view(*this, new_sizes, st, storage_offset()),
                     [old](const Tensor& g) { return g.reshape(old); });
}

Tensor Tensor::reshape(const IntList& new_sizes_in) const {
  IntList new_sizes = infer_sizes(new_sizes_in, numel(), "reshape");
  IntList st;
  if (view_strides(sizes(), strides(), new_sizes, st)) return view(new_sizes);
  return contiguous().view(new_sizes);
}

Tensor Tensor::permute(const IntList& dims) const {
  int64_t n = dim();
  KILN_CHECK(static_cast<int64_t>(dims.size()) == n, "permute: expected ", n, " dims, got ", dims);
  IntList sz(n), st(n), inverse(n);
  std::vector<bool> seen(n, false);
  for (int64_t i = 0; i < n; ++i) {
    int64_t d = wrap_dim(dims[i], n, "permute");
    KILN_CHECK(!seen[d], "permute: repeated dimension in ", dims);
    seen[d] = true;
    sz[i] = sizes()[d];
    st[i] = strides()[d];
    inverse[d] = i;
  }
  return record_view("PermuteBackward", *this, make_view(*this, sz, st, storage_offset()),
                     [inverse](const Tensor& g) { return g.permute(inverse); });
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  int64_t n = dim();
  if (n == 0) return *this;
  d0 = wrap_dim(d0, n, "transpose");
  d1 = wrap_dim(d1, n, "transpose");
  IntList perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[d0], perm[d1]);
  return permute(perm);
}

Tensor Tensor::t() const {
  KILN_CHECK(dim() <= 2, "t(): expects a tensor with <= 2 dimensions, got sizes ", sizes());
  return dim() < 2 ? *this : transpose(0, 1);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  d = wrap_dim(d, dim(), "slice");
  KILN_CHECK(step > 0, "slice: step must be positive, got ", step);
  int64_t n = sizes()[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  IntList sz = sizes(), st = strides();
  sz[d] = (end - start + step - 1) / step;
  st[d] *= step;
  int64_t off = storage_offset() + start * strides()[d];
  IntList base = sizes();
  return record_view(
      "SliceBackward", *this, make_view(*this, sz, st, off), [base, d, start, end, step](const Tensor& g) {
        return scatter_into_zeros(g, base, [=](const Tensor& z) { return z.slice(d, start, end, step); });
      });
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  d = wrap_dim(d, dim(), "narrow");
  int64_t n = sizes()[d];
  if (start < 0) start += n;
  KILN_CHECK(start >= 0 && length >= 0 && start + length <= n, "narrow: start ", start, " + length ", length,
             " exceeds dimension ", d, " of size ", n, " (sizes ", sizes(), ")");
  return slice(d, start, start + length);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  KILN_CHECK(dim() > 0, "select: cannot index a 0-dim tensor");
  d = wrap_dim(d, dim(), "select");
  int64_t n = sizes()[d];
  KILN_CHECK(index >= -n && index < n, "select: index ", index, " is out of range for dimension ", d, " of size ", n,
             " (sizes ", sizes(), ")");
  if (index < 0) index += n;
  IntList sz = sizes(), st = strides();
  int64_t off = storage_offset() + index * st[d];
  sz.erase(sz.begin() + d);
  st.erase(st.begin() + d);
  IntList base = sizes();
  return record_view("SelectBackward", *this, make_view(*this, sz, st, off), [base, d, index](const Tensor& g) {
    return scatter_into_zeros(g, base, [=](const Tensor& z) { return z.select(d, index); });
  });
}

Tensor Tensor::squeeze() const {
  IntList sz, st;
  for (int64_t i = 0; i < dim(); ++i) {
    if (sizes()[i] != 1) {
      sz.push_back(sizes()[i]);
      st.push_back(strides()[i]);
    }
  }
  IntList old = sizes();
  return record_view("SqueezeBackward", *this, make_view(*this, sz, st, storage_offset()),
                     [old](const Tensor& g) { return g.reshape(old); });
}

Tensor Tensor::squeeze(int64_t d) const {
  if (dim() == 0) return *this;
  d = wrap_dim(d, dim(), "squeeze");
  if (sizes()[d] != 1) return *this;
  IntList sz = sizes(), st = strides();
  sz.erase(sz.begin() + d);
  st.erase(st.begin() + d);
  return record_view("SqueezeBackward", *this, make_view(*this, sz, st, storage_offset()),
                     [d](const Tensor& g) { return g.unsqueeze(d); });
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = wrap_dim(d, dim() + 1, "unsqueeze");
  IntList sz = sizes(), st = strides();
  int64_t new_stride = d < dim() ? st[d] * sz[d] : 1;
  sz.insert(sz.begin() + d, 1);
  st.insert(st.begin() + d, new_stride);
  return record_view("UnsqueezeBackward", *this, make_view(*this, sz, st, storage_offset()),
                     [d](const Tensor& g) { return g.squeeze(d); });
}

Tensor Tensor::expand(const IntList& new_sizes) const {
  int64_t n = static_cast<int64_t>(new_sizes.size());
  KILN_CHECK(n >= dim(), "expand: the number of sizes provided (", n, ") must be at least the number of dimensions (",
             dim(), ") of sizes ", sizes());
  IntList sz(n), st(n);
  for (int64_t i = n - 1; i >= 0; --i) {
    int64_t j = i - (n - dim());
    int64_t want = new_sizes[i];
    if (j >= 0) {
      int64_t have = sizes()[j];
      if (want == -1) want = have;
      KILN_CHECK(have == want || have == 1, "expand: cannot expand sizes ", sizes(), " to ", new_sizes, " (dimension ",
                 i, ")");
      sz[i] = want;
      st[i] = have == want ? strides()[j] : 0;
    } else {
      KILN_CHECK(want >= 0, "expand: -1 is not allowed in a new leading dimension: ", new_sizes);
      sz[i] = want;
      st[i] = 0;
    }
  }
  IntList old = sizes();
  return record_view("ExpandBackward", *this, make_view(*this, sz, st, storage_offset()),
                     [old](const Tensor& g) { return sum_to(g, old); });
}

Tensor Tensor::flatten(int64_t start, int64_t end) const {
  if (dim() == 0) return reshape({1});
  start = wrap_dim(start, dim(), "flatten");
  end = wrap_dim(end, dim(), "flatten");
  KILN_CHECK(start <= end, "flatten: start_dim ", start, " must not come after end_dim ", end);
  IntList sz;
  for (int64_t i = 0; i < start; ++i) sz.push_back(sizes()[i]);
  int64_t p = 1;
  for (int64_t i = start; i <= end; ++i) p *= sizes()[i];
  sz.push_back(p);
  for (int64_t i = end + 1; i < dim(); ++i) sz.push_back(sizes()[i]);
  return reshape(sz);
}

}  // namespace kiln
