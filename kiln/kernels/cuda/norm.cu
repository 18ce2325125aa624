// Fused batch norm and layer/RMS norm on the GPU, forward and backward: the contracts of
// kiln/kernels/norm.h and the same numerics as the CPU kernels (kiln/kernels/cpu/norm.cpp).
//
// What they compute
//   batch norm, x viewed as [N, C, S]: per channel c over its M = N*S elements,
//     y = (x - mean_c) * invstd_c * w_c + b_c,  invstd = 1 / sqrt(var_biased + eps)
//   row norm, x viewed as [R, K]: the same per row (layer norm), or y = x * invstd * w with
//     invstd = 1 / sqrt(mean(x^2) + eps) (RMS norm).
//
// How
//   Batch norm, statistics: a grid of P x C blocks, block (p, c) summing its share of channel c
//   into double partials (sum of d and d^2 with d = x - x[first element of c], the CPU's shift
//   against cancellation); a per-channel kernel adds the P partials in a fixed order, so results
//   are reproducible run to run (no atomics). For [N, C] input (S = 1, also what channels-last
//   input becomes) the partial kernel walks columns instead: 32 consecutive channels per warp, so
//   loads stay coalesced. The same finalize step folds the statistics, weight and bias into two
//   per-channel coefficients, and one elementwise pass writes y = x * a_c + b_c.
//   Batch norm backward: the same partial/finalize pair for sum(g) and sum(g * (x - mean)), which
//   also yields dweight and dbias, then one pass dx = g * k1_c + x * k2_c + k3_c.
//   Fused BatchNorm + ReLU (relu = true): the forward's elementwise pass writes max(0, x * a_c +
//   b_c). The backward folds the same a_c, b_c first (bn_fold_kernel, the forward finalize's
//   bn_fold) and masks g on load, in the partials and in the dx pass, where x * a_c + b_c <= 0:
//   the pre-activation is computed as one explicit fma everywhere (bn_pre), so the recomputed
//   mask is the forward's bit for bit, and no ReLU pass runs in either direction.
//   Row norms: one warp per row for K <= 1024, one block per row above; sums in double (shifted
//   by the row's first element for layer norm), then the row is written from the statistics
//   (the second read mostly hits L1/L2). Backward: the same row layout for dx (sum(g w) and
//   sum(g w xhat) per row), and a separate deterministic column reduction for dweight/dbias:
//   [K/32, P] blocks of 32 columns x 8 rows write double partials, a second kernel adds them.
//
// Why it is fast
//   Every pass is a coalesced, memory-bound sweep: forward reads x twice and writes y once,
//   backward reads (g, x) twice and writes dx once; the per-channel/per-row parameters are folded
//   into a few scalars first, so the elementwise passes do one or two FMAs per element and no
//   integer division (the launch is 2-D: rows x inner elements).
// Accumulation is in double everywhere (as on the CPU), so f32 results agree with the CPU to
// ~1e-6 relative; f16/bf16 data is computed in f32 with f32 statistics.
#include <cmath>
#include <initializer_list>
#include <type_traits>

#include "kiln/kernels/cuda/block_reduce.cuh"
#include "kiln/kernels/cuda/launch.cuh"
#include "kiln/kernels/norm.h"
#include "kiln/kernels/math/pointwise.h"
#include "kiln/kernels/math/with_flag.h"

namespace kiln::kernels::cuda {

namespace {

using ::sqrt;  // CUDA's double overload on the device

template <class T> using stat_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T> __host__ __device__ __forceinline__ double to_d(T v) {
  return static_cast<double>(static_cast<opmath_t<T>>(v));
}
template <class T> __host__ __device__ __forceinline__ T from_d(double v) {
  return static_cast<T>(static_cast<opmath_t<T>>(v));
}
// max(v, 0) that keeps a NaN, as std::max(v, 0.0) on the CPU does.
__device__ __forceinline__ double clamp_nonneg(double v) { return v < 0.0 ? 0.0 : v; }

// a * b + c rounded once. An explicit fma cannot be contracted differently in different kernels,
// so the batch-norm pre-activation below has the same bits wherever it is computed.
__device__ __forceinline__ float fma_rn(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ __forceinline__ double fma_rn(double a, double b, double c) { return __fma_rn(a, b, c); }

// The batch-norm output before the optional ReLU, y = x * a_c + b_c (a_c, b_c from bn_fold). The
// fused ReLU's backward recomputes its mask with this same expression.
template <class T> __device__ __forceinline__ opmath_t<T> bn_pre(T x, opmath_t<T> a, opmath_t<T> b) {
  return fma_rn(static_cast<opmath_t<T>>(x), a, b);
}

// The gradient entering the batch norm: g, or with the fused ReLU g where !(bn_pre(x, a, b) <= 0)
// (math::ReluBackward with the pre-activation in the role of relu's output).
template <bool kRelu, class T>
__device__ __forceinline__ opmath_t<T> bn_grad_in(T g, T x, opmath_t<T> a, opmath_t<T> b) {
  using O = opmath_t<T>;
  if constexpr (kRelu) return math::ReluBackward{}(static_cast<O>(g), bn_pre(x, a, b));
  else return static_cast<O>(g);
}

// Folds channel c's statistics, weight and bias (null: 1 / 0) into y = x * a + b.
template <class T>
__device__ __forceinline__ void bn_fold(const T* w, const T* b, stat_t<T> mean_c, stat_t<T> invstd_c, int64_t c,
                                        opmath_t<T>& a, opmath_t<T>& shift) {
  using O = opmath_t<T>;
  const O wv = w ? static_cast<O>(w[c]) : O(1);
  const O bv = b ? static_cast<O>(b[c]) : O(0);
  a = static_cast<O>(invstd_c) * wv;
  shift = fma_rn(-static_cast<O>(mean_c), a, bv);  // bv - mean * a
}

template <class T> const T* cptr(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.data_ptr()) : nullptr;
}
template <class T> T* mptr(const Tensor& t) { return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr; }

int sm_count(int device) {
  static int count[64] = {0};
  if (device < 0 || device >= 64) return 132;
  if (!count[device]) KILN_CUDA_CHECK(cudaDeviceGetAttribute(&count[device], cudaDevAttrMultiProcessorCount, device));
  return count[device];
}

unsigned cap_grid(int64_t blocks) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(blocks, 65535)));
}

