// Fused pointwise kernels on the GPU: bias+GELU and bias+dropout+residual, forward and backward.
//
// What they compute (the math is kernels/math/fused.h, shared with the CPU backend):
//   bias_gelu                 y  = gelu(x + b)                  read x, write y
//   bias_gelu_backward        dx = g * gelu'(x + b), db = sum_rows dx
//   bias_dropout_add          y  = r + mask * (x + b) / (1 - p) read x, r, write y
//   bias_dropout_add_backward dx = mask * g / (1 - p), db = sum_rows dx
// Why they are fast: each is one pass over memory. The unfused chains read and write the full
// tensor once per op (x + b, then gelu; or x + b, dropout, + r), so they move 2-3x the bytes,
// and a bias gradient computed afterwards reads dx once more.
//
// Layout: contiguous [R, K] operands, bias [K]. y may be x and dx may be g (each element is
// read and then written by one thread), so those pointers are not __restrict__. The forward
// kernels are grid-stride loops over elements; the bias is read through `i % K` (it stays in
// L1/L2). bias_gelu uses 16-byte vector loads when K and the pointers allow it.
//
// The bias gradient is deterministic: a block of 32 x 8 threads owns 32 columns and one chunk of
// rows; a warp reads 32 consecutive columns of a row (coalesced), each thread sums its column
// over the chunk's rows, the 8 row-threads are added in shared memory in a fixed order and the
// block writes one partial row [chunk, K]. A second kernel adds the chunks in order. No atomics,
// so the result does not depend on scheduling.
//
// The dropout mask is element i (row-major) kept when philox::dropout_uniform(seed, offset, i) >= p
// (four elements to a Philox block): the same bits as the CPU dropout kernel, so masks agree across backends; the
// backward regenerates it from (seed, offset) instead of reading a stored mask.
#include "kiln/kernels/cuda/launch.cuh"
#include "kiln/kernels/fused.h"
#include "kiln/kernels/math/fused.h"

namespace kiln::kernels::cuda {

namespace {

// Accumulator of the column sums: f32 for f32/f16/bf16 data, f64 for f64.
template <class T> using acc_t = opmath_t<T>;

int64_t cols_of(const Tensor& t) { return t.dim() == 0 ? 1 : t.size(-1); }

// ---------------------------------------------------------------- forward kernels

template <class T, class F>
__global__ void bias_act_kernel(T* y, const T* x, const T* __restrict__ bias, int64_t n, int64_t k, F f) {
  using M = opmath_t<T>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const M b = bias ? static_cast<M>(bias[i % k]) : M(0);
    y[i] = static_cast<T>(f(static_cast<M>(x[i]), b));
  }
}

// 16-byte packs of V elements; requires k % V == 0 and 16-byte aligned x, y, bias (so a pack
// never straddles two rows and the bias pack is aligned too).
template <class T, class F>
__global__ void bias_act_vec_kernel(T* y, const T* x, const T* __restrict__ bias, int64_t n, int64_t k, F f) {
  using M = opmath_t<T>;
  constexpr int V = 16 / sizeof(T);
  struct alignas(16) Pack {
    T v[V];
  };
  const int64_t packs = n / V;  // n is a multiple of k, hence of V
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < packs; p += stride) {
    const Pack xv = reinterpret_cast<const Pack*>(x)[p];
    Pack bv;
    if (bias) {
      bv = reinterpret_cast<const Pack*>(bias)[(p * V % k) / V];
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) bv.v[j] = T(0.0f);
    }
    Pack yv;
#pragma unroll
    for (int j = 0; j < V; ++j) yv.v[j] = static_cast<T>(f(static_cast<M>(xv.v[j]), static_cast<M>(bv.v[j])));
    reinterpret_cast<Pack*>(y)[p] = yv;
  }
}

// A grid-stride thread per four elements, which share one Philox block of the mask.
template <class T>
__global__ void bias_dropout_add_kernel(T* __restrict__ y, const T* __restrict__ x, const T* __restrict__ bias,
                                        const T* __restrict__ residual, int64_t n, int64_t k, math::DropoutMask mask,
                                        opmath_t<T> scale) {
  using M = opmath_t<T>;
  const int64_t quads = (n + 3) / 4;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < quads; q += stride) {
    bool keep[4] = {true, true, true, true};
    if (mask.p > 0.0f) mask.keep4(static_cast<uint64_t>(q), keep);  // p == 0 (eval): no Philox rounds
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const int64_t i = 4 * q + w;
      if (i >= n) break;
      const M b = bias ? static_cast<M>(bias[i % k]) : M(0);
      y[i] = static_cast<T>(
          math::BiasDropoutAdd::apply(static_cast<M>(x[i]), b, static_cast<M>(residual[i]), scale, keep[w]));
    }
  }
}

