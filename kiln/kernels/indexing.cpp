// Routes the indexing kernels (kiln/kernels/indexing.h) to a backend after checking what every
// backend relies on: one device, matching dtypes, int64/int32 indices and consistent shapes.
// The index *values* are range-checked by the backend, before it writes anything.
#include "kiln/kernels/indexing.h"

#include "kiln/config.h"
#include "kiln/core/shape.h"
#if KILN_WITH_CUDA
#include "kiln/kernels/cuda/indexing_cuda.h"
#endif

namespace kiln::kernels {

namespace {

Device common_device(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor* first = nullptr;
  for (const Tensor* t : ts) {
    KILN_CHECK(t->defined(), op, ": an operand is undefined");
    if (!first) {
      first = t;
      continue;
    }
    KILN_CHECK(t->device() == first->device(), op, ": expected all tensors on one device, got ",
               first->device(), " (sizes ", first->sizes(), ") and ", t->device(), " (sizes ",
               t->sizes(), ")");
  }
  return first->device();
}

[[noreturn, maybe_unused]] void no_cuda_kernel(const char* op) {
  KILN_FAIL(op, ": kiln was built without CUDA, so this op cannot run on a CUDA tensor; move the "
            "tensors to the CPU with .cpu()");
}

#if KILN_WITH_CUDA
#define KILN_INDEXING_CUDA(op_name, call) return cuda::call
#else
#define KILN_INDEXING_CUDA(op_name, call) no_cuda_kernel(op_name)
#endif

void check_index_dtype(const Tensor& index, const char* op) {
  KILN_CHECK(index.dtype() == DType::I64 || index.dtype() == DType::I32, op,
             ": index must be an int64 or int32 tensor, got ", index.dtype(), " (sizes ",
             index.sizes(), ")");
}

void check_same_dtype(const Tensor& a, const char* an, const Tensor& b, const char* bn,
                      const char* op) {
  KILN_CHECK(a.dtype() == b.dtype(), op, ": expected ", an, " and ", bn, " to share a dtype, got ",
             a.dtype(), " and ", b.dtype());
}

IntList with_size(IntList s, int64_t d, int64_t n) {
  s[d] = n;
  return s;
}

}  // namespace

void index_select(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index,
                  const char* op) {
  Device dev = common_device(op, {&out, &in, &index});
  check_index_dtype(index, op);
  KILN_CHECK(in.dim() >= 1, op, ": the kernel expects an input with at least one dimension, got sizes ",
             in.sizes());
  dim = wrap_dim(dim, in.dim(), op);
  KILN_CHECK(index.dim() <= 1, op, ": index must be 0-D or 1-D, got sizes ", index.sizes());
  check_same_dtype(out, "out", in, "input", op);
  IntList want = with_size(in.sizes(), dim, index.numel());
  KILN_CHECK(out.sizes() == want, op, ": out has sizes ", out.sizes(), ", expected ", want);
  if (dev.is_cpu()) return cpu::index_select(out, in, dim, index, op);
  KILN_INDEXING_CUDA(op, index_select(out, in, dim, index, op));
}

void index_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src,
               const char* op) {
  Device dev = common_device(op, {&out, &index, &src});
  check_index_dtype(index, op);
  KILN_CHECK(out.dim() >= 1, op, ": the kernel expects a target with at least one dimension, got sizes ",
             out.sizes());
  dim = wrap_dim(dim, out.dim(), op);
  KILN_CHECK(index.dim() <= 1, op, ": index must be 0-D or 1-D, got sizes ", index.sizes());
  check_same_dtype(out, "the target", src, "source", op);
  IntList want = with_size(out.sizes(), dim, index.numel());
  KILN_CHECK(src.sizes() == want, op, ": source has sizes ", src.sizes(), ", expected ", want,
             " (target sizes ", out.sizes(), ", ", index.numel(), " indices along dimension ", dim, ")");
  if (dev.is_cpu()) return cpu::index_add(out, dim, index, src, op);
  KILN_INDEXING_CUDA(op, index_add(out, dim, index, src, op));
}

void gather(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index, const char* op) {
  Device dev = common_device(op, {&out, &in, &index});
  check_index_dtype(index, op);
  dim = wrap_dim(dim, in.dim(), op);
  KILN_CHECK(index.dim() == in.dim(), op, ": index must have as many dimensions as the input, got index sizes ",
             index.sizes(), " and input sizes ", in.sizes());
  for (int64_t d = 0; d < in.dim(); ++d) {
    KILN_CHECK(d == dim || index.size(d) <= in.size(d), op, ": index sizes ", index.sizes(),
               " exceed the input sizes ", in.sizes(), " in dimension ", d, " (only dimension ",
               dim, " may be larger)");
  }
  check_same_dtype(out, "out", in, "input", op);
  KILN_CHECK(out.sizes() == index.sizes(), op, ": out has sizes ", out.sizes(),
             ", expected the index sizes ", index.sizes());
  if (dev.is_cpu()) return cpu::gather(out, in, dim, index, op);
  KILN_INDEXING_CUDA(op, gather(out, in, dim, index, op));
}

void scatter_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src,
                 const char* op) {
  Device dev = common_device(op, {&out, &index, &src});
  check_index_dtype(index, op);
  dim = wrap_dim(dim, out.dim(), op);
  KILN_CHECK(index.dim() == out.dim() && src.dim() == out.dim(), op,
             ": index, source and target must have the same number of dimensions, got index sizes ",
             index.sizes(), ", source sizes ", src.sizes(), " and target sizes ", out.sizes());
  for (int64_t d = 0; d < out.dim(); ++d) {
    KILN_CHECK(index.size(d) <= src.size(d), op, ": index sizes ", index.sizes(),
               " exceed the source sizes ", src.sizes(), " in dimension ", d);
    KILN_CHECK(d == dim || index.size(d) <= out.size(d), op, ": index sizes ", index.sizes(),
               " exceed the target sizes ", out.sizes(), " in dimension ", d,
               " (only dimension ", dim, " may be larger)");
  }
  check_same_dtype(out, "the target", src, "source", op);
  if (dev.is_cpu()) return cpu::scatter_add(out, dim, index, src, op);
  KILN_INDEXING_CUDA(op, scatter_add(out, dim, index, src, op));
}

std::pair<int64_t, int64_t> index_min_max(const Tensor& index, const char* op) {
  KILN_CHECK(index.defined(), op, ": index is undefined");
  check_index_dtype(index, op);
  KILN_CHECK(index.numel() > 0, op, ": index_min_max needs a non-empty index");
  if (index.device().is_cpu()) return cpu::index_min_max(index, op);
  // An explicit synchronisation: one reduction on the device, 16 bytes copied back.
  KILN_INDEXING_CUDA(op, index_min_max(index, op));
}

}  // namespace kiln::kernels
