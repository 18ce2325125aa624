#pragma once
// Tensor: a reference-counted handle to a strided view of a Storage, with autograd metadata.
// Copying a Tensor copies the handle (like PyTorch); clone() copies the data.
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/arg.h"
#include "kiln/core/device.h"
#include "kiln/core/dtype.h"
#include "kiln/core/storage.h"
#include "kiln/core/unary_ops.h"

namespace kiln {

// Sizes, strides, dims: a std::vector<int64_t> in every respect (it converts both ways), but a
// type of namespace kiln, so that `std::cout << t.sizes()` finds kiln's operator<< by
// argument-dependent lookup from any namespace and prints [2, 3] as libtorch does; a plain
// std::vector (an alias) would only find std's operators.
struct IntList : std::vector<int64_t> {
  using std::vector<int64_t>::vector;
  IntList() = default;
  IntList(const std::vector<int64_t>& v) : std::vector<int64_t>(v) {}                 // NOLINT: implicit by design
  IntList(std::vector<int64_t>&& v) noexcept : std::vector<int64_t>(std::move(v)) {}  // NOLINT
};

namespace autograd {
class Node;
struct AutogradMeta;
}  // namespace autograd

// Chainable creation options, as in libtorch: TensorOptions().dtype(DType::F64).requires_grad(true)
struct TensorOptions {
  TensorOptions() = default;
  TensorOptions(DType d) : dtype_(d), has_dtype_(true) {}  // NOLINT: implicit, like libtorch
  TensorOptions(Device d) : device_(d) {}                  // NOLINT

  TensorOptions& dtype(DType d) {
    dtype_ = d;
    has_dtype_ = true;
    return *this;
  }
  DType dtype() const noexcept { return dtype_; }  // F32 unless named
  // Whether a dtype was named: kiln::tensor({1, 2}) is int64 unless one was (libtorch).
  bool has_dtype() const noexcept { return has_dtype_; }

 private:
  DType dtype_ = DType::F32;
  bool has_dtype_ = false;

 public:
  KILN_ARG(Device, device) = Device::cpu();
  KILN_ARG(bool, requires_grad) = false;
  // page-locked host memory (CPU tensors only), for asynchronous copies to a GPU
  KILN_ARG(bool, pinned_memory) = false;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  IntList sizes;
  IntList strides;     // in elements
  int64_t offset = 0;  // in elements
  DType dtype = DType::F32;
  std::unique_ptr<autograd::AutogradMeta> autograd;  // created on first use

  TensorImpl();
  ~TensorImpl();
  int64_t numel() const;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- metadata
  bool defined() const { return impl_ != nullptr; }
  const IntList& sizes() const;
  const IntList& strides() const;
  int64_t size(int64_t dim) const;
  int64_t stride(int64_t dim) const;
  int64_t dim() const;
  int64_t numel() const;
  int64_t storage_offset() const;
  DType dtype() const;
  Device device() const;
  TensorOptions options() const;  // dtype and device (not requires_grad)
  bool is_contiguous() const;
  bool is_cuda() const { return device().is_cuda(); }
  bool is_floating_point() const { return is_floating(dtype()); }
  bool is_pinned() const;
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }
  size_t element_size() const { return kiln::element_size(dtype()); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(); }
  const std::shared_ptr<Storage>& storage() const;
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

  // Raw pointer to the first element of this view. T must match dtype().
  void* data_ptr() const;
  template <class T> T* data_ptr() const;
  // Reads a one-element tensor (synchronises with the device if the tensor lives there).
  template <class T> T item() const;
  double item() const { return item<double>(); }

  // ---- conversions and copies
  Tensor to(DType dtype) const;
  Tensor to(Device device, bool non_blocking = false) const;
  Tensor to(Device device, DType dtype, bool non_blocking = false) const;
  Tensor cpu() const { return to(Device::cpu()); }
  Tensor cuda(int index = 0) const { return to(Device::cuda(index)); }
  Tensor contiguous() const;
  Tensor clone() const;
  Tensor pin_memory() const;
  // Makes this tensor (every handle to it) use src's data and metadata, keeping its autograd
  // identity (requires_grad, hooks). What Module::to() uses, so optimizers holding the same
  // parameters see the moved data.
  void set_data(const Tensor& src);

