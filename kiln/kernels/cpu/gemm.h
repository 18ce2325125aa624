#pragma once
// The CPU GEMM under the convolution and matmul kernels: C = A B, or C += A B.
//
// Operands are strided views, so a transposed operand is the same memory with its strides
// swapped and costs no copy. f32 runs kiln's own packed kernel at the AVX2 and AVX-512 levels
// (docs/kernels.md, "The CPU GEMM", says how it is blocked and why); f64, and f32 at the
// baseline level, run Eigen's GEMM. Both give results equal to a plain triple loop up to rounding
// (summation order differs).
#include <cstdint>
#include <vector>

#include "kiln/kernels/dispatch.h"

namespace kiln::kernels::cpu {

// Element (i, j) of a rows x cols matrix is p[i * rs + j * cs].
template <class T> struct MatrixView {
  T* p = nullptr;
  int64_t rows = 0, cols = 0;
  int64_t rs = 0, cs = 1;

  MatrixView<T> t() const { return {p, cols, rows, cs, rs}; }
  operator MatrixView<const T>() const { return {p, rows, cols, rs, cs}; }
};

// A row-major rows x cols matrix with leading dimension ld (>= cols).
template <class T> MatrixView<T> row_major(T* p, int64_t rows, int64_t cols, int64_t ld) {
  return {p, rows, cols, ld, 1};
}

// C (rows M, cols N) = A (M x K) B (K x N), plus C's old values when accumulate. C must have a
// unit stride in one dimension; A and B may have any strides. threads: how many OpenMP threads
// may share this one product; 0 means "all of them, unless already inside a parallel region".
void gemm(MatrixView<const float> a, MatrixView<const float> b, MatrixView<float> c, bool accumulate, int threads = 0);
void gemm(MatrixView<const double> a, MatrixView<const double> b, MatrixView<double> c, bool accumulate,
          int threads = 0);

// The left operand of many products, packed once: a convolution's weight against each block of
// patches would otherwise be packed again for every block. f32 with kiln's own kernel stores the
// panels the kernel reads (M rounded up to its tile, times K floats); f64, and f32 at the
// baseline level, keep the view and pack per product as before. The view's memory must outlive it.
template <class T> class PackedLhs {
 public:
  explicit PackedLhs(MatrixView<const T> a) : a_(a) {}
  MatrixView<const T> view() const { return a_; }

 private:
  MatrixView<const T> a_;
};
template <> class PackedLhs<float> {
 public:
  explicit PackedLhs(MatrixView<const float> a);
  MatrixView<const float> view() const { return a_; }
  const float* panels() const { return panels_.empty() ? nullptr : panels_.data(); }
  int tile_rows() const { return tile_rows_; }  // the micro-tile's height the panels are for

 private:
  MatrixView<const float> a_;
  std::vector<float> panels_;
  int tile_rows_ = 0;
};

// C = A B, plus C's old values when accumulate, with A packed (used when C is row-major).
void gemm(const PackedLhs<float>& a, MatrixView<const float> b, MatrixView<float> c, bool accumulate, int threads = 0);
void gemm(const PackedLhs<double>& a, MatrixView<const double> b, MatrixView<double> c, bool accumulate,
          int threads = 0);

// Whether f32 products run kiln's own kernel (false: Eigen's), for benchmarks and docs.
bool gemm_uses_own_kernel();

// The f32 GEMM of the CPU level in use (kiln/core/cpu_isa.h), for callers outside
// kiln/kernels/cpu such as tests and benchmarks: gemm() above is each level's own copy, which the
// kernels call directly. Arguments: a, b, c, accumulate, threads, and whether A goes through
// PackedLhs. Call it with .on(Device::cpu(), ...).
inline Kernel<void(MatrixView<const float>, MatrixView<const float>, MatrixView<float>, bool, int, bool)>
    gemm_f32_in_use{"gemm"};

}  // namespace kiln::kernels::cpu
