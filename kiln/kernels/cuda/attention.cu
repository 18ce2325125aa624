// Fused scaled-dot-product attention on the GPU: the FlashAttention-2 structure, written with
// scalar FMA loops over shared-memory tiles so that it reads like the CPU kernel
// (kiln/kernels/cpu/attention.cpp) it is tested against.
//
// What it computes (per batch entry; contracts in kiln/kernels/attention.h):
//   out = softmax(S) V  with  S = Q K^T * scale (+ causal mask),  lse_i = log(sum_j exp(S_ij)),
// and backward, with P = exp(S - lse) recomputed tile by tile and delta_i = sum_c dO_ic O_ic:
//   dV = P^T dO,  dP = dO V^T,  dS = P * (dP - delta),  dQ = dS K * scale,  dK = dS^T Q * scale.
//
// Why it is shaped this way: the [Tq, Tk] score matrix never reaches global memory. A thread block
// owns BQ query rows, stages them in shared memory once, then streams key/value tiles of BK rows
// through shared memory. For each tile it computes the BQ x BK scores in registers, and an online
// softmax keeps a running max m and a running sum l per row: when a tile raises the max, the
// accumulated output and sum are rescaled by exp(m_old - m_new). Global traffic per block is
// O(T * D) instead of the O(T^2) of softmax(q k^T) v composed of separate kernels.
//
// Thread layout (the three tile kernels): 256 threads as a 16 x 16 grid, tx = threadIdx.x % 16,
// ty = threadIdx.x / 16. Thread (ty, tx) owns the tile rows ty, ty + 16, ... and the tile columns
// tx, tx + 16, ... of every register tile (scores, output accumulator, gradient accumulators).
// The 16 threads sharing a row are 16 consecutive lanes of one warp, so a row's max and sum are
// 4 xor-shuffles. Shared tiles have rows padded by one element, so 16 threads reading 16
// different rows at one column hit 16 different banks.
//
// Backward is deterministic (no atomics; the same inputs give bitwise identical gradients): one
// kernel gives each block a key tile and loops over all query tiles to accumulate dK and dV for
// its keys; another gives each block a query tile and loops over the key tiles for dQ. Both
// recompute P from lse (the FlashAttention-2 trade: more FLOPs, no T x T memory).
//
// Causal masking is top-left aligned (query i sees keys j <= i). Key tiles entirely after a
// block's last query (forward, dQ) and query tiles entirely before a block's first key (dK/dV) are
// skipped; the diagonal tiles are masked per element. Blocks with the most tiles start first.
//
// Tiles: f32/f16/bf16 (float accumulation) use BQ = BK = 64 for head dims up to 64 and 32 for up
// to 128; f64 uses 32. Head dims are bucketed (32, 64, 128) so the register tiles have
// compile-time sizes; D and Dv themselves are runtime values. Shared memory is dynamic (up to
// ~150 KB for f64 at D = 128), opted into with cudaFuncSetAttribute above 48 KB.
//
// What a faster version would change: tensor-core MMA (mma.sync / wgmma on sm_90) for Q K^T, dO
// V^T and the P V / dS K products instead of scalar FMAs; 16-bit operands kept 16-bit in shared
// memory (half the footprint, larger tiles) and loaded with cp.async / TMA in a multi-stage
// pipeline; warp specialisation (producer warps fetching the next K/V tile while consumer warps
// compute); P kept in registers between the two products instead of a shared-memory round trip;
// exp2 with log2(e) folded into the scale.
#include <cuda_runtime.h>

#include <limits>
#include <type_traits>

#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/kernels/attention.h"
#include "kiln/kernels/norm.h"
#include "kiln/kernels/cuda/block_reduce.cuh"
#include "kiln/kernels/cuda/launch.cuh"

