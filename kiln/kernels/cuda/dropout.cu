// Dropout and leaky ReLU on the GPU (contracts in kiln/kernels/dropout.h and activation.h).
//
// Dropout: out[i] = u_i >= p ? in[i] / (1 - p) : 0 with u_i = philox::dropout_uniform(seed,
// offset, i): a grid-stride thread per four elements, which share one Philox block (word i % 4 of
// block offset + i / 4). The mapping is the CPU kernel's (kiln/kernels/cpu/dropout.cpp), so the
// mask is bit-identical across backends, and the backward (this kernel on the gradient with the
// same seed and offset) regenerates it instead of reading a stored mask. A block per element made
// the kernel integer-bound rather than memory-bound on an H100; a block per four elements is a
// quarter of those rounds.
//
// Leaky ReLU: the pointwise launcher of launch.cuh (16-byte vector loads for the forward) with the
// functors below; y = x > 0 ? x : slope * x and dx = g * (x > 0 ? 1 : slope), the same formulas
// as the CPU kernel (kiln/kernels/cpu/activation.cpp), in opmath precision.
#include "kiln/core/macros.h"
#include "kiln/core/philox.h"
#include "kiln/kernels/cuda/launch.cuh"
#include "kiln/kernels/dropout.h"
#include "kiln/kernels/activation.h"

namespace kiln::kernels::cuda {

namespace {

template <class T>
__global__ void dropout_kernel(T* __restrict__ out, const T* __restrict__ in, int64_t n, float p, opmath_t<T> scale,
                               uint64_t seed, uint64_t offset) {
  using O = opmath_t<T>;
  const int64_t quads = (n + 3) / 4;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < quads; q += stride) {
    const philox::U32x4 b = philox::block(seed, offset + static_cast<uint64_t>(q));
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const int64_t i = 4 * q + w;
      if (i < n) out[i] = static_cast<T>(philox::to_unit_float(b.v[w]) >= p ? static_cast<O>(in[i]) * scale : O(0));
    }
  }
}

// y = f(x) and dx = g * f'(x) for leaky ReLU, on the opmath type O.
template <class O> struct LeakyReluFn {
  O slope;
  KILN_INLINE O operator()(O x) const { return x > O(0) ? x : x * slope; }
};
template <class O> struct LeakyReluGradFn {
  O slope;
  KILN_INLINE O operator()(O g, O x) const { return x > O(0) ? g : g * slope; }
};

void check_same(const char* op, const Tensor& ref, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) {
    KILN_CHECK(t->defined() && t->device().is_cuda() && t->is_contiguous() && t->dtype() == ref.dtype() &&
                   t->numel() == ref.numel(),
               op, ": kernel expects defined contiguous CUDA operands of one dtype and size, got sizes ",
               t->defined() ? t->sizes() : IntList{}, " and ", ref.sizes());
  }
}

}  // namespace

void dropout(const Tensor& out, const Tensor& in, double p, uint64_t seed, uint64_t offset) {
  check_same("dropout", in, {&in, &out});
  KILN_CHECK(p >= 0.0 && p < 1.0, "dropout: kernel expects 0 <= p < 1, got ", p);
  const int64_t n = in.numel();
  if (n == 0) return;
  DeviceGuard guard(in);
  dispatch_floating(in.dtype(), "dropout", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using O = opmath_t<T>;
    const O scale = static_cast<O>(1.0 / (1.0 - p));
    dropout_kernel<T><<<grid_for(n, 4), kThreads, 0, stream_for(in)>>>(static_cast<T*>(out.data_ptr()),
                                                                       static_cast<const T*>(in.data_ptr()), n,
                                                                       static_cast<float>(p), scale, seed, offset);
    KILN_CUDA_CHECK_LAUNCH("dropout_kernel");
  });
}
KILN_REGISTER_KERNEL(kernels::dropout, CUDA, dropout);

void leaky_relu(const Tensor& y, const Tensor& x, double slope) {
  check_same("leaky_relu", x, {&x, &y});
  if (x.numel() == 0) return;
  PointwiseIter it = make_pointwise_iter(y, {&x}, "leaky_relu");
  dispatch_floating(x.dtype(), "leaky_relu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using O = opmath_t<T>;
    launch_pointwise<T, T, 2>(it, y, LeakyReluFn<O>{static_cast<O>(slope)});
  });
}
KILN_REGISTER_KERNEL(kernels::leaky_relu, CUDA, leaky_relu);

void leaky_relu_backward(const Tensor& dx, const Tensor& g, const Tensor& x, double slope) {
  check_same("leaky_relu_backward", x, {&x, &g, &dx});
  if (x.numel() == 0) return;
  PointwiseIter it = make_pointwise_iter(dx, {&g, &x}, "leaky_relu_backward");
  dispatch_floating(x.dtype(), "leaky_relu_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using O = opmath_t<T>;
    launch_pointwise<T, T, 3>(it, dx, LeakyReluGradFn<O>{static_cast<O>(slope)});
  });
}
KILN_REGISTER_KERNEL(kernels::leaky_relu_backward, CUDA, leaky_relu_backward);

}  // namespace kiln::kernels::cuda