// Operand checks shared by the entry points: defined data operands are contiguous and of x's
// dtype with `numel` elements; defined statistics operands contiguous in the stat dtype.
struct Expect {
  const Tensor* t;
  const char* what;
  int64_t numel;
};
void check_data(const char* op, DType dt, std::initializer_list<Expect> es) {
  for (const Expect& e : es) {
    if (!e.t->defined()) continue;
    KILN_CHECK(e.t->device().is_cuda(), op, ": ", e.what, " is on ", e.t->device(), ", expected a CUDA tensor");
    KILN_CHECK(e.t->is_contiguous(), op, ": kernel expects contiguous operands, got ", e.what, " with sizes ",
               e.t->sizes(), " strides ", e.t->strides());
    KILN_CHECK(e.t->dtype() == dt, op, ": ", e.what, " has dtype ", e.t->dtype(), ", expected ", dt);
    KILN_CHECK(e.t->numel() == e.numel, op, ": ", e.what, " has sizes ", e.t->sizes(), " (", e.t->numel(),
               " elements), expected ", e.numel, " elements");
  }
}

// ------------------------------------------------------------------ block-wide pair sums

// Sums (a, b) over every thread of the block (1-D or 2-D, a multiple of 32 threads, at most
// 1024) in a fixed order; every thread gets the result.
__device__ void block_sum2(double& a, double& b) {
  __shared__ double sa[32], sb[32];
  const int tid = threadIdx.x + threadIdx.y * blockDim.x;
  const int nwarps = (blockDim.x * blockDim.y) / 32;
  const int lane = tid % 32, warp = tid / 32;
  a = warp_reduce(a, SumOp());
  b = warp_reduce(b, SumOp());
  __syncthreads();  // a previous call may still be reading sa/sb
  if (lane == 0) {
    sa[warp] = a;
    sb[warp] = b;
  }
  __syncthreads();
  if (warp == 0) {
    a = lane < nwarps ? sa[lane] : 0.0;
    b = lane < nwarps ? sb[lane] : 0.0;
    a = warp_reduce(a, SumOp());
    b = warp_reduce(b, SumOp());
    if (lane == 0) {
      sa[0] = a;
      sb[0] = b;
    }
  }
  __syncthreads();
  a = sa[0];
  b = sb[0];
}

// A row handled by one warp (kWarp) or by the whole block.
template <bool kWarp> __device__ __forceinline__ void group_sum2(double& a, double& b) {
  if constexpr (kWarp) {
    a = warp_reduce(a, SumOp());
    b = warp_reduce(b, SumOp());
  } else {
    block_sum2(a, b);
  }
}

// ------------------------------------------------------------------ batch norm kernels

// Adds up the P partial pairs of column col of ncols, stored at part[p * ncols + col] and
// part[P * ncols + p * ncols + col] (every partials kernel of this file writes that layout).
__device__ __forceinline__ void sum_partials(const double* __restrict__ part, int64_t P, int64_t ncols, int64_t col,
                                             double& a, double& b) {
  a = 0;
  b = 0;
  for (int64_t p = 0; p < P; ++p) {
    a += part[p * ncols + col];
    b += part[P * ncols + p * ncols + col];
  }
}

// Adds element i to a channel's two sums: backward sum g' and sum g' (x - center) with g' the
// (ReLU-masked) gradient, forward sum d and sum d^2 with d = x - center (g is not read).
template <bool kBackward, bool kRelu, class T, class O>
__device__ __forceinline__ void bn_accumulate(double& a, double& b, const T* __restrict__ x, const T* __restrict__ g,
                                              int64_t i, double center, O ra, O rb) {
  const double xv = to_d(x[i]);
  if constexpr (kBackward) {
    const double gv = static_cast<double>(bn_grad_in<kRelu>(g[i], x[i], ra, rb));
    a += gv;
    b += gv * (xv - center);
  } else {
    const double d = xv - center;
    a += d;
    b += d * d;
  }
}

// Per-channel partial sums over [N, C, S], S > 1. Block (p, c): threads (tx, ty) visit rows
// n = p * by + ty, p * by + ty + P * by, ... and elements s = tx, tx + bx, ... of each row.
//   kBackward = false: a = sum(x - shift_c), b = sum((x - shift_c)^2), shift_c = x[n=0, c, s=0]
//   kBackward = true:  a = sum(g),           b = sum(g * (x - mean_c))
// kRelu (backward only): g is masked by the fused ReLU (bn_grad_in) with the forward's
// coefficients relu_coef[c], relu_coef[C + c].
// Partials go to part[p * C + c] (a) and part[P * C + p * C + c] (b).
template <class T, bool kBackward, bool kRelu>
__global__ void bn_partials_planes_kernel(const T* __restrict__ x, const T* __restrict__ g,
                                          const stat_t<T>* __restrict__ mean, const opmath_t<T>* __restrict__ relu_coef,
                                          double* __restrict__ part, int64_t N, int64_t C, int64_t S) {
  using O = opmath_t<T>;
  static_assert(kBackward || !kRelu, "the ReLU mask only applies to the backward sums");
  const int64_t P = gridDim.x, p = blockIdx.x;
  const int64_t row_step = P * blockDim.y;
  for (int64_t c = blockIdx.y; c < C; c += gridDim.y) {
    const double center = kBackward ? static_cast<double>(mean[c]) : to_d(x[c * S]);
    const O ra = kRelu ? relu_coef[c] : O(0), rb = kRelu ? relu_coef[C + c] : O(0);
    double a = 0, b = 0;
    for (int64_t n = p * blockDim.y + threadIdx.y; n < N; n += row_step) {
      const int64_t base = (n * C + c) * S;
      for (int64_t s = threadIdx.x; s < S; s += blockDim.x)
        bn_accumulate<kBackward, kRelu>(a, b, x, g, base + s, center, ra, rb);
    }
    block_sum2(a, b);
    if (threadIdx.x == 0 && threadIdx.y == 0) {
      part[p * C + c] = a;
      part[P * C + p * C + c] = b;
    }
  }
}