namespace kiln::kernels::cuda {

namespace {

constexpr int kMaxHeadDim = 128;
constexpr int kSide = 16;  // the 16 x 16 thread grid of the tile kernels (kThreads = 256)
static_assert(kSide * kSide == kThreads, "the attention kernels assume 256 threads per block");

// Tile sizes for accumulation type M and head-dim bucket HD.
template <class M, int HD> struct Tile {
  static constexpr int BQ = (sizeof(M) == 4 && HD <= 64) ? 64 : 32;  // query rows per tile
  static constexpr int BK = BQ;                                      // key rows per tile
  static constexpr int LD = HD + 1;                                  // padded row length of the Q, K, V, dO tiles
  static constexpr int LP = BK + 1;                                  // padded row length of [BQ][BK] P / dS tiles
  static constexpr int LT = BQ + 1;                                  // padded row length of [BK][BQ] P^T / dS^T tiles
  static constexpr int RQ = BQ / kSide, RK = BK / kSide, RC = HD / kSide;  // per-thread counts

  static constexpr size_t forward_smem = sizeof(M) * (BQ * LD + 2 * BK * LD + BQ * LP);
  static constexpr size_t dq_smem = sizeof(M) * (2 * BQ * LD + 2 * BK * LD + BQ * LP);
  static constexpr size_t dkdv_smem = sizeof(M) * (2 * BK * LD + 2 * BQ * LD + 2 * BK * LT + 2 * BQ);
};

// CUDA's float/double overloads (not kiln::exp(Tensor), which ordinary lookup would find first).
__device__ __forceinline__ float dexp(float x) { return ::expf(x); }
__device__ __forceinline__ double dexp(double x) { return ::exp(x); }
__device__ __forceinline__ float dlog(float x) { return ::logf(x); }
__device__ __forceinline__ double dlog(double x) { return ::log(x); }

template <class M> __device__ __forceinline__ M neg_inf() { return -std::numeric_limits<M>::infinity(); }

__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }

// Top-left aligned causal mask: query row qi sees key kj when kj <= qi.
__device__ __forceinline__ bool visible(int qi, int kj, bool causal) { return !causal || kj <= qi; }

// Max / sum over the 16 lanes that share a tile row (lanes differing in their low 4 bits).
template <class M> __device__ __forceinline__ M row_max(M v) {
#pragma unroll
  for (int o = kSide / 2; o > 0; o >>= 1) {
    M w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  return v;
}
template <class M> __device__ __forceinline__ M row_sum(M v) {
#pragma unroll
  for (int o = kSide / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The register-tile product of every tile kernel: for this thread's tile rows ty + 16 i and
// columns tx + 16 j, acc[i][j] += sum_{d < n} A(ty + 16 i, d) * B(tx + 16 j, d) with
// A(r, d) = A[r * a_row + d * a_col] and B(c, d) = B[c * b_row + d * b_col] (shared memory). The
// strides are compile-time constants at every call, so this inlines to the loops written out.
template <int RI, int RJ, class M>
__device__ __forceinline__ void tile_mma(M (&acc)[RI][RJ], const M* A, int a_row, int a_col, const M* B, int b_row,
                                         int b_col, int n) {
  const int tx = threadIdx.x % kSide, ty = threadIdx.x / kSide;
  for (int d = 0; d < n; ++d) {
    M a[RI], b[RJ];
#pragma unroll
    for (int i = 0; i < RI; ++i) a[i] = A[(ty + kSide * i) * a_row + d * a_col];
#pragma unroll
    for (int j = 0; j < RJ; ++j) b[j] = B[(tx + kSide * j) * b_row + d * b_col];
#pragma unroll
    for (int i = 0; i < RI; ++i)
#pragma unroll
      for (int j = 0; j < RJ; ++j) acc[i][j] += a[i] * b[j];
  }
}

template <int RI, int RJ, class M> __device__ __forceinline__ void zero_tile(M (&t)[RI][RJ]) {
#pragma unroll
  for (int i = 0; i < RI; ++i)
#pragma unroll
    for (int j = 0; j < RJ; ++j) t[i][j] = 0;
}

// The backward kernels' recomputation, on [rows][ld] tiles: s = A B^T over D columns and
// dp = dA dB^T over Dv columns (dQ: A, B, dA, dB = Q, K, dO, V; dK/dV the transposes).
template <int RI, int RJ, class M>
__device__ __forceinline__ void scores_and_dp(M (&s)[RI][RJ], M (&dp)[RI][RJ], const M* A, const M* B, const M* dA,
                                              const M* dB, int ld, int D, int Dv) {
  zero_tile(s);
  zero_tile(dp);
  tile_mma(s, A, ld, 1, B, ld, 1, D);
  tile_mma(dp, dA, ld, 1, dB, ld, 1, Dv);
}

// dst [ROWS][HD + 1] (shared) <- src [valid_rows][cols] (global, row-major), converted to M;
// rows >= valid_rows and columns >= cols are zero.
template <int ROWS, int HD, class T, class M>
__device__ __forceinline__ void load_tile(M* dst, const T* src, int valid_rows, int cols) {
  for (int idx = threadIdx.x; idx < ROWS * HD; idx += blockDim.x) {
    const int r = idx / HD, c = idx % HD;
    dst[r * (HD + 1) + c] =
        (r < valid_rows && c < cols) ? static_cast<M>(src[static_cast<int64_t>(r) * cols + c]) : M(0);
  }
}

// Rows [row0, row0 + n) of one batch entry's two operands into shared tiles: X [ROWS][HD + 1] from
// x (D columns) and Y from y (Dv columns); the operand pairs are (K, V) and (Q, dO).
template <int ROWS, int HD, class T, class M>
__device__ __forceinline__ void load_tile_pair(M* X, M* Y, const T* x, const T* y, int64_t row0, int n, int D, int Dv) {
  load_tile<ROWS, HD>(X, x + row0 * D, n, D);
  load_tile<ROWS, HD>(Y, y + row0 * Dv, n, Dv);
}

// ---------------------------------------------------------------------------- forward
// One block per (batch entry, tile of BQ query rows).
template <class T, class M, int HD>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                             T* __restrict__ out, M* __restrict__ lse, int64_t B, int Tq, int Tk, int D, int Dv,
                             M scale, bool causal) {
  using C = Tile<M, HD>;
  constexpr int BQ = C::BQ, BK = C::BK, LD = C::LD, LP = C::LP, RQ = C::RQ, RK = C::RK, RC = C::RC;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  M* Qs = reinterpret_cast<M*>(smem_raw);  // [BQ][LD]
  M* Ks = Qs + BQ * LD;                    // [BK][LD]
  M* Vs = Ks + BK * LD;                    // [BK][LD]
  M* Ps = Vs + BK * LD;                    // [BQ][LP] probabilities of the current tile

  const int64_t b = blockIdx.x % B;
  // blockIdx.x = rank * B + b with the last query tile (causal: the most key tiles) at rank 0
  const int qb = (Tq + BQ - 1) / BQ - 1 - static_cast<int>(blockIdx.x / B);
  const int q0 = qb * BQ, nq = imin(BQ, Tq - q0);
  const int tx = threadIdx.x % kSide, ty = threadIdx.x / kSide;
  const M ninf = neg_inf<M>();

  load_tile<BQ, HD>(Qs, q + (b * Tq + q0) * D, nq, D);

  M m[RQ], l[RQ], acc[RQ][RC];
  zero_tile(acc);
#pragma unroll
  for (int i = 0; i < RQ; ++i) {
    m[i] = ninf;
    l[i] = 0;
  }

  const int kend = causal ? imin(Tk, q0 + nq) : Tk;  // keys after the last query row: all masked
  for (int k0 = 0; k0 < kend; k0 += BK) {
    const int nk = imin(BK, kend - k0);
    __syncthreads();  // every thread is done with the previous tile's Ks, Vs, Ps
    load_tile_pair<BK, HD>(Ks, Vs, k, v, b * Tk + k0, nk, D, Dv);
    __syncthreads();

    // s = Q K^T for this thread's rows (ty + 16 i) and keys (tx + 16 j)
    M s[RQ][RK];
    zero_tile(s);
    tile_mma(s, Qs, LD, 1, Ks, LD, 1, D);

    // online softmax: new running max, rescale what was accumulated, P = exp(s - max)
#pragma unroll
    for (int i = 0; i < RQ; ++i) {
      const int row = ty + kSide * i, qi = q0 + row;
      M mx = ninf;
#pragma unroll
      for (int j = 0; j < RK; ++j) {
        const int col = tx + kSide * j;
        s[i][j] = (col < nk && visible(qi, k0 + col, causal)) ? s[i][j] * scale : ninf;
        mx = s[i][j] > mx ? s[i][j] : mx;
      }
      mx = row_max(mx);
      const M mnew = mx > m[i] ? mx : m[i];
      // A row that has seen no visible key keeps m = -inf, l = 0, acc = 0 (never exp(-inf + inf)).
      const bool none = mnew == ninf;
      const M corr = none ? M(1) : dexp(m[i] - mnew);  // exp(-inf) = 0 on a row's first keys
      M psum = 0;
#pragma unroll
      for (int j = 0; j < RK; ++j) {
        const M p = none ? M(0) : dexp(s[i][j] - mnew);
        Ps[row * LP + tx + kSide * j] = p;
        psum += p;
      }
      psum = row_sum(psum);
      l[i] = l[i] * corr + psum;
      m[i] = mnew;
#pragma unroll
      for (int c = 0; c < RC; ++c) acc[i][c] *= corr;
    }
    __syncthreads();  // Ps complete

    // acc += P V for this thread's rows and output columns (tx + 16 c)
    tile_mma(acc, Ps, LP, 1, Vs, 1, LD, nk);
  }

#pragma unroll
  for (int i = 0; i < RQ; ++i) {
    const int qi = q0 + ty + kSide * i;
    if (qi >= Tq) continue;
    // No visible key (only for Tk == 0): zeros and lse = -inf, as on the CPU.
    const M inv = l[i] > M(0) ? M(1) / l[i] : M(0);
    T* orow = out + (b * Tq + qi) * Dv;
#pragma unroll
    for (int c = 0; c < RC; ++c) {
      const int col = tx + kSide * c;
      if (col < Dv) orow[col] = static_cast<T>(acc[i][c] * inv);
    }
    if (tx == 0) lse[b * Tq + qi] = l[i] > M(0) ? m[i] + dlog(l[i]) : ninf;
  }
}

// ---------------------------------------------------------------------------- backward
// delta[r] = sum_c g[r, c] * out[r, c]: one warp per row.
template <class T, class M>
__global__ void attention_delta_kernel(const T* __restrict__ g, const T* __restrict__ out, M* __restrict__ delta,
                                       int64_t rows, int Dv) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = blockDim.x / 32;
  for (int64_t r = blockIdx.x * warps + threadIdx.x / 32; r < rows; r += gridDim.x * warps) {
    M s = 0;
    for (int c = lane; c < Dv; c += 32) s += static_cast<M>(g[r * Dv + c]) * static_cast<M>(out[r * Dv + c]);
    s = warp_reduce(s, SumOp());
    if (lane == 0) delta[r] = s;
  }
}

// dQ: one block per (batch entry, tile of BQ query rows), looping over the key tiles.
template <class T, class M, int HD>
__global__ void __launch_bounds__(kThreads)
    attention_backward_dq_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                 const T* __restrict__ g, const M* __restrict__ lse, const M* __restrict__ delta,
                                 T* __restrict__ dq, int64_t B, int Tq, int Tk, int D, int Dv, M scale, bool causal) {
  using C = Tile<M, HD>;
  constexpr int BQ = C::BQ, BK = C::BK, LD = C::LD, LP = C::LP, RQ = C::RQ, RK = C::RK, RC = C::RC;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  M* Qs = reinterpret_cast<M*>(smem_raw);  // [BQ][LD]
  M* Gs = Qs + BQ * LD;                    // [BQ][LD] dO
  M* Ks = Gs + BQ * LD;                    // [BK][LD]
  M* Vs = Ks + BK * LD;                    // [BK][LD]
  M* dSs = Vs + BK * LD;                   // [BQ][LP]

  const int64_t b = blockIdx.x % B;
  const int qb = (Tq + BQ - 1) / BQ - 1 - static_cast<int>(blockIdx.x / B);
  const int q0 = qb * BQ, nq = imin(BQ, Tq - q0);
  const int tx = threadIdx.x % kSide, ty = threadIdx.x / kSide;
  const M ninf = neg_inf<M>();

  load_tile_pair<BQ, HD>(Qs, Gs, q, g, b * Tq + q0, nq, D, Dv);
  M L[RQ], dl[RQ], acc[RQ][RC];
#pragma unroll
  for (int i = 0; i < RQ; ++i) {
    const int qi = q0 + ty + kSide * i;
    L[i] = qi < Tq ? lse[b * Tq + qi] : ninf;  // padding rows: P = 0
    dl[i] = qi < Tq ? delta[b * Tq + qi] : M(0);
  }
  zero_tile(acc);

  const int kend = causal ? imin(Tk, q0 + nq) : Tk;
  for (int k0 = 0; k0 < kend; k0 += BK) {
    const int nk = imin(BK, kend - k0);
    __syncthreads();  // done with the previous Ks, Vs, dSs
    load_tile_pair<BK, HD>(Ks, Vs, k, v, b * Tk + k0, nk, D, Dv);
    __syncthreads();

    // s = Q K^T and dp = dO V^T for rows ty + 16 i, keys tx + 16 j
    M s[RQ][RK], dp[RQ][RK];
    scores_and_dp(s, dp, Qs, Ks, Gs, Vs, LD, D, Dv);
    // dS = P * (dP - delta) with P = exp(s * scale - lse)
#pragma unroll
    for (int i = 0; i < RQ; ++i) {
      const int row = ty + kSide * i;
#pragma unroll
      for (int j = 0; j < RK; ++j) {
        const int col = tx + kSide * j;
        const bool keep = col < nk && visible(q0 + row, k0 + col, causal) && L[i] != ninf;
        const M p = keep ? dexp(s[i][j] * scale - L[i]) : M(0);
        dSs[row * LP + col] = p * (dp[i][j] - dl[i]);
      }
    }
    __syncthreads();  // dSs complete

    // acc += dS K for rows ty + 16 i, columns tx + 16 c
    tile_mma(acc, dSs, LP, 1, Ks, 1, LD, nk);
  }

#pragma unroll
  for (int i = 0; i < RQ; ++i) {
    const int qi = q0 + ty + kSide * i;
    if (qi >= Tq) continue;
    T* row = dq + (b * Tq + qi) * D;
#pragma unroll
    for (int c = 0; c < RC; ++c) {
      const int col = tx + kSide * c;
      if (col < D) row[col] = static_cast<T>(acc[i][c] * scale);
    }
  }
}

// dK and dV: one block per (batch entry, tile of BK key rows), looping over the query tiles. The
// register tiles are transposed here: thread rows are keys (ty + 16 a), columns queries (tx + 16 c).
// dk or dv may be null (not wanted).
template <class T, class M, int HD>
__global__ void __launch_bounds__(kThreads)
    attention_backward_dkdv_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                   const T* __restrict__ g, const M* __restrict__ lse, const M* __restrict__ delta,
                                   T* __restrict__ dk, T* __restrict__ dv, int64_t B, int Tq, int Tk, int D, int Dv,
                                   M scale, bool causal) {
  using C = Tile<M, HD>;
  constexpr int BQ = C::BQ, BK = C::BK, LD = C::LD, LT = C::LT, RQ = C::RQ, RK = C::RK, RC = C::RC;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  M* Ks = reinterpret_cast<M*>(smem_raw);  // [BK][LD]
  M* Vs = Ks + BK * LD;                    // [BK][LD]
  M* Qs = Vs + BK * LD;                    // [BQ][LD]
  M* Gs = Qs + BQ * LD;                    // [BQ][LD] dO
  M* Pt = Gs + BQ * LD;                    // [BK][LT] P^T
  M* dSt = Pt + BK * LT;                   // [BK][LT] dS^T
  M* Ls = dSt + BK * LT;                   // [BQ] lse of the query tile
  M* Dl = Ls + BQ;                         // [BQ] delta of the query tile

  const int64_t b = blockIdx.x % B;
  const int kb = static_cast<int>(blockIdx.x / B);  // causal: the first keys see the most queries
  const int k0 = kb * BK, nk = imin(BK, Tk - k0);
  const int tx = threadIdx.x % kSide, ty = threadIdx.x / kSide;
  const M ninf = neg_inf<M>();

  load_tile_pair<BK, HD>(Ks, Vs, k, v, b * Tk + k0, nk, D, Dv);
  M dK[RK][RC], dV[RK][RC];
  zero_tile(dK);
  zero_tile(dV);

  // Causal: queries before k0 see none of these keys (BQ == BK, so this is k0 itself).
  const int qstart = causal ? (k0 / BQ) * BQ : 0;
  for (int q0 = qstart; q0 < Tq; q0 += BQ) {
    const int nq = imin(BQ, Tq - q0);
    __syncthreads();  // done with the previous Qs, Gs, Pt, dSt, Ls, Dl
    load_tile_pair<BQ, HD>(Qs, Gs, q, g, b * Tq + q0, nq, D, Dv);
    for (int i = threadIdx.x; i < BQ; i += blockDim.x) {
      Ls[i] = i < nq ? lse[b * Tq + q0 + i] : ninf;
      Dl[i] = i < nq ? delta[b * Tq + q0 + i] : M(0);
    }
    __syncthreads();

    // s^T = K Q^T and dp^T = V dO^T for keys ty + 16 a, queries tx + 16 c
    M s[RK][RQ], dp[RK][RQ];
    scores_and_dp(s, dp, Ks, Qs, Vs, Gs, LD, D, Dv);
#pragma unroll
    for (int a = 0; a < RK; ++a) {
      const int key = ty + kSide * a;
#pragma unroll
      for (int c = 0; c < RQ; ++c) {
        const int qry = tx + kSide * c;
        const M Lq = Ls[qry];
        const bool keep = key < nk && qry < nq && visible(q0 + qry, k0 + key, causal) && Lq != ninf;
        const M p = keep ? dexp(s[a][c] * scale - Lq) : M(0);
        Pt[key * LT + qry] = p;
        dSt[key * LT + qry] = p * (dp[a][c] - Dl[qry]);
      }
    }
    __syncthreads();  // Pt, dSt complete

    // dV += P^T dO and dK += dS^T Q for keys ty + 16 a, columns tx + 16 c
    tile_mma(dV, Pt, LT, 1, Gs, 1, LD, nq);
    tile_mma(dK, dSt, LT, 1, Qs, 1, LD, nq);
  }

#pragma unroll
  for (int a = 0; a < RK; ++a) {
    const int kj = k0 + ty + kSide * a;
    if (kj >= Tk) continue;
#pragma unroll
    for (int c = 0; c < RC; ++c) {
      const int col = tx + kSide * c;
      if (dk && col < D) dk[(b * Tk + kj) * D + col] = static_cast<T>(dK[a][c] * scale);
      if (dv && col < Dv) dv[(b * Tk + kj) * Dv + col] = static_cast<T>(dV[a][c]);
    }
  }
}

