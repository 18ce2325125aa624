// The pointwise kernels of kernels/cuda/launch.cuh instantiated for the cases the code check
// (check_pointwise_code.cmake) reads in PTX: a binary op in f32 and bf16, a bf16 -> f32 cast,
// a unary op in f16, and the where kernel, through the contiguous vector path and the 32-bit
// strided path. Compiled to PTX only; nothing here runs.
#include "kiln/kernels/cuda/launch.cuh"
#include "kiln/kernels/math/pointwise.h"

namespace kiln::kernels::cuda {

namespace fn = kiln::math;

template __global__ void contiguous_vec_kernel<float, float, 2, fn::Add>(float*, const float*, const float*, int64_t,
                                                                         fn::Add);
template __global__ void contiguous_vec_kernel<BFloat16, BFloat16, 2, fn::Add>(BFloat16*, const BFloat16*,
                                                                               const BFloat16*, int64_t, fn::Add);
template __global__ void unary_vec_kernel<Half, fn::Relu>(Half*, const Half*, int64_t, fn::Relu);

struct CastToFloat {
  __device__ float operator()(float v) const { return v; }
};
template __global__ void contiguous_vec_kernel<float, BFloat16, 1, CastToFloat>(float*, const BFloat16*,
                                                                                const BFloat16*, int64_t, CastToFloat);

struct Select {
  __device__ float operator()(float v) const { return v; }
};
template __global__ void strided_kernel<float, float, 3, fn::Add>(OffsetCalc32<3>, OperandPointers<3>, uint32_t,
                                                                  fn::Add);
template __global__ void strided_kernel<BFloat16, BFloat16, 3, fn::Mul>(OffsetCalc32<3>, OperandPointers<3>, uint32_t,
                                                                        fn::Mul);
template __global__ void strided_kernel<float, float, 4, Select>(OffsetCalc32<4>, OperandPointers<4>, uint32_t, Select);

}  // namespace kiln::kernels::cuda
