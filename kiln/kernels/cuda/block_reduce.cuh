#pragma once
// Warp- and block-level reductions for the CUDA kernels (shuffles within a warp, shared memory
// across the block's warps). Every thread of the block gets the result.
#include <cuda_runtime.h>

namespace kiln::kernels::cuda {

template <class T, class Op> __device__ __forceinline__ T warp_reduce(T v, Op op) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// blockDim.x must be a multiple of 32 and at most 1024.
template <class T, class Op> __device__ T block_reduce(T v, Op op, T identity) {
  __shared__ T shared[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_reduce(v, op);
  __syncthreads();  // shared may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int nwarps = blockDim.x / 32;
  v = threadIdx.x < nwarps ? shared[threadIdx.x] : identity;
  if (warp == 0) v = warp_reduce(v, op);
  if (threadIdx.x == 0) shared[0] = v;
  __syncthreads();
  return shared[0];
}

struct SumOp {
  template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct ProdOp {
  template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return a * b; }
};
struct MaxOp {  // NaN wins, as in PyTorch
  template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return (a != a || a > b) ? a : b; }
};
struct MinOp {
  template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return (a != a || a < b) ? a : b; }
};

}  // namespace kiln::kernels::cuda