// ---------------------------------------------------------------------------- host side

struct Shape {
  int64_t B;
  int Tq, Tk, D, Dv;
};

void check_same(const char* op, const char* name, const Tensor& t, DType dt, const IntList& sizes) {
  if (!t.defined()) return;
  KILN_CHECK(t.is_cuda() && t.is_contiguous(), op, ": ", name, " must be a contiguous CUDA tensor, got sizes ",
             t.sizes(), " on ", t.device());
  KILN_CHECK(t.dtype() == dt, op, ": ", name, " has dtype ", t.dtype(), ", expected ", dt);
  KILN_CHECK(t.sizes() == sizes, op, ": ", name, " has sizes ", t.sizes(), ", expected ", sizes);
}

// Checks q, k, v and returns the problem size; every limit gets an error naming the operands.
Shape check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v) {
  KILN_CHECK(q.defined() && k.defined() && v.defined(), op, ": q, k and v must be defined");
  KILN_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3 && k.size(0) == q.size(0) && v.size(0) == q.size(0) &&
                 k.size(2) == q.size(2) && v.size(1) == k.size(1),
             op, ": expected q [B, Tq, D], k [B, Tk, D], v [B, Tk, Dv], got q ", q.sizes(), ", k ", k.sizes(), ", v ",
             v.sizes());
  const DType dt = q.dtype();
  KILN_CHECK(is_floating(dt), op, ": expected floating-point q, k, v, got ", dt);
  check_same(op, "q", q, dt, q.sizes());
  check_same(op, "k", k, dt, k.sizes());
  check_same(op, "v", v, dt, v.sizes());
  const int64_t D = q.size(2), Dv = v.size(2), Tq = q.size(1), Tk = k.size(1);
  KILN_CHECK(D <= kMaxHeadDim && Dv <= kMaxHeadDim, op, ": the CUDA kernel takes head dims up to ", kMaxHeadDim,
             ", got D = ", D, ", Dv = ", Dv, " (q ", q.sizes(), ", v ", v.sizes(), ")");
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  KILN_CHECK(Tq < kIntMax / 2 && Tk < kIntMax / 2, op, ": sequence lengths Tq = ", Tq, ", Tk = ", Tk,
             " are too long for the CUDA kernel");
  // one block per 32 (or more) rows of each batch entry; grid.x is limited to 2^31 - 1
  KILN_CHECK(q.size(0) * ((std::max(Tq, Tk) + 31) / 32) < kIntMax, op, ": too many blocks for sizes q ", q.sizes(),
             ", k ", k.sizes());
  return Shape{q.size(0), static_cast<int>(Tq), static_cast<int>(Tk), static_cast<int>(D), static_cast<int>(Dv)};
}

