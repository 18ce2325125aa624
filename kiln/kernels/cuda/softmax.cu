// Softmax / log-softmax along the last dim of a contiguous tensor: one block per row, three
// passes over the row (max, sum of exp, write), math in opmath precision. The same formulas as
// the CPU kernel, including (x - max) - log(sum) for log-softmax.
#include "kiln/kernels/cuda/block_reduce.cuh"
#include "kiln/kernels/copy_fill.h"
#include "kiln/kernels/matmul.h"
#include "kiln/kernels/pointwise.h"
#include "kiln/kernels/reduce.h"
#include "kiln/kernels/softmax.h"
#include "kiln/kernels/cuda/launch.cuh"

namespace kiln::kernels::cuda {

namespace {

using ::exp;  // CUDA's float/double overloads, not kiln::exp(Tensor)

template <class T> __global__ void softmax_kernel(const T* in, T* out, int64_t rows, int64_t n, bool log) {
  using M = opmath_t<T>;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* x = in + r * n;
    T* y = out + r * n;
    M mx = -INFINITY;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) mx = MaxOp()(mx, static_cast<M>(x[i]));
    mx = block_reduce(mx, MaxOp(), M(-INFINITY));
    if (::isinf(mx) && mx < 0) mx = 0;  // a row of -inf
    M sum = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += exp(static_cast<M>(x[i]) - mx);
    sum = block_reduce(sum, SumOp(), M(0));
    if (log) {
      const M log_sum = ::log(sum);
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        y[i] = static_cast<T>((static_cast<M>(x[i]) - mx) - log_sum);
    } else {
      const M inv = M(1) / sum;
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) y[i] = static_cast<T>(exp(static_cast<M>(x[i]) - mx) * inv);
    }
  }
}

template <class T>
__global__ void softmax_backward_kernel(const T* g, const T* y, T* gi, int64_t rows, int64_t n, bool log) {
  using M = opmath_t<T>;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* gr = g + r * n;
    const T* yr = y + r * n;
    T* o = gi + r * n;
    M dot = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
      dot += log ? static_cast<M>(gr[i]) : static_cast<M>(gr[i]) * static_cast<M>(yr[i]);
    dot = block_reduce(dot, SumOp(), M(0));
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      M gv = static_cast<M>(gr[i]), yv = static_cast<M>(yr[i]);
      o[i] = static_cast<T>(log ? gv - exp(yv) * dot : yv * (gv - dot));
    }
  }
}

}  // namespace

void softmax(const Tensor& out, const Tensor& in, bool log) {
  KILN_CHECK(in.is_contiguous() && out.is_contiguous() && in.dtype() == out.dtype(),
             "softmax: expects contiguous operands of one dtype");
  if (in.numel() == 0) return;
  const int64_t n = in.dim() == 0 ? 1 : in.size(-1), rows = in.numel() / n;
  DeviceGuard g(in);
  dispatch_floating(in.dtype(), log ? "log_softmax" : "softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    softmax_kernel<T><<<static_cast<unsigned>(std::min<int64_t>(rows, 65535 * 4)), kThreads, 0, stream_for(in)>>>(
        static_cast<const T*>(in.data_ptr()), static_cast<T*>(out.data_ptr()), rows, n, log);
    KILN_CUDA_CHECK_LAUNCH("softmax_kernel");
  });
}
KILN_REGISTER_KERNEL(kernels::softmax, CUDA, softmax);

void softmax_backward(const Tensor& grad_in, const Tensor& grad_out, const Tensor& out, bool log) {
  KILN_CHECK(grad_in.is_contiguous() && grad_out.is_contiguous() && out.is_contiguous(),
             "softmax_backward: expects contiguous operands");
  if (out.numel() == 0) return;
  const int64_t n = out.dim() == 0 ? 1 : out.size(-1), rows = out.numel() / n;
  DeviceGuard g(out);
  dispatch_floating(out.dtype(), "softmax_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    softmax_backward_kernel<T>
        <<<static_cast<unsigned>(std::min<int64_t>(rows, 65535 * 4)), kThreads, 0, stream_for(out)>>>(
            static_cast<const T*>(grad_out.data_ptr()), static_cast<const T*>(out.data_ptr()),
            static_cast<T*>(grad_in.data_ptr()), rows, n, log);
    KILN_CUDA_CHECK_LAUNCH("softmax_backward_kernel");
  });
}
KILN_REGISTER_KERNEL(kernels::softmax_backward, CUDA, softmax_backward);

}  // namespace kiln::kernels::cuda
