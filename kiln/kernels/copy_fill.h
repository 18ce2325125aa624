#pragma once
// Copies between layouts, dtypes and devices, constant fills and the Philox random fills.
// CPU: kernels/cpu/pointwise.cpp; CUDA: kernels/cuda/pointwise.cu. No autograd.
#include <cstdint>

#include "kiln/core/tensor.h"
#include "kiln/kernels/dispatch.h"

namespace kiln::kernels {

// dst = src (broadcast), converting dtype; both may be strided and on different devices. Routed
// by kernels/copy_fill.cpp: a host<->device or device<->device transfer when the devices differ,
// the backend's strided copy (`copy_within_device`) otherwise.
void copy(const Tensor& dst, const Tensor& src, bool non_blocking = false);
// A contiguous copy of `t` (or `t` itself when already contiguous), without autograd: for
// kernels that need dense operands.
Tensor contiguous(const Tensor& t);
// `t` converted to `dtype` (or `t` itself when it has it), without autograd.
Tensor to_dtype(const Tensor& t, DType dtype);
// The same-device strided copy with dtype conversion and broadcasting that copy() ends in.
inline Kernel<void(const Tensor& dst, const Tensor& src)> copy_within_device{"copy_"};

inline Kernel<void(const Tensor& dst, double value)> fill{"fill_"};
// Philox random numbers from (seed, offset): uniform [0, 1), standard normal, or integers in
// [low, high). Element i uses counter block offset + i, the same on every backend.
inline Kernel<void(const Tensor& dst, uint64_t seed, uint64_t offset)> fill_uniform{"rand"};
inline Kernel<void(const Tensor& dst, uint64_t seed, uint64_t offset)> fill_normal{"randn"};
inline Kernel<void(const Tensor& dst, int64_t low, int64_t high, uint64_t seed, uint64_t offset)> fill_randint{
    "randint"};

}  // namespace kiln::kernels
