// CPU scans and stable sorts along one dimension: rows (dim moved last) over OpenMP threads.
#include <algorithm>
#include <numeric>

#include "kiln/core/error.h"
#include "kiln/kernels/cpu/loops.h"
#include "kiln/kernels/sort_scan.h"

namespace kiln::kernels::cpu {

void scan(ScanOp op, const Tensor& out, const Tensor& in, int64_t dim, bool reverse) {
  check_scan_output(out, in);
  on_rows_along_dim(out, in, dim, [&](const Tensor& src, const Tensor& dst, int64_t rows, int64_t n) {
    dispatch_numeric(in.dtype(), op == ScanOp::Sum ? "cumsum" : "cumprod", [&](auto tag) {
      using T = typename decltype(tag)::type;
      for_each_contiguous_row(static_cast<const T*>(src.data_ptr()), static_cast<T*>(dst.data_ptr()), rows, n,
                              [&](const T* x, T* y) { scan_row(x, y, n, op == ScanOp::Prod, reverse); });
    });
  });
}
KILN_REGISTER_KERNEL(kernels::scan, CPU, scan);

void argsort(const Tensor& indices, const Tensor& in, int64_t dim, bool descending) {
  check_sort_indices(indices, in);
  on_rows_along_dim(indices, in, dim, [&](const Tensor& src, const Tensor& dst, int64_t rows, int64_t n) {
    dispatch_all(in.dtype(), "sort", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using M = opmath_t<T>;
      for_each_contiguous_row(static_cast<const T*>(src.data_ptr()), static_cast<int64_t*>(dst.data_ptr()), rows, n,
                              [&](const T* x, int64_t* ix) {
                                std::iota(ix, ix + n, int64_t(0));
                                std::stable_sort(ix, ix + n, [&](int64_t i, int64_t j) {
                                  return sorts_before(static_cast<M>(x[i]), static_cast<M>(x[j]), descending);
                                });
                              });
    });
  });
}
KILN_REGISTER_KERNEL(kernels::argsort, CPU, argsort);

}  // namespace kiln::kernels::cpu
