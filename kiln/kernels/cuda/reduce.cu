// CUDA reductions. The input is arranged as rows [K, R] (reduced dims last, copied contiguous
// only when needed) and each row is reduced by one or more blocks: with few long rows (a full
// reduction), P blocks per row write partials that a second launch reduces, so every SM works.
// When only the leading dims of a contiguous tensor are reduced (and K >= 32), a column kernel
// reads [R, K] in place, a warp on 32 neighbouring columns (coalesced), with the rows split into
// chunks over the GPU when the columns alone would not fill it.
// Accumulation: float for f32/f16/bf16, double for f64, int64 for integers.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>

#include "kiln/kernels/cuda/block_reduce.cuh"
#include "kiln/kernels/copy_fill.h"
#include "kiln/kernels/matmul.h"
#include "kiln/kernels/pointwise.h"
#include "kiln/kernels/reduce.h"
#include "kiln/kernels/softmax.h"
#include "kiln/kernels/cuda/launch.cuh"
#include "kiln/kernels/cuda/launch_limits.h"
#include "kiln/kernels/reduce_layout.h"

namespace kiln::kernels::cuda {

namespace {

template <class T>
using acc_type = std::conditional_t<std::is_same_v<T, double>, double,
                                    std::conditional_t<std::is_floating_point_v<opmath_t<T>>, float, int64_t>>;

template <class A> __host__ __device__ A identity_of(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Mean: return A(0);
    case ReduceOp::Prod: return A(1);
    case ReduceOp::Max:
      if constexpr (std::is_floating_point_v<A>) return -INFINITY;
      else return std::numeric_limits<A>::lowest();
    case ReduceOp::Min:
      if constexpr (std::is_floating_point_v<A>) return INFINITY;
      else return std::numeric_limits<A>::max();
  }
  return A(0);
}

template <class A> __device__ __forceinline__ A combine(ReduceOp op, A a, A b) {
  switch (op) {
    case ReduceOp::Prod: return ProdOp()(a, b);
    case ReduceOp::Max: return MaxOp()(a, b);
    case ReduceOp::Min: return MinOp()(a, b);
    default: return SumOp()(a, b);
  }
}

template <class A> __device__ A block_combine(ReduceOp op, A v) {
  switch (op) {
    case ReduceOp::Prod: return block_reduce(v, ProdOp(), A(1));
    case ReduceOp::Max: return block_reduce(v, MaxOp(), identity_of<A>(ReduceOp::Max));
    case ReduceOp::Min: return block_reduce(v, MinOp(), identity_of<A>(ReduceOp::Min));
    default: return block_reduce(v, SumOp(), A(0));
  }
}

// Rows of length R; gridDim = (P, min(K, 65535)): block (p, y) reduces slice p of rows y,
// y + gridDim.y, ... (gridDim.y is capped, so more rows than that take several turns).
// final_pass: write Out (dividing by `count` for Mean); otherwise write A partials.
template <class In, class A, class Out>
__global__ void row_reduce_kernel(const In* in, Out* out, int64_t K, int64_t R, ReduceOp op, bool final_pass,
                                  int64_t count) {
  const int64_t P = gridDim.x, p = blockIdx.x;
  const int64_t per = (R + P - 1) / P, begin = p * per, end = min(R, begin + per);
  for (int64_t k = blockIdx.y; k < K; k += gridDim.y) {  // uniform across the block
    const In* row = in + k * R;
    A acc = identity_of<A>(op);
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
      acc = combine(op, acc, static_cast<A>(static_cast<opmath_t<In>>(row[i])));
    acc = block_combine(op, acc);
    if (threadIdx.x == 0) {
      if (final_pass) {
        if (op == ReduceOp::Mean) acc = static_cast<A>(static_cast<double>(acc) / static_cast<double>(count));
        out[k * P + p] = static_cast<Out>(static_cast<opmath_t<Out>>(acc));
      } else {
        reinterpret_cast<A*>(out)[k * P + p] = acc;
      }
    }
  }
}

// Leading dims reduced: the input is [R, K] row-major. A block of 32 x 8 threads takes 32
// consecutive columns (a warp reads 32 neighbours of one row: coalesced) and a chunk of rows
// (blockIdx.y), its 8 rows of threads striding through the chunk; the 8 partials of a column meet
// in shared memory. With several chunks (few columns, many rows: blocks for every SM) each writes
// A partials [chunks, K] that a second launch reduces the same way (final_pass). One thread per
// column over all R rows, as before, left most SMs idle: 35 GB/s for [65536, 1024] on an H200.
constexpr int kColTile = 32, kColRows = 8;

template <class In, class A, class Out>
__global__ void column_reduce_kernel(const In* in, Out* out, int64_t R, int64_t K, ReduceOp op, int64_t rows_per_chunk,
                                     bool final_pass, int64_t count) {
  __shared__ A part[kColRows][kColTile + 1];
  const int64_t k = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = min(R, r0 + rows_per_chunk);
  A acc = identity_of<A>(op);
  if (k < K)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColRows)
      acc = combine(op, acc, static_cast<A>(static_cast<opmath_t<In>>(in[r * K + k])));
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || k >= K) return;
  for (int y = 1; y < kColRows; ++y) acc = combine(op, acc, part[y][threadIdx.x]);
  if (!final_pass) {
    reinterpret_cast<A*>(out)[static_cast<int64_t>(blockIdx.y) * K + k] = acc;
    return;
  }
  if (op == ReduceOp::Mean) acc = static_cast<A>(static_cast<double>(acc) / static_cast<double>(count));
  out[k] = static_cast<Out>(static_cast<opmath_t<Out>>(acc));
}