  // ---- views (no copy; share storage and version counter)
  Tensor view(const IntList& sizes) const;
  Tensor reshape(const IntList& sizes) const;  // a view when possible, else a copy
  Tensor permute(const IntList& dims) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor t() const;  // 2-D transpose
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor operator[](int64_t index) const { return select(0, index); }
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor expand(const IntList& sizes) const;  // -1 keeps a size
  Tensor expand_as(const Tensor& other) const { return expand(other.sizes()); }
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor view_as(const Tensor& other) const { return view(other.sizes()); }

  // ---- autograd
  bool requires_grad() const;
  Tensor& requires_grad_(bool r = true);
  const Tensor& grad() const;  // undefined tensor when there is none
  Tensor& mutable_grad();      // for optimizers and loss scalers
  void set_grad(const Tensor& g);
  const std::shared_ptr<autograd::Node>& grad_fn() const;
  bool is_leaf() const;
  uint32_t output_nr() const;
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false, bool create_graph = false) const;
  Tensor detach() const;
  Tensor& detach_();
  void retain_grad() const;
  // Runs when the gradient for this tensor is computed; may return a replacement gradient
  // (return an undefined Tensor to keep it). Returns a handle for remove_hook.
  size_t register_hook(std::function<Tensor(const Tensor&)> hook) const;
  void remove_hook(size_t handle) const;
  // Leaves only: runs after the gradient has been accumulated into grad().
  void register_post_accumulate_grad_hook(std::function<void(Tensor&)> hook) const;
  uint64_t version() const;

  // ---- in-place (not recorded by autograd; they bump the version counter)
  Tensor& zero_();
  Tensor& fill_(double value);
  Tensor& copy_(const Tensor& src, bool non_blocking = false);
  Tensor& add_(const Tensor& other, double alpha = 1.0);
  Tensor& add_(double other);
  Tensor& sub_(const Tensor& other) { return add_(other, -1.0); }
  Tensor& mul_(const Tensor& other);
  Tensor& mul_(double other);
  Tensor& div_(const Tensor& other);
  Tensor& div_(double other) { return mul_(1.0 / other); }
  Tensor& clamp_(double min, double max);

  // ---- math (differentiable; defined in kiln/ops)
  Tensor add(const Tensor& o) const;
  Tensor sub(const Tensor& o) const;
  Tensor mul(const Tensor& o) const;
  Tensor div(const Tensor& o) const;
  // x.neg(), x.exp(), x.relu(), ...: one per row of kiln/core/unary_ops.h whose Api is Method
  KILN_UNARY_OPS(KILN_UNARY_DECLARE_METHOD)
  Tensor gelu(const std::string& approximate = "none") const;
  Tensor pow(double exponent) const;
  Tensor pow(const Tensor& exponent) const;
  Tensor square() const;
  Tensor clamp(double min, double max) const;
  Tensor clamp_min(double min) const;
  Tensor clamp_max(double max) const;

  Tensor eq(const Tensor& o) const;
  Tensor ne(const Tensor& o) const;
  Tensor lt(const Tensor& o) const;
  Tensor le(const Tensor& o) const;
  Tensor gt(const Tensor& o) const;
  Tensor ge(const Tensor& o) const;
  Tensor eq(double o) const;
  Tensor ne(double o) const;
  Tensor lt(double o) const;
  Tensor le(double o) const;
  Tensor gt(double o) const;
  Tensor ge(double o) const;

  Tensor sum() const;
  Tensor sum(const IntList& dims, bool keepdim = false) const;
  Tensor mean() const;
  Tensor mean(const IntList& dims, bool keepdim = false) const;
  Tensor max() const;
  Tensor min() const;
  std::tuple<Tensor, Tensor> max(int64_t dim, bool keepdim = false) const;  // values, indices
  std::tuple<Tensor, Tensor> min(int64_t dim, bool keepdim = false) const;
  Tensor amax(const IntList& dims, bool keepdim = false) const;
  Tensor amin(const IntList& dims, bool keepdim = false) const;
  Tensor argmax() const;
  Tensor argmax(int64_t dim, bool keepdim = false) const;
  Tensor argmin(int64_t dim, bool keepdim = false) const;
  // correction = 1 is the unbiased estimate (PyTorch's default), 0 the population variance
  Tensor var(const IntList& dims, int64_t correction = 1, bool keepdim = false) const;
  Tensor var() const;  // over all elements, unbiased
  Tensor std(const IntList& dims, int64_t correction = 1, bool keepdim = false) const;

  Tensor matmul(const Tensor& o) const;
  Tensor mm(const Tensor& o) const;
  Tensor bmm(const Tensor& o) const;
  Tensor softmax(int64_t dim) const;
  Tensor log_softmax(int64_t dim) const;
  Tensor index_select(int64_t dim, const Tensor& index) const;
  Tensor gather(int64_t dim, const Tensor& index) const;

  // ---- model-writer ops (kiln/ops/pointwise.cpp, masking.cpp, sort_scan.cpp, sampling.cpp)
  Tensor tril(int64_t diagonal = 0) const;
  Tensor triu(int64_t diagonal = 0) const;
  Tensor masked_fill(const Tensor& mask, double value) const;
  Tensor& masked_fill_(const Tensor& mask, double value);  // in place: not recorded by autograd
  Tensor cumsum(int64_t dim) const;
  Tensor cumprod(int64_t dim) const;
  std::tuple<Tensor, Tensor> sort(int64_t dim = -1, bool descending = false) const;  // values, indices
  Tensor argsort(int64_t dim = -1, bool descending = false) const;
  std::tuple<Tensor, Tensor> topk(int64_t k, int64_t dim = -1, bool largest = true,
                                  bool sorted = true) const;  // values, indices

  // ---- libtorch's shape, logical and norm helpers (ops/split.cpp, logical.cpp, norm.cpp), composed of the ops
  // above, so differentiable and on every device
  Tensor repeat(const IntList& repeats) const;                           // tile: one count per dim (leading dims added)
  std::vector<Tensor> chunk(int64_t chunks, int64_t dim = 0) const;      // views, ceil(size / chunks) each
  std::vector<Tensor> split(int64_t split_size, int64_t dim = 0) const;  // views, the last may be smaller
  std::vector<Tensor> split(const IntList& split_sizes, int64_t dim = 0) const;  // sizes sum to size(dim)
  std::vector<Tensor> unbind(int64_t dim = 0) const;  // views: the select of each index of dim
  // dim split into `sizes` (one of them may be -1, inferred), as torch.unflatten: a view
  Tensor unflatten(int64_t dim, const IntList& sizes) const;
  Tensor all() const;  // bool: every element is non-zero
  Tensor all(int64_t dim, bool keepdim = false) const;
  Tensor any() const;  // bool: some element is non-zero
  Tensor any(int64_t dim, bool keepdim = false) const;
  // vector p-norm over dims (all when empty); p = inf / -inf: max / min |x|, p = 0: count of
  // non-zeros; the gradient at a zero norm is 0 (as PyTorch)
  Tensor norm(double p = 2.0) const;
  Tensor norm(double p, const IntList& dims, bool keepdim = false) const;

  std::string str() const;  // what operator<< prints

 private:
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);
std::ostream& operator<<(std::ostream& os, const IntList& sizes);  // [2, 3]

