#pragma once
// The CPU GEMM under the convolution and matmul kernels: C = A B, or C += A B.
//
// Operands are strided views, so a transposed operand is the same memory with its strides
// swapped and costs no copy. f32 runs kiln's own packed AVX-512 kernel where the build targets
// AVX-512 (docs/kernels.md, "The CPU GEMM", says how it is blocked and why); f64, and f32 on
// other instruction sets, run Eigen's GEMM. Both give results equal to a plain triple loop up to rounding
// (summation order differs).
#include <cstdint>

namespace kiln::kernels::cpu {

// Element (i, j) of a rows x cols matrix is p[i * rs + j * cs].
template <class T>
struct MatrixView {
  T* p = nullptr;
  int64_t rows = 0, cols = 0;
  int64_t rs = 0, cs = 1;

  MatrixView<T> t() const { return {p, cols, rows, cs, rs}; }
  operator MatrixView<const T>() const { return {p, rows, cols, rs, cs}; }
};

// A row-major rows x cols matrix with leading dimension ld (>= cols).
template <class T>
MatrixView<T> row_major(T* p, int64_t rows, int64_t cols, int64_t ld) {
  return {p, rows, cols, ld, 1};
}

// C (rows M, cols N) = A (M x K) B (K x N), plus C's old values when accumulate. C must have a
// unit stride in one dimension; A and B may have any strides. threads: how many OpenMP threads
// may share this one product; 0 means "all of them, unless already inside a parallel region".
void gemm(MatrixView<const float> a, MatrixView<const float> b, MatrixView<float> c,
          bool accumulate, int threads = 0);
void gemm(MatrixView<const double> a, MatrixView<const double> b, MatrixView<double> c,
          bool accumulate, int threads = 0);

// Whether f32 products run kiln's own kernel (false: Eigen's), for benchmarks and docs.
bool gemm_uses_own_kernel();

}  // namespace kiln::kernels::cpu