template <class F> void dispatch_head_dim(int hd, F&& f) {
  if (hd <= 32) return f(std::integral_constant<int, 32>{});
  if (hd <= 64) return f(std::integral_constant<int, 64>{});
  return f(std::integral_constant<int, 128>{});  // check_qkv bounds it by kMaxHeadDim
}

// Opts the kernel into `bytes` of dynamic shared memory (needed above 48 KB), after checking that
// the device has that much per block.
template <class Kernel> void use_smem(Kernel kernel, size_t bytes, const char* op) {
  int dev = 0, optin = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  KILN_CHECK(bytes <= static_cast<size_t>(optin), op, ": the kernel needs ", bytes,
             " bytes of shared memory per block, the device allows ", optin);
  if (bytes > 48 * 1024)
    KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

}  // namespace

int64_t attention_max_head_dim() { return kMaxHeadDim; }

void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       double scale, bool causal) {
  const char* op = "scaled_dot_product_attention (CUDA)";
  const Shape s = check_qkv(op, q, k, v);
  check_same(op, "out", out, q.dtype(), {s.B, s.Tq, s.Dv});
  check_same(op, "lse", lse, norm_stat_dtype(q.dtype()), {s.B, s.Tq});
  KILN_CHECK(out.defined() && lse.defined(), op, ": out and lse must be defined");
  if (s.B == 0 || s.Tq == 0) return;
  DeviceGuard guard(q);
  dispatch_floating(q.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = opmath_t<T>;
    dispatch_head_dim(std::max(s.D, s.Dv), [&](auto hd) {
      constexpr int HD = decltype(hd)::value;
      using C = Tile<M, HD>;
      auto kernel = attention_forward_kernel<T, M, HD>;
      use_smem(kernel, C::forward_smem, op);
      const int64_t blocks = s.B * ((s.Tq + C::BQ - 1) / C::BQ);
      kernel<<<static_cast<unsigned>(blocks), kThreads, C::forward_smem, stream_for(q)>>>(
          static_cast<const T*>(q.data_ptr()), static_cast<const T*>(k.data_ptr()), static_cast<const T*>(v.data_ptr()),
          static_cast<T*>(out.data_ptr()), static_cast<M*>(lse.data_ptr()), s.B, s.Tq, s.Tk, s.D, s.Dv,
          static_cast<M>(scale), causal);
      KILN_CUDA_CHECK_LAUNCH("attention_forward_kernel");
    });
  });
}
KILN_REGISTER_KERNEL(kernels::attention_forward, CUDA, attention_forward);

