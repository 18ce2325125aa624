// CUDA scans and stable sorts along one dimension (contract: kiln/kernels/sort_scan.h; the CPU
// version is kernels/cpu/sort_scan.cpp). Both move `dim` last (kernels/reduce_layout.h), so each
// row is contiguous. These are simple, correct kernels, not fast ones (docs/kernels.md, "Scans
// and sorts"):
//   scan:    one thread per row walks it in order (accumulating in double / int64 like the CPU);
//   argsort: one block per row; each thread takes elements i and computes their rank directly,
//            rank(i) = #{j : x_j sorts before x_i, or x_j ties x_i and j < i}, which is the stable
//            order, and writes indices[rank] = i. O(n^2 / threads) per row, any row length, no
//            shared memory.
#include <type_traits>

#include "kiln/kernels/cuda/launch.cuh"
#include "kiln/kernels/sort_scan.h"

namespace kiln::kernels::cuda {

namespace {

template <class T, class A>
__global__ void scan_kernel(const T* in, T* out, int64_t rows, int64_t n, bool prod, bool reverse) {
  using M = opmath_t<T>;
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < rows;
       r += int64_t(gridDim.x) * blockDim.x) {
    const T* x = in + r * n;
    T* y = out + r * n;
    A acc = prod ? A(1) : A(0);
    for (int64_t k = 0; k < n; ++k) {
      const int64_t i = reverse ? n - 1 - k : k;
      const A v = static_cast<A>(static_cast<M>(x[i]));
      acc = prod ? acc * v : acc + v;
      y[i] = static_cast<T>(static_cast<M>(acc));
    }
  }
}

// a sorts strictly before b; NaN is the largest value.
template <class M>
__device__ __forceinline__ bool sorts_before(M a, M b, bool descending) {
  if (descending) return (a != a && b == b) || a > b;
  return (b != b && a == a) || a < b;
}

template <class T>
__global__ void argsort_kernel(const T* in, int64_t* indices, int64_t rows, int64_t n, bool descending) {
  using M = opmath_t<T>;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* x = in + r * n;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const M xi = static_cast<M>(x[i]);
      int64_t rank = 0;
      for (int64_t j = 0; j < n; ++j) {
        const M xj = static_cast<M>(x[j]);
        rank += sorts_before(xj, xi, descending) || (j < i && !sorts_before(xi, xj, descending));
      }
      indices[r * n + rank] = i;
    }
  }
}

}  // namespace

void scan(ScanOp op, const Tensor& out, const Tensor& in, int64_t dim, bool reverse) {
  KILN_CHECK(out.dtype() == in.dtype() && out.sizes() == in.sizes() && out.is_contiguous(),
             "scan: bad output");
  if (in.numel() == 0) return;
  const RowsAlongDim layout(out, in, dim);
  const Tensor& src = layout.src;
  const Tensor& dst = layout.dst;
  const int64_t n = layout.n, rows = layout.rows;
  DeviceGuard g(in);
  dispatch_numeric(in.dtype(), op == ScanOp::Sum ? "cumsum" : "cumprod", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = std::conditional_t<std::is_floating_point_v<opmath_t<T>>, double, int64_t>;
    scan_kernel<T, A><<<grid_for(rows), kThreads, 0, stream_for(in)>>>(
        static_cast<const T*>(src.data_ptr()), static_cast<T*>(dst.data_ptr()), rows, n,
        op == ScanOp::Prod, reverse);
    KILN_CUDA_CHECK_LAUNCH("scan_kernel");
  });
  layout.finish();
}
KILN_REGISTER_KERNEL(kernels::scan, CUDA, scan);

void argsort(const Tensor& indices, const Tensor& in, int64_t dim, bool descending) {
  KILN_CHECK(indices.dtype() == DType::I64 && indices.sizes() == in.sizes() && indices.is_contiguous(),
             "sort: bad indices output");
  if (in.numel() == 0) return;
  const RowsAlongDim layout(indices, in, dim);
  const Tensor& src = layout.src;
  const Tensor& dst = layout.dst;
  const int64_t n = layout.n, rows = layout.rows;
  DeviceGuard g(in);
  dispatch_all(in.dtype(), "sort", [&](auto tag) {
    using T = typename decltype(tag)::type;
    argsort_kernel<T><<<static_cast<unsigned>(std::min<int64_t>(rows, 65535)), kThreads, 0, stream_for(in)>>>(
        static_cast<const T*>(src.data_ptr()), static_cast<int64_t*>(dst.data_ptr()), rows, n, descending);
    KILN_CUDA_CHECK_LAUNCH("argsort_kernel");
  });
  layout.finish();
}
KILN_REGISTER_KERNEL(kernels::argsort, CUDA, argsort);

}  // namespace kiln::kernels::cuda