// ---- creation
Tensor empty(const IntList& sizes, const TensorOptions& opts = {});
Tensor zeros(const IntList& sizes, const TensorOptions& opts = {});
Tensor ones(const IntList& sizes, const TensorOptions& opts = {});
Tensor full(const IntList& sizes, double value, const TensorOptions& opts = {});
Tensor arange(double end, const TensorOptions& opts = {});
Tensor arange(double start, double end, double step = 1.0, const TensorOptions& opts = {});
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor empty_like(const Tensor& t);
Tensor full_like(const Tensor& t, double value);
// Uniform [0, 1) and standard normal from the device's Philox generator.
Tensor rand(const IntList& sizes, const TensorOptions& opts = {});
Tensor randn(const IntList& sizes, const TensorOptions& opts = {});
Tensor rand_like(const Tensor& t);
Tensor randn_like(const Tensor& t);
// Integers uniformly in [low, high).
Tensor randint(int64_t low, int64_t high, const IntList& sizes, const TensorOptions& opts = DType::I64);
// Copies host data into a new 1-D tensor (then to opts' device). The dtype follows T unless opts
// names another.
template <class T> Tensor tensor(const std::vector<T>& values, const TensorOptions& opts);
template <class T> Tensor tensor(const std::vector<T>& values) {
  return tensor(values, TensorOptions().dtype(dtype_of<T>::value));
}
// One element of a kiln::tensor({...}) literal, remembering how it was written.
struct TensorLiteral {
  enum class Kind : uint8_t { Bool, Int, Float };
  template <class T, std::enable_if_t<std::is_arithmetic<T>::value, int> = 0>
  TensorLiteral(T v)  // NOLINT: implicit, so that {1, 2, 3} converts
      : f(static_cast<double>(v)),
        i(static_cast<int64_t>(v)),
        kind(std::is_same<T, bool>::value ? Kind::Bool
             : std::is_integral<T>::value ? Kind::Int
                                          : Kind::Float) {}
  double f;
  int64_t i;
  Kind kind;
};
// As libtorch: kiln::tensor({1, 2, 0, 3}) is int64, kiln::tensor({1.5, 2.0}) float32 (a list
// with any floating value is float32), kiln::tensor({true, false}) bool; a dtype named in opts
// wins.
Tensor tensor(std::initializer_list<TensorLiteral> values, const TensorOptions& opts = {});
Tensor scalar_tensor(double value, const TensorOptions& opts = {});
// Zero-copy view of memory the caller owns (torch.from_blob / as_tensor). `deleter` (may be
// empty) runs when the last tensor viewing the memory is destroyed.
Tensor from_blob(void* data, const IntList& sizes, std::function<void(void*)> deleter = {},
                 const TensorOptions& opts = {});