// The same sums for [N, C] (S = 1): blockDim (32, 8), block (cb, p) owns channels
// cb * 32 + tx and rows n = p * 8 + ty, step P * 8; the 8 row-partials are added in shared memory.
constexpr int kColX = 32, kColY = 8;

// The end of the column kernels (blockDim (kColX, kColY), block y = partial p of P): adds up the
// (a, b) of the kColY threads of each column in shared memory, and row 0 stores them for column
// `col` (when valid) at part[p * ncols + col] and part[P * ncols + p * ncols + col].
__device__ __forceinline__ void store_column_partials(double a, double b, bool valid, double* __restrict__ part,
                                                      int64_t p, int64_t P, int64_t ncols, int64_t col) {
  __shared__ double sa[kColY][kColX], sb[kColY][kColX];
  sa[threadIdx.y][threadIdx.x] = a;
  sb[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && valid) {
    for (int j = 1; j < kColY; ++j) {
      a += sa[j][threadIdx.x];
      b += sb[j][threadIdx.x];
    }
    part[p * ncols + col] = a;
    part[P * ncols + p * ncols + col] = b;
  }
}

template <class T, bool kBackward, bool kRelu>
__global__ void bn_partials_columns_kernel(const T* __restrict__ x, const T* __restrict__ g,
                                           const stat_t<T>* __restrict__ mean,
                                           const opmath_t<T>* __restrict__ relu_coef, double* __restrict__ part,
                                           int64_t N, int64_t C) {
  using O = opmath_t<T>;
  static_assert(kBackward || !kRelu, "the ReLU mask only applies to the backward sums");
  const int64_t P = gridDim.y, p = blockIdx.y;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColX + threadIdx.x;
  double a = 0, b = 0;
  if (c < C) {
    const double center = kBackward ? static_cast<double>(mean[c]) : to_d(x[c]);
    const O ra = kRelu ? relu_coef[c] : O(0), rb = kRelu ? relu_coef[C + c] : O(0);
    for (int64_t n = p * kColY + threadIdx.y; n < N; n += P * kColY)
      bn_accumulate<kBackward, kRelu>(a, b, x, g, n * C + c, center, ra, rb);
  }
  store_column_partials(a, b, c < C, part, p, P, C, c);
}

// Launches the partial sums of one of the two layouts; returns P (partials per channel).
// relu_coef: the fused ReLU's mask coefficients (kRelu only, else null).
template <class T, bool kBackward, bool kRelu = false>
int64_t bn_partials(const T* x, const T* g, const stat_t<T>* mean, const opmath_t<T>* relu_coef, int64_t N, int64_t C,
                    int64_t S, int device, cudaStream_t stream, Tensor& part) {
  const int64_t M = N * S;
  const int64_t target = 4 * static_cast<int64_t>(sm_count(device));
  if (S > 1) {
    const int bx = static_cast<int>(std::min<int64_t>(kThreads, (S + 31) / 32 * 32));
    const int by = kThreads / bx;
    int64_t P = target / C;                       // floor, so that P * C blocks fit in about one wave when C is small
    P = std::min<int64_t>(P, (M + 4095) / 4096);  // at least ~4K elements per block
    P = std::min<int64_t>(P, (N + by - 1) / by);  // at least one row per thread row
    P = std::max<int64_t>(1, std::min<int64_t>(P, 65535));
    part = empty({2 * P * C}, TensorOptions().dtype(DType::F64).device(Device::cuda(device)));
    bn_partials_planes_kernel<T, kBackward, kRelu>
        <<<dim3(static_cast<unsigned>(P), cap_grid(C)), dim3(bx, by), 0, stream>>>(
            x, g, mean, relu_coef, static_cast<double*>(part.data_ptr()), N, C, S);
    KILN_CUDA_CHECK_LAUNCH("bn_partials_planes_kernel");
    return P;
  }
  const int64_t cblocks = (C + kColX - 1) / kColX;
  int64_t P = target / cblocks;
  P = std::min<int64_t>(P, (N + 8 * kColY - 1) / (8 * kColY));  // at least ~8 rows per thread
  P = std::max<int64_t>(1, std::min<int64_t>(P, 65535));
  part = empty({2 * P * C}, TensorOptions().dtype(DType::F64).device(Device::cuda(device)));
  bn_partials_columns_kernel<T, kBackward, kRelu>
      <<<dim3(static_cast<unsigned>(cblocks), static_cast<unsigned>(P)), dim3(kColX, kColY), 0, stream>>>(
          x, g, mean, relu_coef, static_cast<double*>(part.data_ptr()), N, C);
  KILN_CUDA_CHECK_LAUNCH("bn_partials_columns_kernel");
  return P;
}