void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& g, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, double scale,
                        bool causal) {
  const char* op = "scaled_dot_product_attention_backward (CUDA)";
  const Shape s = check_qkv(op, q, k, v);
  const DType dt = q.dtype();
  KILN_CHECK(g.defined() && out.defined() && lse.defined(), op, ": g, out and lse must be defined");
  check_same(op, "g", g, dt, {s.B, s.Tq, s.Dv});
  check_same(op, "out", out, dt, {s.B, s.Tq, s.Dv});
  check_same(op, "lse", lse, norm_stat_dtype(dt), {s.B, s.Tq});
  check_same(op, "dq", dq, dt, q.sizes());
  check_same(op, "dk", dk, dt, k.sizes());
  check_same(op, "dv", dv, dt, v.sizes());
  if (s.B == 0) return;
  DeviceGuard guard(q);
  cudaStream_t stream = stream_for(q);
  // delta_i = sum_c g_ic out_ic, in the stat dtype (a temporary from the stream-ordered allocator)
  Tensor delta = empty({s.B, s.Tq}, lse.options());
  dispatch_floating(dt, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = opmath_t<T>;
    const T* qp = static_cast<const T*>(q.data_ptr());
    const T* kp = static_cast<const T*>(k.data_ptr());
    const T* vp = static_cast<const T*>(v.data_ptr());
    const T* gp = static_cast<const T*>(g.data_ptr());
    const M* lp = static_cast<const M*>(lse.data_ptr());
    M* deltap = static_cast<M*>(delta.data_ptr());
    const M sc = static_cast<M>(scale);
    const int64_t rows = s.B * s.Tq;
    if (rows > 0) {
      const int64_t warps_per_block = kThreads / 32;
      const unsigned blocks =
          static_cast<unsigned>(std::min<int64_t>((rows + warps_per_block - 1) / warps_per_block, 65535 * 8));
      attention_delta_kernel<T, M>
          <<<blocks, kThreads, 0, stream>>>(gp, static_cast<const T*>(out.data_ptr()), deltap, rows, s.Dv);
      KILN_CUDA_CHECK_LAUNCH("attention_delta_kernel");
    }
    dispatch_head_dim(std::max(s.D, s.Dv), [&](auto hd) {
      constexpr int HD = decltype(hd)::value;
      using C = Tile<M, HD>;
      if (dq.defined() && s.Tq > 0) {
        auto kernel = attention_backward_dq_kernel<T, M, HD>;
        use_smem(kernel, C::dq_smem, op);
        const int64_t blocks = s.B * ((s.Tq + C::BQ - 1) / C::BQ);
        kernel<<<static_cast<unsigned>(blocks), kThreads, C::dq_smem, stream>>>(
            qp, kp, vp, gp, lp, deltap, static_cast<T*>(dq.data_ptr()), s.B, s.Tq, s.Tk, s.D, s.Dv, sc, causal);
        KILN_CUDA_CHECK_LAUNCH("attention_backward_dq_kernel");
      }
      if ((dk.defined() || dv.defined()) && s.Tk > 0) {
        auto kernel = attention_backward_dkdv_kernel<T, M, HD>;
        use_smem(kernel, C::dkdv_smem, op);
        const int64_t blocks = s.B * ((s.Tk + C::BK - 1) / C::BK);
        kernel<<<static_cast<unsigned>(blocks), kThreads, C::dkdv_smem, stream>>>(
            qp, kp, vp, gp, lp, deltap, dk.defined() ? static_cast<T*>(dk.data_ptr()) : nullptr,
            dv.defined() ? static_cast<T*>(dv.data_ptr()) : nullptr, s.B, s.Tq, s.Tk, s.D, s.Dv, sc, causal);
        KILN_CUDA_CHECK_LAUNCH("attention_backward_dkdv_kernel");
      }
    });
  });
}
KILN_REGISTER_KERNEL(kernels::attention_backward, CUDA, attention_backward);

}  // namespace kiln::kernels::cuda