Tensor from_blob(void* data, const IntList& sizes, const IntList& strides, std::function<void(void*)> deleter = {},
                 const TensorOptions& opts = {});

// ---- free-function forms of the ops
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(double a, const Tensor& b);
Tensor operator-(const Tensor& a);
Tensor operator==(const Tensor& a, const Tensor& b);
Tensor operator!=(const Tensor& a, const Tensor& b);
Tensor operator<(const Tensor& a, const Tensor& b);
Tensor operator<=(const Tensor& a, const Tensor& b);
Tensor operator>(const Tensor& a, const Tensor& b);
Tensor operator>=(const Tensor& a, const Tensor& b);
Tensor operator==(const Tensor& a, double b);
Tensor operator!=(const Tensor& a, double b);
Tensor operator<(const Tensor& a, double b);
Tensor operator<=(const Tensor& a, double b);
Tensor operator>(const Tensor& a, double b);
Tensor operator>=(const Tensor& a, double b);
Tensor& operator+=(Tensor& a, const Tensor& b);
Tensor& operator-=(Tensor& a, const Tensor& b);
Tensor& operator*=(Tensor& a, const Tensor& b);
Tensor& operator/=(Tensor& a, const Tensor& b);
Tensor& operator+=(Tensor& a, double b);
Tensor& operator-=(Tensor& a, double b);
Tensor& operator*=(Tensor& a, double b);
Tensor& operator/=(Tensor& a, double b);

Tensor add(const Tensor& a, const Tensor& b, double alpha = 1.0);
Tensor sub(const Tensor& a, const Tensor& b, double alpha = 1.0);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
// neg, exp, log, relu, isnan, ... (Tensor f(const Tensor& a)): one per row of kiln/core/unary_ops.h
// whose Api is Method or Function
KILN_UNARY_OPS(KILN_UNARY_DECLARE_FUNCTION)
Tensor gelu(const Tensor& a, const std::string& approximate = "none");  // "none" (erf) or "tanh"
Tensor pow(const Tensor& a, double exponent);
Tensor pow(const Tensor& a, const Tensor& exponent);
Tensor pow(double base, const Tensor& exponent);
Tensor clamp(const Tensor& a, double min, double max);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b);
Tensor where(const Tensor& condition, const Tensor& a, double b);
Tensor where(const Tensor& condition, double a, const Tensor& b);
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8);
bool equal(const Tensor& a, const Tensor& b);  // same shape and identical values