// Forward finalize, one thread per channel: (training) adds the P partials in order and writes
// mean, biased var and invstd exactly as the CPU computes them from its sums; then folds the
// statistics, weight and bias into y = x * coef[c] + coef[C + c].
template <class T>
__global__ void bn_forward_finalize_kernel(const double* __restrict__ part, int64_t P, const T* __restrict__ x,
                                           const T* __restrict__ w, const T* __restrict__ b, stat_t<T>* mean,
                                           stat_t<T>* invstd, stat_t<T>* var, opmath_t<T>* __restrict__ coef, int64_t C,
                                           int64_t S, int64_t M, bool training, double eps) {
  using O = opmath_t<T>;
  using ST = stat_t<T>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < C; c += stride) {
    if (training) {
      double s, ss;
      sum_partials(part, P, C, c, s, ss);
      const double shift = to_d(x[c * S]);
      const double md = s / static_cast<double>(M);
      const double v = clamp_nonneg(ss / static_cast<double>(M) - md * md);
      mean[c] = static_cast<ST>(shift + md);
      var[c] = static_cast<ST>(v);
      invstd[c] = static_cast<ST>(1.0 / sqrt(v + eps));
    }
    O a, bc;
    bn_fold(w, b, mean[c], invstd[c], c, a, bc);
    coef[c] = a;
    coef[C + c] = bc;
  }
}

// The forward's coefficients again, for the fused ReLU's backward mask: coef[c] = a_c,
// coef[C + c] = b_c from the saved statistics, through the same bn_fold as the forward finalize.
template <class T>
__global__ void bn_fold_kernel(const T* __restrict__ w, const T* __restrict__ b, const stat_t<T>* __restrict__ mean,
                               const stat_t<T>* __restrict__ invstd, opmath_t<T>* __restrict__ coef, int64_t C) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < C; c += stride)
    bn_fold(w, b, mean[c], invstd[c], c, coef[c], coef[C + c]);
}

// Backward finalize, one thread per channel: sums of the partials (when computed), dweight =
// dot * invstd, dbias = sum_g, and the dx coefficients (coef null when dx is not wanted):
//   training: dx = w * invstd * (g - sum_g / M - (x - mean) * invstd^2 * dot / M)
//   eval:     dx = w * invstd * g
// written as dx = g * k1 + x * k2 + k3 with k1, k2, k3 at coef[c], coef[C + c], coef[2C + c].
template <class T>
__global__ void bn_backward_finalize_kernel(const double* __restrict__ part, int64_t P, const T* __restrict__ w,
                                            const stat_t<T>* __restrict__ mean, const stat_t<T>* __restrict__ invstd,
                                            T* __restrict__ dw, T* __restrict__ db, opmath_t<T>* __restrict__ coef,
                                            int64_t C, int64_t M, bool training) {
  using O = opmath_t<T>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < C; c += stride) {
    double sum_g, dot;
    sum_partials(part, P, C, c, sum_g, dot);
    const double is = static_cast<double>(invstd[c]);
    if (dw) dw[c] = from_d<T>(dot * is);
    if (db) db[c] = from_d<T>(sum_g);
    if (coef) {
      const double wv = w ? to_d(w[c]) : 1.0;
      const double Md = static_cast<double>(M);
      const double a1 = wv * is;
      const double a2 = training && M > 0 ? -wv * is * is * is * dot / Md : 0.0;
      const double a3 = training && M > 0 ? -a1 * sum_g / Md - a2 * static_cast<double>(mean[c]) : 0.0;
      coef[c] = static_cast<O>(a1);
      coef[C + c] = static_cast<O>(a2);
      coef[2 * C + c] = static_cast<O>(a3);
    }
  }
}

// One element j of bn_affine_kernel below (c0, c1, c2: the channel's k0, k1, k2; rac, rbc: its
// ReLU mask coefficients, used by the backward with kRelu only).
template <class T, bool kTwo, bool kRelu>
__device__ __forceinline__ void bn_affine_elem(T* __restrict__ out, const T* __restrict__ in0,
                                               const T* __restrict__ in1, int64_t j, opmath_t<T> c0, opmath_t<T> c1,
                                               opmath_t<T> c2, opmath_t<T> rac, opmath_t<T> rbc) {
  using O = opmath_t<T>;
  if constexpr (kTwo) {
    O v = bn_grad_in<kRelu>(in0[j], in1[j], rac, rbc) * c0;
    v = v + (c1 == O(0) ? O(0) : static_cast<O>(in1[j]) * c1);  // eval: no NaN * 0 (cpu bn_x_term)
    out[j] = static_cast<T>(v + c2);
  } else {
    const O v = bn_pre(in0[j], c0, c2);
    if constexpr (kRelu) out[j] = static_cast<T>(math::Relu{}(v));
    else out[j] = static_cast<T>(v);
  }
}