// ---------------------------------------------------------------- backward: dx + column sums

constexpr int kColTile = 32;  // columns per block (one warp's width)
constexpr int kRowLanes = 8;  // threads per column (blockDim.y)

// dx of bias_gelu: element (r, j) from g, x and the bias.
template <class T, class BackF> struct BiasActGrad {
  const T* g;
  const T* x;
  const T* bias;
  BackF f;
  __device__ opmath_t<T> operator()(int64_t r, int64_t j, int64_t k) const {
    using M = opmath_t<T>;
    const int64_t i = r * k + j;
    return f(static_cast<M>(g[i]), static_cast<M>(x[i]), bias ? static_cast<M>(bias[j]) : M(0));
  }
};

// dx of bias_dropout_add: element (r, j) from g and the regenerated mask.
template <class T> struct DropoutGradAt {
  const T* g;
  math::DropoutGrad f;
  opmath_t<T> scale;
  __device__ opmath_t<T> operator()(int64_t r, int64_t j, int64_t k) const {
    using M = opmath_t<T>;
    const int64_t i = r * k + j;
    if (f.mask.p <= 0.0f) return static_cast<M>(g[i]);  // nothing dropped (uniform branch)
    return f(static_cast<M>(g[i]), scale, static_cast<uint64_t>(i));
  }
};

// Writes dx for rows [chunk * rows_per_chunk, ...) and columns [blockIdx.x * 32, +32), and (when
// partial is not null) the chunk's column sums of the stored dx into partial[chunk, :].
template <class T, class G>
__global__ void grad_colsum_kernel(T* dx, acc_t<T>* __restrict__ partial, int64_t rows, int64_t k,
                                   int64_t rows_per_chunk, G grad) {
  using A = acc_t<T>;
  __shared__ A sums[kRowLanes][kColTile + 1];
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = min(rows, r0 + rows_per_chunk);
  A acc = A(0);
  if (j < k) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
      const T v = static_cast<T>(grad(r, j, k));
      dx[r * k + j] = v;
      acc += static_cast<A>(v);
    }
  }
  if (!partial) return;  // uniform across the block: no thread is left at the barrier
  sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && j < k) {
    A s = A(0);
#pragma unroll
    for (int l = 0; l < kRowLanes; ++l) s += sums[l][threadIdx.x];
    partial[static_cast<int64_t>(blockIdx.y) * k + j] = s;
  }
}

template <class T>
__global__ void colsum_finish_kernel(T* __restrict__ dbias, const acc_t<T>* __restrict__ partial, int64_t chunks,
                                     int64_t k) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= k) return;
  acc_t<T> s = acc_t<T>(0);
  for (int64_t c = 0; c < chunks; ++c) s += partial[c * k + j];
  dbias[j] = static_cast<T>(s);
}

// Launches grad_colsum_kernel (+ the finishing pass when dbias is defined) for a [rows, k] dx.
template <class T, class G> void launch_grad_colsum(const Tensor& dx, const Tensor& dbias, G grad, const char* name) {
  using A = acc_t<T>;
  const int64_t k = cols_of(dx), rows = dx.numel() / k;
  DeviceGuard guard(dx);
  cudaStream_t stream = stream_for(dx);
  // About 2048 blocks in all: plenty for any GPU, few partial rows for the second pass.
  const int64_t col_blocks = (k + kColTile - 1) / kColTile;
  KILN_CHECK(col_blocks <= 0x7fffffff, name, ": last dimension ", k, " is too large");
  int64_t chunks = std::max<int64_t>(1, std::min<int64_t>((rows + 31) / 32, 2048 / col_blocks));
  chunks = std::min<int64_t>(chunks, 65535);
  const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
  chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
  Tensor partial;
  if (dbias.defined()) partial = empty({chunks, k}, TensorOptions().dtype(dtype_of<A>::value).device(dx.device()));
  const dim3 block(kColTile, kRowLanes);
  const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(chunks));
  grad_colsum_kernel<T><<<grid, block, 0, stream>>>(static_cast<T*>(dx.data_ptr()),
                                                    dbias.defined() ? static_cast<A*>(partial.data_ptr()) : nullptr,
                                                    rows, k, rows_per_chunk, grad);
  KILN_CUDA_CHECK_LAUNCH(name);
  if (dbias.defined()) {
    colsum_finish_kernel<T><<<static_cast<unsigned>((k + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(dbias.data_ptr()), static_cast<const A*>(partial.data_ptr()), chunks, k);
    KILN_CUDA_CHECK_LAUNCH("colsum_finish_kernel");
  }
}