Tensor sum(const Tensor& a, const IntList& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& a, const IntList& dims = {}, bool keepdim = false);
Tensor matmul(const Tensor& a, const Tensor& b);
Tensor mm(const Tensor& a, const Tensor& b);
Tensor bmm(const Tensor& a, const Tensor& b);
Tensor softmax(const Tensor& a, int64_t dim);
Tensor log_softmax(const Tensor& a, int64_t dim);
Tensor logsumexp(const Tensor& a, const IntList& dims, bool keepdim = false);

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index);
Tensor gather(const Tensor& a, int64_t dim, const Tensor& index);
// out[i..., :] = weight[indices[i...], :]
Tensor embedding(const Tensor& weight, const Tensor& indices);
Tensor one_hot(const Tensor& indices, int64_t num_classes = -1);

enum class Reduction { None, Mean, Sum };
// input: [N, C] or [N, C, d1, ...] logits; target: class indices [N] / [N, d1, ...].
Tensor cross_entropy(const Tensor& input, const Tensor& target, int64_t ignore_index = -100,
                     double label_smoothing = 0.0, Reduction reduction = Reduction::Mean);
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, int64_t ignore_index = -100,
                Reduction reduction = Reduction::Mean);
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);

// ---- model-writer ops, as libtorch's (docs/guide.md, "Op list")
// Elements above (tril) / below (triu) the given diagonal of the last two dims set to 0.
Tensor tril(const Tensor& a, int64_t diagonal = 0);
Tensor triu(const Tensor& a, int64_t diagonal = 0);
// a with `value` where the bool mask (broadcast to a's shape) is true.
Tensor masked_fill(const Tensor& a, const Tensor& mask, double value);
// Inclusive scans along dim; integer and bool inputs give int64, as PyTorch.
Tensor cumsum(const Tensor& a, int64_t dim);
Tensor cumprod(const Tensor& a, int64_t dim);
// Stable sort along dim; NaN sorts as the largest value. Returns (values, int64 indices).
std::tuple<Tensor, Tensor> sort(const Tensor& a, int64_t dim = -1, bool descending = false);
Tensor argsort(const Tensor& a, int64_t dim = -1, bool descending = false);
// The k largest (smallest) along dim, in sorted order (also when sorted = false).
std::tuple<Tensor, Tensor> topk(const Tensor& a, int64_t k, int64_t dim = -1, bool largest = true, bool sorted = true);
class Generator;
// num_samples int64 category indices per row of a 1-D [n] or 2-D [rows, n] tensor of
// non-negative weights (not necessarily normalised). generator: nullptr = the default one of
// probs' device.
Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement = false, Generator* generator = nullptr);

// ---- libtorch's shape, creation and contraction helpers (ops/split.cpp, linspace.cpp, einsum.cpp)
// steps values from start to end inclusive (torch.linspace); float32 unless opts names a dtype.
Tensor linspace(double start, double end, int64_t steps, const TensorOptions& opts = {});
// t's sizes and device; opts' dtype when it names one, and requires_grad
Tensor full_like(const Tensor& t, double value, const TensorOptions& opts);
std::vector<Tensor> chunk(const Tensor& a, int64_t chunks, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& a, int64_t split_size, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& a, const IntList& split_sizes, int64_t dim = 0);
std::vector<Tensor> unbind(const Tensor& a, int64_t dim = 0);
Tensor all(const Tensor& a);
Tensor any(const Tensor& a);
Tensor norm(const Tensor& a, double p = 2.0, const IntList& dims = {}, bool keepdim = false);
// torch.einsum for equations of letters ("ij,jk->ik", "bhqd,bhkd->bhqk", "i,j->ij", "ii->",
// "ij->ji", "ij->"; the output may be left implicit), any number of operands, by permute,
// reshape, sum and matmul. No "..." and no broadcasting of size-1 dims: those throw kiln::Error.
Tensor einsum(const std::string& equation, const std::vector<Tensor>& tensors);

// ---- RNG
// Seeds every device's default Philox generator.
void manual_seed(uint64_t seed);

}  // namespace kiln