// The elementwise passes, with per-channel coefficients k0 = coef[ch], k1 = coef[C + ch],
// k2 = coef[(kTwo ? 2 : 1) * C + ch]:
//   forward (!kTwo):  out = bn_pre(in0, k0, k2) = in0 * k0 + k2, then max(0, .) with kRelu
//   backward (kTwo):  out = gin * k0 + in1 * k1 + k2 with in0 = g, in1 = x and gin = g, or with
//                     kRelu g masked where bn_pre(x, relu_coef[ch], relu_coef[C + ch]) <= 0
// The operands are [rows, L]:
//   per_row (S > 1): rows = N * C, L = S, ch = row % C (one division per row, not per element)
//   otherwise (S = 1): rows = N, L = C, ch = column.
template <class T, bool kTwo, bool kRelu>
__global__ void bn_affine_kernel(T* __restrict__ out, const T* __restrict__ in0, const T* __restrict__ in1,
                                 const opmath_t<T>* __restrict__ coef, const opmath_t<T>* __restrict__ relu_coef,
                                 int64_t rows, int64_t L, int64_t C, bool per_row) {
  using O = opmath_t<T>;
  const O* k0 = coef;
  const O* k1 = coef + C;
  const O* k2 = coef + (kTwo ? 2 : 1) * C;
  // The fused ReLU's mask coefficients (the forward's a_c, b_c); the forward masks its own output.
  const O* ra = kTwo && kRelu ? relu_coef : nullptr;
  const O* rb = kTwo && kRelu ? relu_coef + C : nullptr;
  const int64_t row_step = static_cast<int64_t>(gridDim.y) * blockDim.y;
  const int64_t col_step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; r < rows; r += row_step) {
    const int64_t base = r * L;
    if (per_row) {
      const int64_t ch = r % C;
      const O c0 = k0[ch], c2 = k2[ch];
      const O c1 = kTwo ? k1[ch] : O(0);
      const O rac = kTwo && kRelu ? ra[ch] : O(0), rbc = kTwo && kRelu ? rb[ch] : O(0);
      for (int64_t i = col0; i < L; i += col_step)
        bn_affine_elem<T, kTwo, kRelu>(out, in0, in1, base + i, c0, c1, c2, rac, rbc);
    } else {
      for (int64_t i = col0; i < L; i += col_step)
        bn_affine_elem<T, kTwo, kRelu>(out, in0, in1, base + i, k0[i], kTwo ? k1[i] : O(0), k2[i],
                                       kTwo && kRelu ? ra[i] : O(0), kTwo && kRelu ? rb[i] : O(0));
    }
  }
}

template <class T, bool kTwo, bool kRelu = false>
void launch_bn_affine(T* out, const T* in0, const T* in1, const opmath_t<T>* coef, const opmath_t<T>* relu_coef,
                      int64_t N, int64_t C, int64_t S, cudaStream_t stream) {
  const bool per_row = S > 1;
  const int64_t rows = per_row ? N * C : N, L = per_row ? S : C;
  const int bx = static_cast<int>(std::min<int64_t>(kThreads, (L + 31) / 32 * 32));
  const int by = kThreads / bx;
  const dim3 grid(cap_grid((L + bx - 1) / bx), cap_grid((rows + by - 1) / by));
  bn_affine_kernel<T, kTwo, kRelu>
      <<<grid, dim3(bx, by), 0, stream>>>(out, in0, in1, coef, relu_coef, rows, L, C, per_row);
  KILN_CUDA_CHECK_LAUNCH("bn_affine_kernel");
}

void bn_ncs(const char* op, const Tensor& x, int64_t& N, int64_t& C, int64_t& S) {
  KILN_CHECK(x.defined() && x.dim() >= 2, op, ": expected input of shape [N, C, *]");
  N = x.size(0);
  C = x.size(1);
  S = 1;
  for (int64_t d = 2; d < x.dim(); ++d) S *= x.size(d);
}

// ------------------------------------------------------------------ row norm kernels

// A thread's place in the row kernels, a warp (kWarp) or a block per row: lane t of `size`
// threads working on rows first, first + step, ...
template <bool kWarp> struct RowGroup {
  int t, size;
  int64_t first, step;
  __device__ RowGroup()
      : t(kWarp ? threadIdx.x % 32 : threadIdx.x),
        size(kWarp ? 32 : blockDim.x),
        first(static_cast<int64_t>(blockIdx.x) * per_block() + (kWarp ? threadIdx.x / 32 : 0)),
        step(static_cast<int64_t>(gridDim.x) * per_block()) {}
  __device__ static int64_t per_block() { return kWarp ? blockDim.x / 32 : 1; }
};

// One row per warp (kWarp) or per block. Statistics as on the CPU (double sums of x - shift,
// shift = the row's first element for layer norm, 0 for RMS norm); then
// y = (x - mean) * invstd [* w] [+ b] in opmath.
template <class T, bool kWarp>
__global__ void row_norm_forward_kernel(T* __restrict__ y, stat_t<T>* __restrict__ mean, stat_t<T>* __restrict__ invstd,
                                        const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                        int64_t R, int64_t K, bool rms, double eps) {
  using O = opmath_t<T>;
  using ST = stat_t<T>;
  const RowGroup<kWarp> rg;
  const int t = rg.t, group = rg.size;
  const double Kd = static_cast<double>(K);
  for (int64_t r = rg.first; r < R; r += rg.step) {
    const T* xr = x + r * K;
    T* yr = y + r * K;
    const double shift = rms || K == 0 ? 0.0 : to_d(xr[0]);
    double s = 0, ss = 0;
    for (int64_t i = t; i < K; i += group) {
      const double d = to_d(xr[i]) - shift;
      s += d;
      ss += d * d;
    }
    group_sum2<kWarp>(s, ss);
    double m = 0, is;
    if (rms) {
      is = 1.0 / sqrt(ss / Kd + eps);
    } else {
      const double md = s / Kd;
      m = shift + md;
      is = 1.0 / sqrt(clamp_nonneg(ss / Kd - md * md) + eps);
    }
    if (t == 0) {
      if (!rms) mean[r] = static_cast<ST>(m);
      invstd[r] = static_cast<ST>(is);
    }
    const O mo = static_cast<O>(m), io = static_cast<O>(is);
    for (int64_t i = t; i < K; i += group) {
      O v = (static_cast<O>(xr[i]) - mo) * io;
      if (w) v = v * static_cast<O>(w[i]);
      if (b) v = v + static_cast<O>(b[i]);
      yr[i] = static_cast<T>(v);
    }
  }
}

