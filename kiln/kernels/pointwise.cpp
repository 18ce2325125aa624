// Routes each raw kernel to the backend of its operands' device, after checking that all
// operands agree on the device.
#include <algorithm>

#include "kiln/config.h"
#include "kiln/core/cuda.h"
#include "kiln/kernels/cpu/cpu_kernels.h"
#include "kiln/kernels/kernels.h"
#if KILN_WITH_CUDA
#include "kiln/kernels/cuda/cuda_kernels.h"
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
  KILN_FAIL(op, ": kiln was built without CUDA support, so this op cannot run on a CUDA tensor");
}

// KILN_CUDA_KERNEL(name, call): the CUDA backend's version of a kernel, or an error saying why not.
#if KILN_WITH_CUDA
#define KILN_CUDA_KERNEL(name, call) return cuda::call
#else
#define KILN_CUDA_KERNEL(name, call) no_cuda_kernel(name)
#endif

}  // namespace

const char* op_name(UnaryOp op) {
  static const char* names[] = {"neg", "exp", "log", "sqrt", "rsqrt", "abs", "tanh", "sigmoid",
                                "relu", "gelu", "gelu_tanh", "silu", "square", "reciprocal",
                                "sign", "pow", "clamp", "add", "mul", "rsub", "rdiv", "rpow", "erf",
                                "isnan", "isinf", "isfinite", "logical_not"};
  return names[static_cast<int>(op)];
}

const char* op_name(BinaryOp op) {
  static const char* names[] = {"add", "sub", "mul", "div", "pow", "maximum", "minimum",
                                "relu_backward", "sigmoid_backward", "tanh_backward",
                                "gelu_backward", "gelu_tanh_backward", "silu_backward",
                                "clamp_backward", "eq", "ne", "lt", "le", "gt", "ge",
                                "logical_and", "logical_or"};
  return names[static_cast<int>(op)];
}

bool is_predicate(UnaryOp op) { return op >= UnaryOp::IsNan; }
bool is_comparison(BinaryOp op) { return op >= BinaryOp::Eq; }

void unary(UnaryOp op, const Tensor& out, const Tensor& in, double a, double b) {
  if (common_device(op_name(op), {&out, &in}).is_cpu()) return cpu::unary(op, out, in, a, b);
  KILN_CUDA_KERNEL(op_name(op), unary(op, out, in, a, b));
}

void binary(BinaryOp op, const Tensor& out, const Tensor& x, const Tensor& y, double alpha,
            double beta) {
  if (common_device(op_name(op), {&out, &x, &y}).is_cpu())
    return cpu::binary(op, out, x, y, alpha, beta);
  KILN_CUDA_KERNEL(op_name(op), binary(op, out, x, y, alpha, beta));
}

void where(const Tensor& out, const Tensor& cond, const Tensor& x, const Tensor& y) {
  if (common_device("where", {&out, &cond, &x, &y}).is_cpu()) return cpu::where(out, cond, x, y);
  KILN_CUDA_KERNEL("where", where(out, cond, x, y));
}

