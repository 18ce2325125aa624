// CPU scans and stable sorts along one dimension: rows (dim moved last) over OpenMP threads.
#include <algorithm>
#include <numeric>
#include <type_traits>

#include "kiln/core/error.h"
#include "kiln/kernels/cpu/loops.h"
#include "kiln/kernels/sort_scan.h"

namespace kiln::kernels::cpu {

void scan(ScanOp op, const Tensor& out, const Tensor& in, int64_t dim, bool reverse) {
  KILN_CHECK(out.dtype() == in.dtype() && out.sizes() == in.sizes() && out.is_contiguous(),
             "scan: bad output");
  if (in.numel() == 0) return;
  const RowsAlongDim layout(out, in, dim);
  const Tensor& src = layout.src;
  const Tensor& dst = layout.dst;
  const int64_t n = layout.n, rows = layout.rows;
  dispatch_numeric(in.dtype(), op == ScanOp::Sum ? "cumsum" : "cumprod", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = std::conditional_t<std::is_floating_point_v<opmath_t<T>>, double, int64_t>;
    const T* p = static_cast<const T*>(src.data_ptr());
    T* q = static_cast<T*>(dst.data_ptr());
#pragma omp parallel for schedule(static) if (src.numel() >= kParallelGrain)
    for (int64_t r = 0; r < rows; ++r) {
      const T* x = p + r * n;
      T* y = q + r * n;
      A acc = op == ScanOp::Sum ? A(0) : A(1);
      for (int64_t k = 0; k < n; ++k) {
        const int64_t i = reverse ? n - 1 - k : k;
        const A v = static_cast<A>(static_cast<opmath_t<T>>(x[i]));
        acc = op == ScanOp::Sum ? acc + v : acc * v;
        y[i] = static_cast<T>(static_cast<opmath_t<T>>(acc));
      }
    }
  });
  layout.finish();
}
KILN_REGISTER_KERNEL(kernels::scan, CPU, scan);

void argsort(const Tensor& indices, const Tensor& in, int64_t dim, bool descending) {
  KILN_CHECK(indices.dtype() == DType::I64 && indices.sizes() == in.sizes() && indices.is_contiguous(),
             "sort: bad indices output");
  if (in.numel() == 0) return;
  const RowsAlongDim layout(indices, in, dim);
  const Tensor& src = layout.src;
  const Tensor& dst = layout.dst;
  const int64_t n = layout.n, rows = layout.rows;
  dispatch_all(in.dtype(), "sort", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = opmath_t<T>;
    const T* p = static_cast<const T*>(src.data_ptr());
    int64_t* q = static_cast<int64_t*>(dst.data_ptr());
#pragma omp parallel for schedule(static) if (src.numel() >= kParallelGrain)
    for (int64_t r = 0; r < rows; ++r) {
      const T* x = p + r * n;
      int64_t* ix = q + r * n;
      std::iota(ix, ix + n, int64_t(0));
      // NaN is the largest value (a != a tests NaN; integers never are).
      auto less = [&](int64_t i, int64_t j) {
        const M a = static_cast<M>(x[i]), b = static_cast<M>(x[j]);
        if (descending) return (a != a && b == b) || a > b;
        return (b != b && a == a) || a < b;
      };
      std::stable_sort(ix, ix + n, less);
    }
  });
  layout.finish();
}
KILN_REGISTER_KERNEL(kernels::argsort, CPU, argsort);

}  // namespace kiln::kernels::cpu