// dx per row: gw = g * w, a = sum(gw), b = sum(gw * xhat) (doubles),
// dx = invstd * (gw - a / K - xhat * b / K) (a = 0 for RMS norm), as on the CPU.
template <class T, bool kWarp>
__global__ void row_norm_dx_kernel(T* __restrict__ dx, const T* __restrict__ g, const T* __restrict__ x,
                                   const T* __restrict__ w, const stat_t<T>* __restrict__ mean,
                                   const stat_t<T>* __restrict__ invstd, int64_t R, int64_t K, bool rms) {
  using O = opmath_t<T>;
  const RowGroup<kWarp> rg;
  const int t = rg.t, group = rg.size;
  for (int64_t r = rg.first; r < R; r += rg.step) {
    const T* xr = x + r * K;
    const T* gr = g + r * K;
    const O m = rms ? O(0) : static_cast<O>(mean[r]);
    const O is = static_cast<O>(invstd[r]);
    double a = 0, b = 0;
    for (int64_t i = t; i < K; i += group) {
      const O v = static_cast<O>(gr[i]) * (w ? static_cast<O>(w[i]) : O(1));
      a += static_cast<double>(v);
      b += static_cast<double>(v) * static_cast<double>((static_cast<O>(xr[i]) - m) * is);
    }
    group_sum2<kWarp>(a, b);
    const O ca = rms ? O(0) : static_cast<O>(a / static_cast<double>(K));
    const O cb = static_cast<O>(b / static_cast<double>(K));
    T* dr = dx + r * K;
    for (int64_t i = t; i < K; i += group) {
      const O gw = static_cast<O>(gr[i]) * (w ? static_cast<O>(w[i]) : O(1));
      const O xh = (static_cast<O>(xr[i]) - m) * is;
      dr[i] = static_cast<T>(is * (gw - ca - xh * cb));
    }
  }
}

// dweight/dbias partials: blockDim (32, 8), block (kb, p) owns columns kb * 32 + tx and rows
// p * 8 + ty, step P * 8. dw sums g * (x - mean) * invstd (product in opmath, as on the CPU), db
// sums g. Partials at part[p * K + k] (dw) and part[P * K + p * K + k] (db).
template <class T>
__global__ void row_norm_col_partials_kernel(const T* __restrict__ g, const T* __restrict__ x,
                                             const stat_t<T>* __restrict__ mean, const stat_t<T>* __restrict__ invstd,
                                             double* __restrict__ part, int64_t R, int64_t K, bool rms) {
  using O = opmath_t<T>;
  const int64_t P = gridDim.y, p = blockIdx.y;
  const int64_t k = static_cast<int64_t>(blockIdx.x) * kColX + threadIdx.x;
  double a = 0, b = 0;
  if (k < K) {
    for (int64_t r = p * kColY + threadIdx.y; r < R; r += P * kColY) {
      const O m = rms ? O(0) : static_cast<O>(mean[r]);
      const O is = static_cast<O>(invstd[r]);
      const O gv = static_cast<O>(g[r * K + k]);
      a += static_cast<double>(gv * (static_cast<O>(x[r * K + k]) - m) * is);
      b += static_cast<double>(gv);
    }
  }
  store_column_partials(a, b, k < K, part, p, P, K, k);
}

template <class T>
__global__ void row_norm_col_finalize_kernel(const double* __restrict__ part, int64_t P, T* __restrict__ dw,
                                             T* __restrict__ db, int64_t K) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < K; k += stride) {
    double a, b;
    sum_partials(part, P, K, k, a, b);
    if (dw) dw[k] = from_d<T>(a);
    if (db) db[k] = from_d<T>(b);
  }
}

// Rows up to this long get one warp each; longer rows one block.
constexpr int64_t kWarpRowMax = 1024;

// Calls launch(warp, grid) for R rows of K elements: warp = std::true_type (a warp per row) for
// rows up to kWarpRowMax, else std::false_type (a block per row); grid is the launch's block count.
template <class Launch> void launch_per_row(int64_t R, int64_t K, Launch&& launch) {
  if (K <= kWarpRowMax) {
    const int64_t warps = kThreads / 32;
    launch(std::true_type{}, static_cast<unsigned>(std::min<int64_t>((R + warps - 1) / warps, 65535 * 8)));
  } else {
    launch(std::false_type{}, static_cast<unsigned>(std::min<int64_t>(R, 65535 * 8)));
  }
}

template <class T>
void launch_row_norm_forward(T* y, stat_t<T>* mean, stat_t<T>* invstd, const T* x, const T* w, const T* b, int64_t R,
                             int64_t K, bool rms, double eps, cudaStream_t stream) {
  launch_per_row(R, K, [&](auto warp, unsigned grid) {
    row_norm_forward_kernel<T, decltype(warp)::value>
        <<<grid, kThreads, 0, stream>>>(y, mean, invstd, x, w, b, R, K, rms, eps);
    KILN_CUDA_CHECK_LAUNCH(warp ? "row_norm_forward_kernel (warp per row)" : "row_norm_forward_kernel (block per row)");
  });
}

// Checks the row norm's operands (x, `other`, invstd, and mean unless rms, all defined; x splits into
// invstd.numel() rows) and returns the row length K.
int64_t row_norm_length(const char* op, const Tensor& x, const Tensor& other, const char* other_name,
                        const Tensor& invstd, const Tensor& mean, bool rms) {
  KILN_CHECK(x.defined() && other.defined() && invstd.defined() && (rms || mean.defined()), op, ": input, ", other_name,
             ", invstd (and mean for layer norm) must be defined");
  const int64_t R = invstd.numel();
  KILN_CHECK(R == 0 ? x.numel() == 0 : x.numel() % R == 0, op, ": input of ", x.numel(),
             " elements cannot be split into ", R, " rows");
  return R > 0 ? x.numel() / R : 0;
}

}  // namespace

