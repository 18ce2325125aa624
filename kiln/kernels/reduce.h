#pragma once
// Reductions over dimensions, and arg-max/arg-min along one. CPU: kernels/cpu/reduce.cpp; CUDA:
// kernels/cuda/reduce.cu (both lay the input out with kernels/reduce_layout.h). No autograd.
#include <cstdint>

#include "kiln/core/tensor.h"
#include "kiln/kernels/dispatch.h"

namespace kiln::kernels {

enum class ReduceOp : uint8_t { Sum, Mean, Max, Min, Prod };
inline const char* op_name(ReduceOp op) {
  static const char* names[] = {"sum", "mean", "max", "min", "prod"};
  return names[static_cast<int>(op)];
}

// Reduces `in` over `dims` into out (shape of in with dims set to 1 or removed, contiguous).
inline Kernel<void(ReduceOp op, const Tensor& out, const Tensor& in, const IntList& dims)> reduce{"reduce"};
// values and int64 indices of the max (is_max) or min along `dim`.
inline Kernel<void(bool is_max, const Tensor& values, const Tensor& indices, const Tensor& in, int64_t dim)> arg_reduce{
    "max/min"};

}  // namespace kiln::kernels