int sm_count(int device) {
  static int count[16] = {0};
  if (!count[device]) KILN_CUDA_CHECK(cudaDeviceGetAttribute(&count[device], cudaDevAttrMultiProcessorCount, device));
  return count[device];
}

}  // namespace

void reduce(ReduceOp op, const Tensor& out, const Tensor& in, const IntList& dims) {
  const ReduceLayout layout = reduce_layout(op, out, in, dims);
  const int64_t K = layout.K, R = layout.R;
  if (K == 0) return;
  DeviceGuard g(in);
  cudaStream_t stream = stream_for(in);
  const bool leading = layout.leading;
  dispatch_numeric(in.dtype(), "reduce", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_type<T>;
    if (leading && K >= kColTile) {  // narrower outputs would leave most of each warp idle
      const int64_t tiles = (K + kColTile - 1) / kColTile;
      // Row chunks: enough blocks to cover the GPU, each chunk at least 64 rows, at most 65535.
      const int64_t want = std::max<int64_t>(1, 8 * sm_count(in.device().index) / tiles);
      const int64_t chunks = std::min<int64_t>({want, std::max<int64_t>(1, R / 64), 65535});
      const int64_t per = chunks > 1 ? (R + chunks - 1) / chunks : std::max<int64_t>(R, 1);
      const dim3 block(kColTile, kColRows);
      const T* ip = static_cast<const T*>(in.data_ptr());
      if (chunks == 1) {
        column_reduce_kernel<T, A, T><<<dim3(static_cast<unsigned>(tiles), 1), block, 0, stream>>>(
            ip, static_cast<T*>(out.data_ptr()), R, K, op, per, true, R);
        KILN_CUDA_CHECK_LAUNCH("column_reduce_kernel");
        return;
      }
      // Mean's partials are sums; the second pass divides by R.
      const ReduceOp first = op == ReduceOp::Mean ? ReduceOp::Sum : op;
      Tensor partial = empty({chunks, K}, TensorOptions().dtype(dtype_of<A>::value).device(in.device()));
      column_reduce_kernel<T, A, A>
          <<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks)), block, 0, stream>>>(
              ip, static_cast<A*>(partial.data_ptr()), R, K, first, per, false, R);
      KILN_CUDA_CHECK_LAUNCH("column_reduce_kernel (partials)");
      column_reduce_kernel<A, A, T><<<dim3(static_cast<unsigned>(tiles), 1), block, 0, stream>>>(
          static_cast<const A*>(partial.data_ptr()), static_cast<T*>(out.data_ptr()), chunks, K, op, chunks, true, R);
      KILN_CUDA_CHECK_LAUNCH("column_reduce_kernel (final)");
      return;
    }
    Tensor src = layout.rows(in);
    // Blocks per row: enough to cover the GPU when there are few rows.
    const int64_t target_blocks = 4 * sm_count(in.device().index);
    int64_t P = K >= target_blocks ? 1 : std::min<int64_t>((target_blocks + K - 1) / K, (R + 4095) / 4096);
    P = std::max<int64_t>(P, 1);
    const T* ip = static_cast<const T*>(src.data_ptr());
    if (P == 1) {
      row_reduce_kernel<T, A, T>
          <<<dim3(1, grid_yz(K)), kThreads, 0, stream>>>(ip, static_cast<T*>(out.data_ptr()), K, R, op, true, R);
      KILN_CUDA_CHECK_LAUNCH("row_reduce_kernel");
      return;
    }
    Tensor partial = empty({K, P}, TensorOptions().dtype(dtype_of<A>::value).device(in.device()));
    row_reduce_kernel<T, A, A><<<dim3(static_cast<unsigned>(P), grid_yz(K)), kThreads, 0, stream>>>(
        ip, static_cast<A*>(partial.data_ptr()), K, R, op, false, R);
    KILN_CUDA_CHECK_LAUNCH("row_reduce_kernel (partials)");
    // Second pass over the partials: Sum/Mean partials are sums, so reduce with Sum then divide.
    ReduceOp second = op == ReduceOp::Mean ? ReduceOp::Mean : op;
    row_reduce_kernel<A, A, T><<<dim3(1, grid_yz(K)), kThreads, 0, stream>>>(
        static_cast<const A*>(partial.data_ptr()), static_cast<T*>(out.data_ptr()), K, P, second, true, R);
    KILN_CUDA_CHECK_LAUNCH("row_reduce_kernel (final)");
  });
}
KILN_REGISTER_KERNEL(kernels::reduce, CUDA, reduce);