// ------------------------------------------------------------------------------ batch norm

void batch_norm_forward(const Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& mean,
                        const Tensor& invstd, const Tensor& var, bool training, double eps, bool relu) {
  const char* op = relu ? "batch_norm_relu" : "batch_norm";
  int64_t N, C, S;
  bn_ncs(op, x, N, C, S);
  const DType dt = x.dtype(), st = norm_stat_dtype(dt);
  check_data(op, dt, {{&x, "input", x.numel()}, {&y, "output", x.numel()}, {&weight, "weight", C}, {&bias, "bias", C}});
  check_data(op, st, {{&mean, "mean", C}, {&invstd, "invstd", C}, {&var, "var", C}});
  KILN_CHECK(y.defined() && mean.defined() && invstd.defined() && (var.defined() || !training), op,
             ": output, mean, invstd (and var when training) must be defined");
  const int64_t M = N * S;
  if (M == 0 || C == 0) return;  // nothing to normalise (the CPU leaves the statistics untouched)
  DeviceGuard guard(x);
  cudaStream_t stream = stream_for(x);
  const int device = x.device().index;
  dispatch_floating(dt, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using O = opmath_t<T>;
    using ST = stat_t<T>;
    const T* xp = cptr<T>(x);
    Tensor part;
    int64_t P = 0;
    if (training) P = bn_partials<T, false>(xp, nullptr, nullptr, nullptr, N, C, S, device, stream, part);
    Tensor coef = empty({2 * C}, TensorOptions().dtype(dtype_of<O>::value).device(x.device()));
    bn_forward_finalize_kernel<T><<<grid_for(C), kThreads, 0, stream>>>(
        training ? static_cast<const double*>(part.data_ptr()) : nullptr, P, xp, cptr<T>(weight), cptr<T>(bias),
        mptr<ST>(mean), mptr<ST>(invstd), training ? mptr<ST>(var) : nullptr, mptr<O>(coef), C, S, M, training, eps);
    KILN_CUDA_CHECK_LAUNCH("bn_forward_finalize_kernel");
    math::with_flag(relu, [&](auto relu_flag) {
      constexpr bool kRelu = decltype(relu_flag)::value;
      launch_bn_affine<T, false, kRelu>(mptr<T>(y), xp, nullptr, cptr<O>(coef), nullptr, N, C, S, stream);
    });
  });
}
KILN_REGISTER_KERNEL(kernels::batch_norm_forward, CUDA, batch_norm_forward);

void batch_norm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& g, const Tensor& x,
                         const Tensor& weight, const Tensor& mean, const Tensor& invstd, bool training, bool relu,
                         const Tensor& bias) {
  const char* op = relu ? "batch_norm_relu_backward" : "batch_norm_backward";
  int64_t N, C, S;
  bn_ncs(op, x, N, C, S);
  const DType dt = x.dtype(), st = norm_stat_dtype(dt);
  const Tensor b = relu ? bias : Tensor();  // the bias only enters the ReLU mask
  check_data(op, dt,
             {{&x, "input", x.numel()},
              {&g, "grad_output", x.numel()},
              {&dx, "grad_input", x.numel()},
              {&weight, "weight", C},
              {&b, "bias", C},
              {&dweight, "grad_weight", C},
              {&dbias, "grad_bias", C}});
  check_data(op, st, {{&mean, "mean", C}, {&invstd, "invstd", C}});
  KILN_CHECK(g.defined() && mean.defined() && invstd.defined(), op, ": grad_output, mean and invstd must be defined");
  if (C == 0 || (!dx.defined() && !dweight.defined() && !dbias.defined())) return;
  DeviceGuard guard(x);
  cudaStream_t stream = stream_for(x);
  const int64_t M = N * S;
  if (M == 0) {  // empty batch: zero parameter gradients (as the CPU's empty sums give)
    if (dweight.defined()) KILN_CUDA_CHECK(cudaMemsetAsync(dweight.data_ptr(), 0, dweight.nbytes(), stream));
    if (dbias.defined()) KILN_CUDA_CHECK(cudaMemsetAsync(dbias.data_ptr(), 0, dbias.nbytes(), stream));
    return;
  }
  const int device = x.device().index;
  const bool need_sums = dweight.defined() || dbias.defined() || (dx.defined() && training);
  dispatch_floating(dt, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using O = opmath_t<T>;
    using ST = stat_t<T>;
    const T* xp = cptr<T>(x);
    const T* gp = cptr<T>(g);
    // The fused ReLU's mask needs the forward's y = x * a + b coefficients: fold them again.
    Tensor relu_coef;
    if (relu) {
      relu_coef = empty({2 * C}, TensorOptions().dtype(dtype_of<O>::value).device(x.device()));
      bn_fold_kernel<T><<<grid_for(C), kThreads, 0, stream>>>(cptr<T>(weight), cptr<T>(b), cptr<ST>(mean),
                                                              cptr<ST>(invstd), mptr<O>(relu_coef), C);
      KILN_CUDA_CHECK_LAUNCH("bn_fold_kernel");
    }
    const O* rc = cptr<O>(relu_coef);
    math::with_flag(relu, [&](auto relu_flag) {
      constexpr bool kRelu = decltype(relu_flag)::value;
      Tensor part;
      int64_t P = 0;
      if (need_sums) P = bn_partials<T, true, kRelu>(xp, gp, cptr<ST>(mean), rc, N, C, S, device, stream, part);
      Tensor coef;
      if (dx.defined()) coef = empty({3 * C}, TensorOptions().dtype(dtype_of<O>::value).device(x.device()));
      bn_backward_finalize_kernel<T><<<grid_for(C), kThreads, 0, stream>>>(
          need_sums ? static_cast<const double*>(part.data_ptr()) : nullptr, P, cptr<T>(weight), cptr<ST>(mean),
          cptr<ST>(invstd), mptr<T>(dweight), mptr<T>(dbias), mptr<O>(coef), C, M, training);
      KILN_CUDA_CHECK_LAUNCH("bn_backward_finalize_kernel");
      if (dx.defined()) launch_bn_affine<T, true, kRelu>(mptr<T>(dx), gp, xp, cptr<O>(coef), rc, N, C, S, stream);
    });
  });
}
KILN_REGISTER_KERNEL(kernels::batch_norm_backward, CUDA, batch_norm_backward);