template <class T> const T* bias_ptr(const Tensor& bias) {
  return bias.defined() ? static_cast<const T*>(bias.data_ptr()) : nullptr;
}

template <class F> void with_gelu(GeluApprox approx, F&& f) {
  if (approx == GeluApprox::Tanh) f(math::GeluTanh{}, math::GeluTanhBackward{});
  else f(math::GeluErf{}, math::GeluErfBackward{});
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void bias_gelu(const Tensor& y, const Tensor& x, const Tensor& bias, GeluApprox approx) {
  const int64_t n = x.numel(), k = cols_of(x);
  if (n == 0) return;
  DeviceGuard guard(y);
  dispatch_floating(x.dtype(), "bias_gelu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int V = 16 / sizeof(T);
    const T* b = bias_ptr<T>(bias);
    T* yp = static_cast<T*>(y.data_ptr());
    const T* xp = static_cast<const T*>(x.data_ptr());
    const bool vec = k % V == 0 && aligned16(yp) && aligned16(xp) && (!b || aligned16(b));
    with_gelu(approx, [&](auto act, auto) {
      const math::BiasAct<decltype(act)> f;
      if (vec) {
        bias_act_vec_kernel<T><<<grid_for(n, V), kThreads, 0, stream_for(y)>>>(yp, xp, b, n, k, f);
        KILN_CUDA_CHECK_LAUNCH("bias_act_vec_kernel");
      } else {
        bias_act_kernel<T><<<grid_for(n), kThreads, 0, stream_for(y)>>>(yp, xp, b, n, k, f);
        KILN_CUDA_CHECK_LAUNCH("bias_act_kernel");
      }
    });
  });
}
KILN_REGISTER_KERNEL(kernels::backend::bias_gelu, CUDA, bias_gelu);

void bias_gelu_backward(const Tensor& dx, const Tensor& dbias, const Tensor& g, const Tensor& x, const Tensor& bias,
                        GeluApprox approx) {
  dispatch_floating(x.dtype(), "bias_gelu_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_gelu(approx, [&](auto, auto act_backward) {
      using BackF = math::BiasActBackward<decltype(act_backward)>;
      BiasActGrad<T, BackF> grad{static_cast<const T*>(g.data_ptr()), static_cast<const T*>(x.data_ptr()),
                                 bias_ptr<T>(bias), BackF{}};
      launch_grad_colsum<T>(dx, dbias, grad, "bias_gelu_backward");
    });
  });
}
KILN_REGISTER_KERNEL(kernels::backend::bias_gelu_backward, CUDA, bias_gelu_backward);

void bias_dropout_add(const Tensor& y, const Tensor& x, const Tensor& bias, const Tensor& residual, double p,
                      uint64_t seed, uint64_t offset) {
  const int64_t n = x.numel(), k = cols_of(x);
  if (n == 0) return;
  DeviceGuard guard(y);
  dispatch_floating(x.dtype(), "bias_dropout_add", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = opmath_t<T>;
    const M scale = p >= 1.0 ? M(0) : static_cast<M>(1.0 / (1.0 - p));
    const math::DropoutMask mask{seed, offset, static_cast<float>(p)};
    bias_dropout_add_kernel<T><<<grid_for(n, 4), kThreads, 0, stream_for(y)>>>(
        static_cast<T*>(y.data_ptr()), static_cast<const T*>(x.data_ptr()), bias_ptr<T>(bias),
        static_cast<const T*>(residual.data_ptr()), n, k, mask, scale);
    KILN_CUDA_CHECK_LAUNCH("bias_dropout_add_kernel");
  });
}
KILN_REGISTER_KERNEL(kernels::backend::bias_dropout_add, CUDA, bias_dropout_add);

void bias_dropout_add_backward(const Tensor& dx, const Tensor& dbias, const Tensor& g, double p, uint64_t seed,
                               uint64_t offset) {
  dispatch_floating(g.dtype(), "bias_dropout_add_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = opmath_t<T>;
    const M scale = p >= 1.0 ? M(0) : static_cast<M>(1.0 / (1.0 - p));
    DropoutGradAt<T> grad{static_cast<const T*>(g.data_ptr()),
                          math::DropoutGrad{math::DropoutMask{seed, offset, static_cast<float>(p)}}, scale};
    launch_grad_colsum<T>(dx, dbias, grad, "bias_dropout_add_backward");
  });
}
KILN_REGISTER_KERNEL(kernels::backend::bias_dropout_add_backward, CUDA, bias_dropout_add_backward);

}  // namespace kiln::kernels::cuda