// ---------------------------------------------------------------- arg max / min

namespace {
// Is (b, ib) a better arg-extreme than (a, ia)? Index -1 means "none"; NaN is the extreme value
// and ties go to the smaller index, as in PyTorch.
template <class M> __device__ __forceinline__ bool better(M a, int64_t ia, M b, int64_t ib, bool is_max) {
  if (ib < 0) return false;
  if (ia < 0) return true;
  const bool na = a != a, nb = b != b;
  if (na || nb) return nb && (!na || ib < ia);
  if (a == b) return ib < ia;
  return is_max ? b > a : b < a;
}

template <class T>
__global__ void arg_reduce_kernel(const T* in, T* values, int64_t* indices, int64_t rows, int64_t n, bool is_max) {
  using M = opmath_t<T>;
  __shared__ M sv[kThreads];
  __shared__ int64_t si[kThreads];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = in + r * n;
    M best = M(0);
    int64_t bi = -1;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      M v = static_cast<M>(row[i]);
      if (better(best, bi, v, i, is_max)) {
        best = v;
        bi = i;
      }
    }
    sv[threadIdx.x] = best;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
      if (threadIdx.x < s &&
          better(sv[threadIdx.x], si[threadIdx.x], sv[threadIdx.x + s], si[threadIdx.x + s], is_max)) {
        sv[threadIdx.x] = sv[threadIdx.x + s];
        si[threadIdx.x] = si[threadIdx.x + s];
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      values[r] = static_cast<T>(sv[0]);
      indices[r] = si[0];
    }
    __syncthreads();
  }
}
}  // namespace

void arg_reduce(bool is_max, const Tensor& values, const Tensor& indices, const Tensor& in, int64_t dim) {
  const int64_t n = in.sizes().empty() ? 1 : in.sizes()[dim];
  KILN_CHECK(n > 0, is_max ? "max" : "min", ": cannot reduce over an empty dimension (sizes ", in.sizes(), ")");
  Tensor src = dim_last_rows(in, dim);
  const int64_t rows = src.numel() / n;
  if (rows == 0) return;
  DeviceGuard g(in);
  dispatch_numeric(in.dtype(), is_max ? "max" : "min", [&](auto tag) {
    using T = typename decltype(tag)::type;
    arg_reduce_kernel<T><<<static_cast<unsigned>(std::min<int64_t>(rows, 65535)), kThreads, 0, stream_for(in)>>>(
        static_cast<const T*>(src.data_ptr()), static_cast<T*>(values.data_ptr()),
        static_cast<int64_t*>(indices.data_ptr()), rows, n, is_max);
    KILN_CUDA_CHECK_LAUNCH("arg_reduce_kernel");
  });
}
KILN_REGISTER_KERNEL(kernels::arg_reduce, CUDA, arg_reduce);

}  // namespace kiln::kernels::cuda