// ------------------------------------------------------------------------------ row norms

void row_norm_forward(const Tensor& y, const Tensor& mean, const Tensor& invstd, const Tensor& x, const Tensor& weight,
                      const Tensor& bias, bool rms, double eps) {
  const char* op = rms ? "rms_norm" : "layer_norm";
  const int64_t K = row_norm_length(op, x, y, "output", invstd, mean, rms), R = invstd.numel();
  const DType dt = x.dtype();
  check_data(op, dt, {{&x, "input", x.numel()}, {&y, "output", x.numel()}, {&weight, "weight", K}});
  if (!rms) check_data(op, dt, {{&bias, "bias", K}});
  check_data(op, norm_stat_dtype(dt), {{&invstd, "invstd", R}});
  if (!rms) check_data(op, norm_stat_dtype(dt), {{&mean, "mean", R}});
  if (R == 0) return;
  DeviceGuard guard(x);
  cudaStream_t stream = stream_for(x);
  dispatch_floating(dt, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using ST = stat_t<T>;
    launch_row_norm_forward<T>(mptr<T>(y), rms ? nullptr : mptr<ST>(mean), mptr<ST>(invstd), cptr<T>(x),
                               cptr<T>(weight), rms ? nullptr : cptr<T>(bias), R, K, rms, eps, stream);
  });
}
KILN_REGISTER_KERNEL(kernels::row_norm_forward, CUDA, row_norm_forward);

void row_norm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& g, const Tensor& x,
                       const Tensor& weight, const Tensor& mean, const Tensor& invstd, bool rms) {
  const char* op = rms ? "rms_norm_backward" : "layer_norm_backward";
  const int64_t K = row_norm_length(op, x, g, "grad_output", invstd, mean, rms), R = invstd.numel();
  const DType dt = x.dtype();
  const Tensor db = rms ? Tensor() : dbias;  // RMS norm has no bias
  check_data(op, dt,
             {{&x, "input", x.numel()},
              {&g, "grad_output", x.numel()},
              {&dx, "grad_input", x.numel()},
              {&weight, "weight", K}});
  check_data(op, norm_stat_dtype(dt), {{&invstd, "invstd", R}});
  if (!rms) check_data(op, norm_stat_dtype(dt), {{&mean, "mean", R}});
  DeviceGuard guard(x);
  cudaStream_t stream = stream_for(x);
  if (R == 0) {  // no rows: zero parameter gradients
    if (dweight.defined()) KILN_CUDA_CHECK(cudaMemsetAsync(dweight.data_ptr(), 0, dweight.nbytes(), stream));
    if (db.defined()) KILN_CUDA_CHECK(cudaMemsetAsync(db.data_ptr(), 0, db.nbytes(), stream));
    return;
  }
  check_data(op, dt, {{&dweight, "grad_weight", K}, {&db, "grad_bias", K}});
  dispatch_floating(dt, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using ST = stat_t<T>;
    const T* xp = cptr<T>(x);
    const T* gp = cptr<T>(g);
    const ST* mp = rms ? nullptr : cptr<ST>(mean);
    const ST* ip = cptr<ST>(invstd);
    if (dx.defined()) {
      launch_per_row(R, K, [&](auto warp, unsigned grid) {
        row_norm_dx_kernel<T, decltype(warp)::value>
            <<<grid, kThreads, 0, stream>>>(mptr<T>(dx), gp, xp, cptr<T>(weight), mp, ip, R, K, rms);
        KILN_CUDA_CHECK_LAUNCH(warp ? "row_norm_dx_kernel (warp per row)" : "row_norm_dx_kernel (block per row)");
      });
    }
    if ((dweight.defined() || db.defined()) && K > 0) {
      const int64_t kblocks = (K + kColX - 1) / kColX;
      const int64_t target = 4 * static_cast<int64_t>(sm_count(x.device().index));
      int64_t P = target / kblocks;
      P = std::min<int64_t>(P, (R + 8 * kColY - 1) / (8 * kColY));  // at least ~8 rows per thread
      P = std::max<int64_t>(1, std::min<int64_t>(P, 65535));
      Tensor part = empty({2 * P * K}, TensorOptions().dtype(DType::F64).device(x.device()));
      row_norm_col_partials_kernel<T>
          <<<dim3(static_cast<unsigned>(kblocks), static_cast<unsigned>(P)), dim3(kColX, kColY), 0, stream>>>(
              gp, xp, mp, ip, static_cast<double*>(part.data_ptr()), R, K, rms);
      KILN_CUDA_CHECK_LAUNCH("row_norm_col_partials_kernel");
      row_norm_col_finalize_kernel<T><<<grid_for(K), kThreads, 0, stream>>>(static_cast<const double*>(part.data_ptr()),
                                                                            P, mptr<T>(dweight), mptr<T>(db), K);
      KILN_CUDA_CHECK_LAUNCH("row_norm_col_finalize_kernel");
    }
  });
}
KILN_REGISTER_KERNEL(kernels::row_norm_backward, CUDA, row_norm_backward);

}  // namespace kiln::kernels::cuda
