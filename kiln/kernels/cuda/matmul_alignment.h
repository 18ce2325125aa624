#pragma once
// Pointer alignment as cuBLASLt's algorithm heuristic wants it (matmul_cublaslt.cpp). Plain host
// arithmetic, tested on the CPU.
#include <cstdint>

namespace kiln::kernels::cuda {

// The largest power of two <= 256 that divides `addr` and every `batch_stride_bytes` step from it
// (0: not batched): the alignment every matrix of a strided batch has. cuBLASLt assumes 256 unless
// told otherwise, which a view at an offset (a[1:]) does not have.
inline uint32_t operand_alignment(uintptr_t addr, uint64_t batch_stride_bytes = 0) {
  const uint64_t bits = static_cast<uint64_t>(addr) | batch_stride_bytes | 256u;
  return static_cast<uint32_t>(bits & (~bits + 1));  // lowest set bit
}

// cuBLASLt's epilogue reads the bias vector (and the GELU aux matrix) with vector loads; a pointer
// with less alignment makes it fail or pick no algorithm, so such calls take the fallback path.
constexpr uint32_t kEpilogueAlignment = 16;

}  // namespace kiln::kernels::cuda
