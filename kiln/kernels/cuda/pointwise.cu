// CUDA pointwise kernels: the same op table and functors as the CPU backend, launched as
// grid-stride kernels over the shared PointwiseIter (see launch.cuh).
#include "kiln/core/philox.h"
#include "kiln/kernels/copy_fill.h"
#include "kiln/kernels/matmul.h"
#include "kiln/kernels/pointwise.h"
#include "kiln/kernels/reduce.h"
#include "kiln/kernels/softmax.h"
#include "kiln/kernels/cuda/launch.cuh"
#include "kiln/kernels/op_table.h"

namespace kiln::kernels::cuda {

void unary(UnaryOp op, const Tensor& out, const Tensor& in, double a, double b) {
  const char* name = op_name(op);
  KILN_CHECK(is_predicate(op) ? out.dtype() == DType::Bool : out.dtype() == in.dtype(), name, ": bad output dtype ",
             out.dtype(), " for input ", in.dtype());
  PointwiseIter it = make_pointwise_iter(out, {&in}, name);
  visit_unary(op, a, b, [&](auto f, auto types) {
    dispatch_op_types(types, in.dtype(), name, [&](auto tag) {
      using T = typename decltype(tag)::type;
      launch_pointwise<op_out_t<decltype(types), T>, T, 2>(it, out, f);
    });
  });
}
KILN_REGISTER_KERNEL(kernels::unary, CUDA, unary);

void binary(BinaryOp op, const Tensor& out, const Tensor& x, const Tensor& y, double alpha, double beta) {
  const char* name = op_name(op);
  KILN_CHECK(x.dtype() == y.dtype(), name, ": operands have different dtypes ", x.dtype(), " and ", y.dtype());
  KILN_CHECK(is_comparison(op) ? out.dtype() == DType::Bool : out.dtype() == x.dtype(), name, ": bad output dtype ",
             out.dtype(), " for inputs ", x.dtype());
  PointwiseIter it = make_pointwise_iter(out, {&x, &y}, name);
  visit_binary(op, alpha, beta, [&](auto f, auto types) {
    dispatch_op_types(types, x.dtype(), name, [&](auto tag) {
      using T = typename decltype(tag)::type;
      launch_pointwise<op_out_t<decltype(types), T>, T, 3>(it, out, f);
    });
  });
}
KILN_REGISTER_KERNEL(kernels::binary, CUDA, binary);

namespace {
struct SelectTag {  // unused functor slot for the ternary where kernel
  template <class T> __host__ __device__ T operator()(T x) const { return x; }
};

template <class O, class I> struct CastOp {
  __host__ __device__ O operator()(opmath_t<I> v) const {
    if constexpr (std::is_same_v<O, bool>) return v != opmath_t<I>(0);
    else if constexpr (std::is_same_v<O, Half> || std::is_same_v<O, BFloat16>) return O(static_cast<float>(v));
    else return static_cast<O>(v);
  }
};

template <class T> struct FillOp {
  T value;
  __device__ T operator()(opmath_t<T>) const { return value; }
};
}  // namespace

void where(const Tensor& out, const Tensor& cond, const Tensor& x, const Tensor& y) {
  KILN_CHECK(cond.dtype() == DType::Bool && x.dtype() == y.dtype() && out.dtype() == x.dtype(), "where: bad dtypes");
  PointwiseIter it = make_pointwise_iter(out, {&cond, &x, &y}, "where");
  dispatch_all(x.dtype(), "where", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_pointwise<T, T, 4>(it, out, SelectTag{});
  });
}
KILN_REGISTER_KERNEL(kernels::where, CUDA, where);

