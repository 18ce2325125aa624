// The indexing kernels' entry points (kiln/kernels/indexing.h): they check what every backend
// relies on (one device, matching dtypes, int64/int32 indices, consistent shapes), then dispatch.
// The index *values* are range-checked by the backend, before it writes anything.
#include "kiln/kernels/indexing.h"

#include "kiln/core/shape.h"

namespace kiln::kernels {

namespace {

void require_defined(const char* op, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) KILN_CHECK(t->defined(), op, ": an operand is undefined");
}

void check_index_dtype(const Tensor& index, const char* op) {
  KILN_CHECK(index.dtype() == DType::I64 || index.dtype() == DType::I32, op,
             ": index must be an int64 or int32 tensor, got ", index.dtype(), " (sizes ", index.sizes(), ")");
}

void check_same_dtype(const Tensor& a, const char* an, const Tensor& b, const char* bn, const char* op) {
  KILN_CHECK(a.dtype() == b.dtype(), op, ": expected ", an, " and ", bn, " to share a dtype, got ", a.dtype(), " and ",
             b.dtype());
}

IntList with_size(IntList s, int64_t d, int64_t n) {
  s[d] = n;
  return s;
}

// What index_select and index_add check alike: an integer index of at most one dimension, and a
// tensor `data` (the input, the target) of at least one dimension to index along `dim`, which is
// returned wrapped.
int64_t check_index_along(const char* op, const Tensor& data, const char* data_is, const Tensor& index, int64_t dim) {
  check_index_dtype(index, op);
  KILN_CHECK(data.dim() >= 1, op, ": the kernel expects ", data_is, " with at least one dimension, got sizes ",
             data.sizes());
  dim = wrap_dim(dim, data.dim(), op);
  KILN_CHECK(index.dim() <= 1, op, ": index must be 0-D or 1-D, got sizes ", index.sizes());
  return dim;
}

}  // namespace

void index_select(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index, const char* op) {
  require_defined(op, {&out, &in, &index});
  const Device dev = operand_device(op, out, in, index);
  dim = check_index_along(op, in, "an input", index, dim);
  check_same_dtype(out, "out", in, "input", op);
  IntList want = with_size(in.sizes(), dim, index.numel());
  KILN_CHECK(out.sizes() == want, op, ": out has sizes ", out.sizes(), ", expected ", want);
  backend::index_select.on(dev, out, in, dim, index, op);
}

void index_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, const char* op) {
  require_defined(op, {&out, &index, &src});
  const Device dev = operand_device(op, out, index, src);
  dim = check_index_along(op, out, "a target", index, dim);
  check_same_dtype(out, "the target", src, "source", op);
  IntList want = with_size(out.sizes(), dim, index.numel());
  KILN_CHECK(src.sizes() == want, op, ": source has sizes ", src.sizes(), ", expected ", want, " (target sizes ",
             out.sizes(), ", ", index.numel(), " indices along dimension ", dim, ")");
  backend::index_add.on(dev, out, dim, index, src, op);
}

void gather(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index, const char* op) {
  require_defined(op, {&out, &in, &index});
  const Device dev = operand_device(op, out, in, index);
  check_index_dtype(index, op);
  dim = wrap_dim(dim, in.dim(), op);
  KILN_CHECK(index.dim() == in.dim(), op, ": index must have as many dimensions as the input, got index sizes ",
             index.sizes(), " and input sizes ", in.sizes());
  for (int64_t d = 0; d < in.dim(); ++d) {
    KILN_CHECK(d == dim || index.size(d) <= in.size(d), op, ": index sizes ", index.sizes(), " exceed the input sizes ",
               in.sizes(), " in dimension ", d, " (only dimension ", dim, " may be larger)");
  }
  check_same_dtype(out, "out", in, "input", op);
  KILN_CHECK(out.sizes() == index.sizes(), op, ": out has sizes ", out.sizes(), ", expected the index sizes ",
             index.sizes());
  backend::gather.on(dev, out, in, dim, index, op);
}

void scatter_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, const char* op) {
  require_defined(op, {&out, &index, &src});
  const Device dev = operand_device(op, out, index, src);
  check_index_dtype(index, op);
  dim = wrap_dim(dim, out.dim(), op);
  KILN_CHECK(index.dim() == out.dim() && src.dim() == out.dim(), op,
             ": index, source and target must have the same number of dimensions, got index sizes ", index.sizes(),
             ", source sizes ", src.sizes(), " and target sizes ", out.sizes());
  for (int64_t d = 0; d < out.dim(); ++d) {
    KILN_CHECK(index.size(d) <= src.size(d), op, ": index sizes ", index.sizes(), " exceed the source sizes ",
               src.sizes(), " in dimension ", d);
    KILN_CHECK(d == dim || index.size(d) <= out.size(d), op, ": index sizes ", index.sizes(),
               " exceed the target sizes ", out.sizes(), " in dimension ", d, " (only dimension ", dim,
               " may be larger)");
  }
  check_same_dtype(out, "the target", src, "source", op);
  backend::scatter_add.on(dev, out, dim, index, src, op);
}

std::pair<int64_t, int64_t> index_min_max(const Tensor& index, const char* op) {
  KILN_CHECK(index.defined(), op, ": index is undefined");
  check_index_dtype(index, op);
  KILN_CHECK(index.numel() > 0, op, ": index_min_max needs a non-empty index");
  // On a GPU an explicit synchronisation: one reduction on the device, 16 bytes copied back.
  return backend::index_min_max.on(index.device(), index, op);
}

}  // namespace kiln::kernels
