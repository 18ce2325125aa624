// CUDA scans and stable sorts along one dimension (contract: kiln/kernels/sort_scan.h; the CPU
// version is kernels/cpu/sort_scan.cpp). Both move `dim` last (kernels/reduce_layout.h), so each
// row is contiguous. These are simple, correct kernels, not fast ones (docs/kernels.md, "Scans
// and sorts"):
//   scan:    one thread per row walks it in order (accumulating in double / int64 like the CPU);
//   argsort: one block per row; each thread takes elements i and computes their rank directly,
//            rank(i) = #{j : x_j sorts before x_i, or x_j ties x_i and j < i}, which is the stable
//            order, and writes indices[rank] = i. O(n^2 / threads) per row, any row length, no
//            shared memory.
#include "kiln/kernels/cuda/launch.cuh"
#include "kiln/kernels/sort_scan.h"

namespace kiln::kernels::cuda {

namespace {

template <class T> __global__ void scan_kernel(const T* in, T* out, int64_t rows, int64_t n, bool prod, bool reverse) {
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < rows; r += int64_t(gridDim.x) * blockDim.x)
    scan_row(in + r * n, out + r * n, n, prod, reverse);
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
  check_scan_output(out, in);
  DeviceGuard g(in);  // held until the rows are scattered back
  on_rows_along_dim(out, in, dim, [&](const Tensor& src, const Tensor& dst, int64_t rows, int64_t n) {
    dispatch_numeric(in.dtype(), op == ScanOp::Sum ? "cumsum" : "cumprod", [&](auto tag) {
      using T = typename decltype(tag)::type;
      scan_kernel<T><<<grid_for(rows), kThreads, 0, stream_for(in)>>>(
          static_cast<const T*>(src.data_ptr()), static_cast<T*>(dst.data_ptr()), rows, n, op == ScanOp::Prod, reverse);
      KILN_CUDA_CHECK_LAUNCH("scan_kernel");
    });
  });
}
KILN_REGISTER_KERNEL(kernels::scan, CUDA, scan);

void argsort(const Tensor& indices, const Tensor& in, int64_t dim, bool descending) {
  check_sort_indices(indices, in);
  DeviceGuard g(in);  // held until the rows are scattered back
  on_rows_along_dim(indices, in, dim, [&](const Tensor& src, const Tensor& dst, int64_t rows, int64_t n) {
    dispatch_all(in.dtype(), "sort", [&](auto tag) {
      using T = typename decltype(tag)::type;
      argsort_kernel<T><<<static_cast<unsigned>(std::min<int64_t>(rows, 65535)), kThreads, 0, stream_for(in)>>>(
          static_cast<const T*>(src.data_ptr()), static_cast<int64_t*>(dst.data_ptr()), rows, n, descending);
      KILN_CUDA_CHECK_LAUNCH("argsort_kernel");
    });
  });
}
KILN_REGISTER_KERNEL(kernels::argsort, CUDA, argsort);

}  // namespace kiln::kernels::cuda
