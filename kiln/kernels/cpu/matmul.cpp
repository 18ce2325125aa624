// CPU matrix multiply: f32 and f64 through the CPU GEMM (kernels/cpu/gemm.h), integers through
// Eigen's GEMM (multi-threaded with OpenMP). Operands are used in
// place whenever one of their strides is 1 (row- or column-major, any leading dimension), so
// transposed views cost no copy. 16-bit inputs are widened to f32 first.
#include <Eigen/Core>
#include <type_traits>
#include <omp.h>

#include "kiln/kernels/copy_fill.h"
#include "kiln/kernels/cpu/gemm.h"
#include "kiln/kernels/matmul.h"
#include "kiln/kernels/pointwise.h"
#include "kiln/kernels/reduce.h"
#include "kiln/kernels/softmax.h"

namespace kiln::kernels::cpu {

namespace {

using Eigen::Dynamic;
using Eigen::OuterStride;
template <class T> using RowMat = Eigen::Matrix<T, Dynamic, Dynamic, Eigen::RowMajor>;
template <class T> using ColMat = Eigen::Matrix<T, Dynamic, Dynamic, Eigen::ColMajor>;
template <class T> using RowMap = Eigen::Map<const RowMat<T>, 0, OuterStride<>>;
template <class T> using ColMap = Eigen::Map<const ColMat<T>, 0, OuterStride<>>;

// A 2-D operand as Eigen sees it: row-major if its column stride is 1, column-major if its row
// stride is 1. Either way no copy.
template <class T, class F> void with_matrix(const T* p, int64_t rows, int64_t cols, int64_t rs, int64_t cs, F&& f) {
  if ((cs == 1 || cols == 1) && rs >= std::max<int64_t>(cols, 1)) {
    f(RowMap<T>(p, rows, cols, OuterStride<>(rs)));
  } else {  // mappable() guaranteed (rs == 1 || rows == 1) && cs >= rows
    f(ColMap<T>(p, rows, cols, OuterStride<>(cs)));
  }
}

// Makes each matrix in a (batched) operand have a unit stride in one of its last two dims.
Tensor mappable(const Tensor& t) {
  int64_t n = t.dim();
  int64_t rs = t.stride(n - 2), cs = t.stride(n - 1);
  int64_t rows = t.size(n - 2), cols = t.size(n - 1);
  bool row_major = (cs == 1 || cols == 1) && rs >= std::max<int64_t>(cols, 1);
  bool col_major = (rs == 1 || rows == 1) && cs >= std::max<int64_t>(rows, 1);
  if (row_major || col_major) return t;
  return contiguous(t);
}

template <class T> void gemm_batched(const Tensor& c, const Tensor& a, const Tensor& b) {
  const bool batched = c.dim() == 3;
  const int64_t B = batched ? c.size(0) : 1;
  const int64_t M = c.size(-2), N = c.size(-1), K = a.size(-1);
  const T* ap = static_cast<const T*>(a.data_ptr());
  const T* bp = static_cast<const T*>(b.data_ptr());
  T* cp = static_cast<T*>(c.data_ptr());
  const int64_t ars = a.stride(-2), acs = a.stride(-1);
  const int64_t brs = b.stride(-2), bcs = b.stride(-1);
  const int64_t abs_ = batched ? a.stride(0) : 0, bbs = batched ? b.stride(0) : 0;
  auto one = [&](int64_t i) {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      // f32/f64: the CPU GEMM (kiln's own packed kernel for f32 at the AVX2 and AVX-512 levels,
      // Eigen's at the baseline level and for f64); it splits a product among threads itself
      // unless it runs inside the batch loop below
      gemm(MatrixView<const T>{ap + i * abs_, M, K, ars, acs}, MatrixView<const T>{bp + i * bbs, K, N, brs, bcs},
           row_major(cp + i * M * N, M, N, N), false);
      return;
    }
    Eigen::Map<RowMat<T>> C(cp + i * M * N, M, N);
    with_matrix(ap + i * abs_, M, K, ars, acs, [&](const auto& A) {
      with_matrix(bp + i * bbs, K, N, brs, bcs, [&](const auto& Bm) { C.noalias() = A * Bm; });
    });
  };
  // Many small matrices: one per thread (the GEMM then runs single-threaded inside).
  if (B > 1 && M * N * K < (1 << 18)) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < B; ++i) one(i);
  } else {
    for (int64_t i = 0; i < B; ++i) one(i);
  }
}

}  // namespace

void matmul(const Tensor& c, const Tensor& a_in, const Tensor& b_in) {
  KILN_CHECK(c.is_contiguous(), "matmul: output must be contiguous");
  KILN_CHECK(a_in.dtype() == b_in.dtype() && c.dtype() == a_in.dtype(), "matmul: dtype mismatch: ", a_in.dtype(), " @ ",
             b_in.dtype(), " -> ", c.dtype());
  if (c.numel() == 0) return;
  if (a_in.size(-1) == 0) {
    fill(c, 0.0);
    return;
  }
  const DType dt = a_in.dtype();
  if (dt == DType::F16 || dt == DType::BF16) {
    Tensor a = to_dtype(a_in, DType::F32), b = to_dtype(b_in, DType::F32);
    Tensor c32 = empty(c.sizes(), TensorOptions().dtype(DType::F32));
    gemm_batched<float>(c32, mappable(a), mappable(b));
    copy(c, c32);
    return;
  }
  Tensor a = mappable(a_in), b = mappable(b_in);
  switch (dt) {
    case DType::F32: return gemm_batched<float>(c, a, b);
    case DType::F64: return gemm_batched<double>(c, a, b);
    case DType::I64: return gemm_batched<int64_t>(c, a, b);
    case DType::I32: return gemm_batched<int32_t>(c, a, b);
    default: KILN_FAIL("matmul: dtype ", dt, " is not supported");
  }
}
KILN_REGISTER_KERNEL(kernels::matmul, CPU, matmul);

}  // namespace kiln::kernels::cpu