void copy(const Tensor& dst, const Tensor& src, bool non_blocking) {
  KILN_CHECK(dst.defined() && src.defined(), "copy_: an operand is undefined");
  if (dst.device().is_cpu() && src.device().is_cpu()) return cpu::copy(dst, src);
  // Cross-device or device-to-device: a byte copy when layouts and dtypes match, otherwise stage
  // through a contiguous tensor of the destination's dtype.
  if (dst.dtype() == src.dtype() && dst.sizes() == src.sizes() && dst.is_contiguous() &&
      src.is_contiguous()) {
    kiln::cuda::memcpy(dst.data_ptr(), dst.device(), src.data_ptr(), src.device(), dst.nbytes(),
                 non_blocking);
    // An asynchronous copy from/to pinned memory is still running: its block must not be reused
    // by the pinned cache until the copy's stream has passed this point.
    if (non_blocking && (src.is_pinned() || dst.is_pinned())) {
      const Tensor& host = src.is_pinned() ? src : dst;
      const Device dev = src.is_pinned() ? dst.device() : src.device();
      kiln::cuda::record_host_use(host.storage()->data(), kiln::cuda::current_stream(dev.index));
    }
    return;
  }
  if (src.device().is_cpu()) {  // host -> device: convert on the host first
    Tensor staged = empty(dst.sizes(), TensorOptions().dtype(dst.dtype()));
    cpu::copy(staged, src);
    if (dst.is_contiguous()) {
      kiln::cuda::memcpy(dst.data_ptr(), dst.device(), staged.data_ptr(), Device::cpu(), dst.nbytes(), false);
      return;
    }
  } else if (dst.device().is_cpu()) {  // device -> host: bring the bytes over, convert here
    Tensor staged = empty(src.sizes(), TensorOptions().dtype(src.dtype()));
    Tensor src_c = src.is_contiguous() ? src : src.contiguous();
    kiln::cuda::memcpy(staged.data_ptr(), Device::cpu(), src_c.data_ptr(), src_c.device(), src_c.nbytes(), false);
    cpu::copy(dst, staged);
    return;
  }
  KILN_CHECK(src.device() == dst.device(), "copy_: copies between two CUDA devices must be contiguous and "
             "of one dtype (got ", src.device(), " -> ", dst.device(), ")");
  KILN_CUDA_KERNEL("copy_", copy(dst, src));
}

void fill(const Tensor& dst, double value) {
  if (dst.device().is_cpu()) return cpu::fill(dst, value);
  KILN_CUDA_KERNEL("fill_", fill(dst, value));
}

void fill_uniform(const Tensor& dst, uint64_t seed, uint64_t offset) {
  if (dst.device().is_cpu()) return cpu::fill_uniform(dst, seed, offset);
  KILN_CUDA_KERNEL("rand", fill_uniform(dst, seed, offset));
}

void fill_normal(const Tensor& dst, uint64_t seed, uint64_t offset) {
  if (dst.device().is_cpu()) return cpu::fill_normal(dst, seed, offset);
  KILN_CUDA_KERNEL("randn", fill_normal(dst, seed, offset));
}

void fill_randint(const Tensor& dst, int64_t low, int64_t high, uint64_t seed, uint64_t offset) {
  if (dst.device().is_cpu()) return cpu::fill_randint(dst, low, high, seed, offset);
  KILN_CUDA_KERNEL("randint", fill_randint(dst, low, high, seed, offset));
}

void reduce(ReduceOp op, const Tensor& out, const Tensor& in, const IntList& dims) {
  if (common_device("reduce", {&out, &in}).is_cpu()) return cpu::reduce(op, out, in, dims);
  KILN_CUDA_KERNEL("reduce", reduce(op, out, in, dims));
}

void arg_reduce(bool is_max, const Tensor& values, const Tensor& indices, const Tensor& in,
                int64_t dim) {
  if (common_device(is_max ? "max" : "min", {&values, &indices, &in}).is_cpu())
    return cpu::arg_reduce(is_max, values, indices, in, dim);
  KILN_CUDA_KERNEL(is_max ? "max" : "min", arg_reduce(is_max, values, indices, in, dim));
}

void matmul(const Tensor& c, const Tensor& a, const Tensor& b) {
  if (common_device("matmul", {&c, &a, &b}).is_cpu()) return cpu::matmul(c, a, b);
  KILN_CUDA_KERNEL("matmul", matmul(c, a, b));
}

void softmax(const Tensor& out, const Tensor& in, bool log) {
  if (common_device("softmax", {&out, &in}).is_cpu()) return cpu::softmax(out, in, log);
  KILN_CUDA_KERNEL("softmax", softmax(out, in, log));
}

void softmax_backward(const Tensor& grad_in, const Tensor& grad_out, const Tensor& out, bool log) {
  if (common_device("softmax_backward", {&grad_in, &grad_out, &out}).is_cpu())
    return cpu::softmax_backward(grad_in, grad_out, out, log);
  KILN_CUDA_KERNEL("softmax_backward", softmax_backward(grad_in, grad_out, out, log));
}

}  // namespace kiln::kernels
