#pragma once
// Scans (cumsum, cumprod) and sorting along one dimension. CPU: kernels/cpu/sort_scan.cpp; CUDA:
// kernels/cuda/sort_scan.cu. Both move `dim` last (kernels/reduce_layout.h) and work on rows.
// No autograd (kiln/ops/sort_scan.cpp records the backward).
#include <cstdint>

#include "kiln/core/tensor.h"
#include "kiln/kernels/dispatch.h"

namespace kiln::kernels {

enum class ScanOp : uint8_t { Sum, Prod };

// out = inclusive scan of `in` along dim (reverse: from the end, out[i] = sum/prod of in[i:]).
// out: contiguous, in's sizes and dtype (numeric). Accumulates in double for floating dtypes,
// int64 for integers.
inline Kernel<void(ScanOp op, const Tensor& out, const Tensor& in, int64_t dim, bool reverse)> scan{
    "scan"};

// indices (int64, contiguous, in's sizes) = the stable sorting permutation of each row of `in`
// along dim, ascending or descending; NaN compares as larger than every number (so it comes last
// ascending, first descending), as in PyTorch.
inline Kernel<void(const Tensor& indices, const Tensor& in, int64_t dim, bool descending)> argsort{
    "sort"};

}  // namespace kiln::kernels