void copy(const Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;
  PointwiseIter it = make_pointwise_iter(dst, {&src}, "copy_");
  if (dst.dtype() == src.dtype() && it.is_flat_contiguous()) {
    DeviceGuard g(dst);
    KILN_CUDA_CHECK(cudaMemcpyAsync(it.data[0], it.data[1], dst.nbytes(), cudaMemcpyDeviceToDevice, stream_for(dst)));
    return;
  }
  dispatch_all(dst.dtype(), "copy_", [&](auto out_tag) {
    using O = typename decltype(out_tag)::type;
    dispatch_all(src.dtype(), "copy_", [&](auto in_tag) {
      using I = typename decltype(in_tag)::type;
      launch_pointwise<O, I, 2>(it, dst, CastOp<O, I>{});
    });
  });
}
KILN_REGISTER_KERNEL(kernels::copy_within_device, CUDA, copy);

void fill(const Tensor& dst, double value) {
  if (dst.numel() == 0) return;
  PointwiseIter it = make_pointwise_iter(dst, {&dst}, "fill_");
  dispatch_all(dst.dtype(), "fill_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T v;
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) v = T(static_cast<float>(value));
    else v = static_cast<T>(value);
    launch_pointwise<T, T, 2>(it, dst, FillOp<T>{v});
  });
}
KILN_REGISTER_KERNEL(kernels::fill, CUDA, fill);

// ---------------------------------------------------------------- Philox random fills
// Element i (row-major over dst's logical shape) reads block (seed, offset + i): the same
// numbers as the CPU backend, bit for bit (tested in the GPU binary).

namespace {
enum class Dist { Uniform, Normal, RandInt };

template <class T>
__global__ void random_kernel(T* out, int64_t n, uint64_t seed, uint64_t offset, Dist dist, int64_t low,
                              uint64_t range) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint64_t ui = static_cast<uint64_t>(i);
    if (dist == Dist::Uniform) {
      if constexpr (std::is_same_v<T, double>) out[i] = philox::uniform_d(seed, offset, ui);
      else out[i] = T(philox::uniform_f(seed, offset, ui));
    } else if (dist == Dist::Normal) {
      double z = philox::normal_d(seed, offset, ui);
      if constexpr (std::is_same_v<T, double>) out[i] = z;
      else out[i] = T(static_cast<float>(z));
    } else {
      philox::U32x4 b = philox::element_block(seed, offset, ui);
      uint64_t r = ((static_cast<uint64_t>(b.v[0]) << 32) | b.v[1]) % range;
      int64_t v = low + static_cast<int64_t>(r);
      if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) out[i] = T(static_cast<float>(v));
      else out[i] = static_cast<T>(v);
    }
  }
}

void fill_random(const Tensor& dst, const char* name, Dist dist, uint64_t seed, uint64_t offset, int64_t low = 0,
                 uint64_t range = 1) {
  if (dst.numel() == 0) return;
  Tensor target = dst.is_contiguous() ? dst : empty(dst.sizes(), dst.options());
  DeviceGuard g(target);
  dispatch_numeric(target.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    random_kernel<T><<<grid_for(target.numel()), kThreads, 0, stream_for(target)>>>(
        static_cast<T*>(target.data_ptr()), target.numel(), seed, offset, dist, low, range);
    KILN_CUDA_CHECK_LAUNCH("random_kernel");
  });
  if (!target.is_same(dst)) copy(dst, target);
}
}  // namespace

void fill_uniform(const Tensor& dst, uint64_t seed, uint64_t offset) {
  fill_random(dst, "rand", Dist::Uniform, seed, offset);
}
KILN_REGISTER_KERNEL(kernels::fill_uniform, CUDA, fill_uniform);
void fill_normal(const Tensor& dst, uint64_t seed, uint64_t offset) {
  fill_random(dst, "randn", Dist::Normal, seed, offset);
}
KILN_REGISTER_KERNEL(kernels::fill_normal, CUDA, fill_normal);
void fill_randint(const Tensor& dst, int64_t low, int64_t high, uint64_t seed, uint64_t offset) {
  fill_random(dst, "randint", Dist::RandInt, seed, offset, low, static_cast<uint64_t>(high - low));
}
KILN_REGISTER_KERNEL(kernels::fill_randint, CUDA, fill_randint);

}  // namespace kiln::kernels::cuda
