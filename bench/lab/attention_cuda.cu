// lab_attention_cuda: fused scaled-dot-product attention on the GPU, forward only,
//   O = softmax(Q K^T / sqrt(D) [+ causal mask]) V,  lse_i = ln sum_j exp(S_ij),  Q, K, V, O [B, H, T, D],
// from a plain f32 kernel to the FlashAttention-2 structure on tensor cores. Standalone (CUDA
// runtime only). TFLOP/s counts 4 B H T^2 D (the two products; half of it with --causal), against
// peaks measured in the same run: f32 FMA chains for versions 1-2, chains of mma.sync m16n8k16
// bf16 for versions 3-4 (the instruction's own ceiling, below the wgmma peak of Hopper).
//
//   1 f32 tiles       kiln's current kernel (kiln/kernels/cuda/attention.cu) re-written for the lab:
//                     256 threads as a 16 x 16 grid over a 64 x 64 score tile, f32 Q, K, V tiles in
//                     shared memory, scalar FMAs, an online softmax with expf, P written to shared
//                     memory and read back for P V; causal key tiles past the block are skipped and
//                     the longest blocks start first
//   2 bf16, P in regs bf16 K, V tiles in shared memory (half the bytes), filled and read with 128-bit
//                     loads; a quad of lanes owns a query row (each a quarter of D: q and O stay in
//                     registers), a score is a partial dot product summed by two xor-shuffles;
//                     scale * log2(e) is folded into q so exp is one exp2 (MUFU.EX2); the 64 scores
//                     of a tile and their P stay in registers (no shared-memory round trip)
//   3 tensor cores    FlashAttention-2: 4 warps own 16 query rows each; S = Q K^T and O += P V are
//                     mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, operands read by ldmatrix
//                     (K as is, V with .trans) from shared tiles whose rows are padded by 16 bytes
//                     (no bank conflicts); P's f32 accumulators are packed to bf16 into the very
//                     registers that are the A operand of P V (the C and A fragment layouts agree)
//   4 + pipeline      XOR-swizzled shared tiles (no padding, conflict-free ldmatrix, 16-byte chunks
//                     for cp.async), K/V tiles double-buffered with cp.async (the next tile loads
//                     while this one is multiplied), the mask evaluated only on the tiles that need
//                     it (the causal diagonal, the tail past T), causal blocks ordered longest first
//
// Versions 3 and 4 share their fragment and softmax code with a host model (attention_model.h),
// checked on a CPU by tests/core/test_attention_model.cpp: the kernel calls the same __host__
// __device__ helpers the model does. Backward (dQ, dK, dV) would be version 5; not written yet.
//
// Inputs are normal(0, 1) rounded to bf16, so every version sees the same values (version 1 as
// f32). Validation against an f64 reference (attention_model.h derives the bounds): an output is
// measured relative to (P|V)_ic = sum_j p_ij |v_jc|, with tolerance 2 eps_p + 2 gamma_T + 8 u, plus
// 2^-8 where P is rounded to bf16 (3, 4) and 2^-8 where O is stored as bf16 (2, 3, 4); eps_p is the
// relative error of p from S in f32 (gamma_D sum_d |q_d k_d| / sqrt(D)) and exp2, gamma_n = n u / (1 - n u),
// u = 2^-24. lse is measured relative to 1 + |lse| with tolerance eps_p + 2 gamma_T + 8 u.
//
//   nvcc -std=c++17 -O3 -arch=sm_90 -I bench/lab bench/lab/attention_cuda.cu -o lab_attention_cuda
//   lab_attention_cuda [VERSION|all] [--size B,H,T,D] [--causal] [--repeats N] [--warmup N] [--budget S]
#include <cuda_runtime.h>

#include <thread>

#include "attention_model.h"
#include "lab_cuda.cuh"

namespace {

namespace at = lab::attention;

const char* kUsage =
    "  --size B,H,T,D   batch, heads, sequence length, head dim (default 8,12,1024,64; D = 64 or 128)\n"
    "  --causal         causal mask (query i sees keys j <= i)\n"
    "versions: 1 f32 tiles, 2 bf16 tiles with P in registers, 3 tensor cores (FA2), 4 swizzle + cp.async\n";

struct Args {  // device pointers and sizes shared by every version
  const float *q32, *k32, *v32;
  const uint16_t *q16, *k16, *v16;  // bf16 bits
  float* out32;                     // version 1
  uint16_t* out16;                  // versions 2-4 (bf16 bits)
  float* lse;
  int BH, T, D;
  bool causal;
};

// ------------------------------------------------------------------ 1: f32 tiles (kiln's kernel)
// A block owns BQ query rows and walks the key tiles; thread (ty, tx) of a 16 x 16 grid owns rows
// ty + 16 i and keys (or output columns) tx + 16 j of every register tile. Every score costs D
// shared-memory reads of Q and K per thread pair, P goes through shared memory, and every multiply
// is a scalar f32 FMA: the tensor cores stay idle.
template <int D> struct V1 {
  static constexpr int BQ = D <= 64 ? 64 : 32, BK = BQ, LD = D + 1, LP = BK + 1;
  static constexpr int RQ = BQ / 16, RK = BK / 16, RC = D / 16;
  static constexpr size_t smem = sizeof(float) * (BQ * LD + 2 * BK * LD + BQ * LP);
};

__device__ __forceinline__ float row16_max(float v) {
  for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float row16_sum(float v) {
  for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <int D> __global__ void __launch_bounds__(256) v1_kernel(Args a, float scale) {
  using C = V1<D>;
  constexpr int BQ = C::BQ, BK = C::BK, LD = C::LD, LP = C::LP, RQ = C::RQ, RK = C::RK, RC = C::RC;
  extern __shared__ __align__(16) float sm1[];
  float *Qs = sm1, *Ks = Qs + BQ * LD, *Vs = Ks + BK * LD, *Ps = Vs + BK * LD;
  const int T = a.T, bh = blockIdx.x % a.BH;
  const int qb = (T + BQ - 1) / BQ - 1 - static_cast<int>(blockIdx.x / a.BH);  // last query tile first
  const int q0 = qb * BQ, nq = min(BQ, T - q0), tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t head = static_cast<int64_t>(bh) * T * D;
  const float *q = a.q32 + head, *k = a.k32 + head, *v = a.v32 + head;
  for (int i = threadIdx.x; i < BQ * D; i += 256) {
    const int r = i / D, c = i % D;
    Qs[r * LD + c] = r < nq ? q[static_cast<int64_t>(q0 + r) * D + c] : 0.f;
  }
  float m[RQ], l[RQ], acc[RQ][RC];
  for (int i = 0; i < RQ; ++i) {
    m[i] = -INFINITY, l[i] = 0;
    for (int c = 0; c < RC; ++c) acc[i][c] = 0;
  }
  const int kend = a.causal ? min(T, q0 + nq) : T;  // keys after the block's last row: all masked
  for (int k0 = 0; k0 < kend; k0 += BK) {
    const int nk = min(BK, kend - k0);
    __syncthreads();  // every thread is done with the previous Ks, Vs, Ps
    for (int i = threadIdx.x; i < BK * D; i += 256) {
      const int r = i / D, c = i % D;
      Ks[r * LD + c] = r < nk ? k[static_cast<int64_t>(k0 + r) * D + c] : 0.f;
      Vs[r * LD + c] = r < nk ? v[static_cast<int64_t>(k0 + r) * D + c] : 0.f;
    }
    __syncthreads();
    float s[RQ][RK] = {};
    for (int d = 0; d < D; ++d) {
      float qa[RQ], kb[RK];
#pragma unroll
      for (int i = 0; i < RQ; ++i) qa[i] = Qs[(ty + 16 * i) * LD + d];
#pragma unroll
      for (int j = 0; j < RK; ++j) kb[j] = Ks[(tx + 16 * j) * LD + d];
#pragma unroll
      for (int i = 0; i < RQ; ++i)
#pragma unroll
        for (int j = 0; j < RK; ++j) s[i][j] += qa[i] * kb[j];
    }
#pragma unroll
    for (int i = 0; i < RQ; ++i) {
      const int row = ty + 16 * i, qi = q0 + row;
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < RK; ++j) {
        const int col = tx + 16 * j;
        s[i][j] = (col < nk && (!a.causal || k0 + col <= qi)) ? s[i][j] * scale : -INFINITY;
        mx = fmaxf(mx, s[i][j]);
      }
      const float mnew = fmaxf(row16_max(mx), m[i]);
      const bool none = mnew == -INFINITY;  // no visible key yet: keep zeros, never exp(-inf + inf)
      const float corr = none ? 1.f : expf(m[i] - mnew);
      float psum = 0;
#pragma unroll
      for (int j = 0; j < RK; ++j) {
        const float p = none ? 0.f : expf(s[i][j] - mnew);
        Ps[row * LP + tx + 16 * j] = p;
        psum += p;
      }
      l[i] = l[i] * corr + row16_sum(psum);
      m[i] = mnew;
#pragma unroll
      for (int c = 0; c < RC; ++c) acc[i][c] *= corr;
    }
    __syncthreads();  // Ps complete
    for (int j = 0; j < nk; ++j) {
      float pa[RQ], vb[RC];
#pragma unroll
      for (int i = 0; i < RQ; ++i) pa[i] = Ps[(ty + 16 * i) * LP + j];
#pragma unroll
      for (int c = 0; c < RC; ++c) vb[c] = Vs[j * LD + tx + 16 * c];
#pragma unroll
      for (int i = 0; i < RQ; ++i)
#pragma unroll
        for (int c = 0; c < RC; ++c) acc[i][c] += pa[i] * vb[c];
    }
  }
#pragma unroll
  for (int i = 0; i < RQ; ++i) {
    const int qi = q0 + ty + 16 * i;
    if (qi >= T) continue;
    const float inv = l[i] > 0 ? 1.f / l[i] : 0.f;
#pragma unroll
    for (int c = 0; c < RC; ++c) a.out32[head + static_cast<int64_t>(qi) * D + tx + 16 * c] = acc[i][c] * inv;
    if (tx == 0) a.lse[static_cast<int64_t>(bh) * T + qi] = l[i] > 0 ? m[i] + logf(l[i]) : -INFINITY;
  }
}

template <int D> void v1_launch(const Args& a) {
  const int tiles = (a.T + V1<D>::BQ - 1) / V1<D>::BQ;
  v1_kernel<D><<<tiles * a.BH, 256, V1<D>::smem>>>(a, static_cast<float>(1.0 / std::sqrt(double(D))));
  LAUNCH_CHECK();
}
void v1_forward(const Args& a) { a.D == 64 ? v1_launch<64>(a) : v1_launch<128>(a); }

// ------------------------------------------------------------------ 2: bf16 tiles, P in registers
// Four lanes (a quad) share a query row, each holding a quarter of q (scaled by scale * log2(e))
// and of the O accumulator in registers. For each key of a tile, a lane reads its quarter of the
// key row from shared memory (16-byte loads; the 8 quads of a warp read the same row, which the
// shared memory broadcasts), and two xor-shuffles complete the dot product in all four lanes. The
// tile's 64 scores stay in registers through the max, the exp2 and P V: nothing goes back to
// shared memory, and the tiles there are bf16, half the bytes of version 1's.
__device__ __forceinline__ void unpack8(const uint4& w, float (&f)[8]) {
  const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i)
    f[2 * i] = __uint_as_float(u[i] << 16), f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
}

// rows [r0, r0 + 64) of a head's [T, D] bf16 matrix into a [64][ld] shared tile, 16 bytes per load,
// zero past T; `swizzle`: at::smem_offset's XOR swizzle
template <int D, int LD, bool kSwizzle>
__device__ __forceinline__ void load_tile_sync(uint16_t* dst, const uint16_t* src, int r0, int T, int threads) {
  constexpr int kChunks = 64 * D / 8;
  for (int c = threadIdx.x; c < kChunks; c += threads) {
    const int r = c / (D / 8), col = (c % (D / 8)) * 8;
    uint4 w = make_uint4(0, 0, 0, 0);
    if (r0 + r < T) w = *reinterpret_cast<const uint4*>(src + static_cast<int64_t>(r0 + r) * D + col);
    *reinterpret_cast<uint4*>(dst + at::smem_offset(r, col, LD, kSwizzle)) = w;
  }
}

template <int D> __global__ void __launch_bounds__(128) v2_kernel(Args a, float scale_log2) {
  constexpr int kRows = 32, kBc = 64, kPart = D / 4;
  __shared__ __align__(16) uint16_t Ks[kBc * D], Vs[kBc * D];
  const int T = a.T, bh = blockIdx.y, q0 = blockIdx.x * kRows;
  const int row = q0 + threadIdx.x / 4, part = threadIdx.x % 4;
  const int64_t head = static_cast<int64_t>(bh) * T * D;
  float qr[kPart], o[kPart];
#pragma unroll
  for (int c = 0; c < kPart / 8; ++c) {
    uint4 w = make_uint4(0, 0, 0, 0);
    if (row < T)
      w = *reinterpret_cast<const uint4*>(a.q16 + head + static_cast<int64_t>(row) * D + part * kPart + 8 * c);
    float f[8];
    unpack8(w, f);
#pragma unroll
    for (int e = 0; e < 8; ++e) qr[8 * c + e] = f[e] * scale_log2, o[8 * c + e] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  const int kend = a.causal ? min(T, q0 + kRows) : T;
  for (int k0 = 0; k0 < kend; k0 += kBc) {
    __syncthreads();
    load_tile_sync<D, D, false>(Ks, a.k16 + head, k0, T, 128);
    load_tile_sync<D, D, false>(Vs, a.v16 + head, k0, T, 128);
    __syncthreads();
    float s[kBc];
    float mx = m;
#pragma unroll
    for (int j = 0; j < kBc; ++j) {
      float acc = 0.f;
#pragma unroll
      for (int c = 0; c < kPart / 8; ++c) {
        float f[8];
        unpack8(*reinterpret_cast<const uint4*>(Ks + j * D + part * kPart + 8 * c), f);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc += qr[8 * c + e] * f[e];
      }
      acc += __shfl_xor_sync(0xffffffffu, acc, 1);
      acc += __shfl_xor_sync(0xffffffffu, acc, 2);
      const int key = k0 + j;
      s[j] = (key >= T || (a.causal && key > row)) ? -INFINITY : acc;
      mx = fmaxf(mx, s[j]);
    }
    const float base = mx == -INFINITY ? 0.f : mx;
    const float alpha = at::exp2_approx(m - base);
    m = mx;
    l *= alpha;
#pragma unroll
    for (int c = 0; c < kPart; ++c) o[c] *= alpha;
#pragma unroll
    for (int j = 0; j < kBc; ++j) {
      const float p = at::exp2_approx(s[j] - base);
      l += p;
#pragma unroll
      for (int c = 0; c < kPart / 8; ++c) {
        float f[8];
        unpack8(*reinterpret_cast<const uint4*>(Vs + j * D + part * kPart + 8 * c), f);
#pragma unroll
        for (int e = 0; e < 8; ++e) o[8 * c + e] += p * f[e];
      }
    }
  }
  if (row >= T) return;
  const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
  for (int c = 0; c < kPart / 8; ++c) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = at::pack_bf16x2(o[8 * c + 2 * i] * inv, o[8 * c + 2 * i + 1] * inv);
    *reinterpret_cast<uint4*>(a.out16 + head + static_cast<int64_t>(row) * D + part * kPart + 8 * c) =
        make_uint4(w[0], w[1], w[2], w[3]);
  }
  if (part == 0)
    a.lse[static_cast<int64_t>(bh) * T + row] = l > 0.f ? m * static_cast<float>(at::kLn2) + logf(l) : -INFINITY;
}

template <int D> void v2_launch(const Args& a) {
  v2_kernel<D><<<dim3((a.T + 31) / 32, a.BH), 128>>>(a, static_cast<float>(1.0 / std::sqrt(double(D))) * at::kLog2e);
  LAUNCH_CHECK();
}
void v2_forward(const Args& a) { a.D == 64 ? v2_launch<64>(a) : v2_launch<128>(a); }

// ------------------------------------------------------------------ 3, 4: tensor cores (FlashAttention-2)
// The warp-collective instructions; the lanes' addresses and the fragment bookkeeping come from
// attention_model.h, which models exactly these instructions on the host.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const uint16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const uint16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
// d += a b: A 16x16 bf16 (4 registers), B 16x8 bf16 (2), D 16x8 f32 (4)
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// 16 bytes global -> shared without passing through registers; src_bytes = 0 fills zeros
__device__ __forceinline__ void cp_async_16(uint16_t* dst, const uint16_t* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// rows [r0, r0 + 64) of a [T, D] bf16 matrix into a swizzled [64][D] tile by cp.async, zero past T
template <int D> __device__ __forceinline__ void load_tile_async(uint16_t* dst, const uint16_t* src, int r0, int T) {
  constexpr int kChunks = 64 * D / 8;
  for (int c = threadIdx.x; c < kChunks; c += 128) {
    const int r = c / (D / 8), col = (c % (D / 8)) * 8;
    const bool valid = r0 + r < T;
    cp_async_16(dst + at::smem_offset(r, col, D, true), valid ? src + static_cast<int64_t>(r0 + r) * D + col : src,
                valid);
  }
}

template <int D, bool kV4> struct Fa2Smem {
  static constexpr int LD = kV4 ? D : at::Fa2<D>::kLdPad;  // 4: swizzled, 3: padded rows
  static constexpr int kStages = kV4 ? 2 : 1;              // K/V buffers
  static constexpr size_t bytes = sizeof(uint16_t) * LD * (at::Fa2<D>::kBr + 2 * kStages * at::Fa2<D>::kBc);
  static_assert(bytes <= 227 * 1024, "shared memory per block on sm_90");
};

// One block: 64 query rows (4 warps x 16) of one head. kV4 = false is version 3, true version 4.
template <int D, bool kV4> __global__ void __launch_bounds__(128) fa2_kernel(Args a, float scale_log2) {
  using F = at::Fa2<D>;
  constexpr int LD = Fa2Smem<D, kV4>::LD, kStages = Fa2Smem<D, kV4>::kStages, kTile = F::kBc * LD;
  extern __shared__ __align__(128) uint16_t sm2[];
  uint16_t *Qs = sm2, *Ks = Qs + F::kBr * LD, *Vs = Ks + kStages * kTile;
  const int T = a.T, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // 3: blocks in order; 4: blockIdx.y = 0 are the last query tiles of every head (causal: the most key tiles)
  const int bh = kV4 ? blockIdx.x : blockIdx.y;
  const int qt = kV4 ? (T + F::kBr - 1) / F::kBr - 1 - static_cast<int>(blockIdx.y) : static_cast<int>(blockIdx.x);
  const int q0 = qt * F::kBr, row0 = q0 + 16 * warp;
  const int64_t head = static_cast<int64_t>(bh) * T * D;
  const uint16_t *q = a.q16 + head, *k = a.k16 + head, *v = a.v16 + head;
  const int tiles = at::key_tiles(q0, F::kBr, T, F::kBc, a.causal);

  if constexpr (kV4) {
    load_tile_async<D>(Qs, q, q0, T);
    cp_async_commit();
    load_tile_async<D>(Ks, k, 0, T);
    load_tile_async<D>(Vs, v, 0, T);
    cp_async_commit();
    cp_async_wait<1>();  // Q has landed (K, V of tile 0 may still be in flight)
  } else {
    load_tile_sync<D, LD, false>(Qs, q, q0, T, 128);
  }
  __syncthreads();
  uint32_t qf[F::kKQ][4];  // this warp's 16 rows of Q as A fragments, for every tile
#pragma unroll
  for (int kk = 0; kk < F::kKQ; ++kk) {
    const at::RowCol rc = at::ldsm_q_addr(lane);
    ldmatrix_x4(qf[kk], Qs + at::smem_offset(16 * warp + rc.row, 16 * kk + rc.col, LD, kV4));
  }
  at::LaneState<D> st;
  at::lane_init(st);

  for (int t = 0; t < tiles; ++t) {
    const int key0 = t * F::kBc;
    if constexpr (kV4) {
      if (t + 1 < tiles) {  // the next tile into the other buffer while this one is multiplied
        load_tile_async<D>(Ks + ((t + 1) & 1) * kTile, k, key0 + F::kBc, T);
        load_tile_async<D>(Vs + ((t + 1) & 1) * kTile, v, key0 + F::kBc, T);
        cp_async_commit();
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
    } else {
      __syncthreads();  // every warp is done with the previous tile
      load_tile_sync<D, LD, false>(Ks, k, key0, T, 128);
      load_tile_sync<D, LD, false>(Vs, v, key0, T, 128);
    }
    __syncthreads();
    const uint16_t *Kt = Ks + (kV4 ? (t & 1) * kTile : 0), *Vt = Vs + (kV4 ? (t & 1) * kTile : 0);
    if (at::warp_sees_tile(row0, key0, a.causal)) {
      // S = Q K^T: C fragment n holds keys key0 + 8n .. + 7
      float s[F::kNS][4];
#pragma unroll
      for (int n = 0; n < F::kNS; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < F::kKQ; ++kk)
#pragma unroll
        for (int np = 0; np < F::kNS / 2; ++np) {
          uint32_t kb[4];
          const at::RowCol rc = at::ldsm_k_addr(lane);
          ldmatrix_x4(kb, Kt + at::smem_offset(16 * np + rc.row, 16 * kk + rc.col, LD, kV4));
          mma_bf16_16816(s[2 * np], qf[kk], kb[0], kb[1]);
          mma_bf16_16816(s[2 * np + 1], qf[kk], kb[2], kb[3]);
        }
      // the online softmax (the same helpers the host model runs)
      const bool mask = !kV4 || at::tile_needs_mask(row0, key0, F::kBc, T, a.causal);
      at::scale_and_mask<D>(s, lane, row0, key0, T, a.causal, scale_log2, mask);
      float mx[2];
      at::lane_row_max<D>(s, st, mx);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      }
      uint32_t p[F::kKP][4];  // P as A fragments, never through shared memory
      at::softmax_update<D>(s, mx, st, p);
      // O += P V
#pragma unroll
      for (int j = 0; j < F::kKP; ++j)
#pragma unroll
        for (int np = 0; np < F::kNO / 2; ++np) {
          uint32_t vb[4];
          const at::RowCol rc = at::ldsm_v_addr(lane);
          ldmatrix_x4_trans(vb, Vt + at::smem_offset(16 * j + rc.row, 16 * np + rc.col, LD, kV4));
          mma_bf16_16816(st.o[2 * np], p[j], vb[0], vb[1]);
          mma_bf16_16816(st.o[2 * np + 1], p[j], vb[2], vb[3]);
        }
    }
    if constexpr (kV4) __syncthreads();  // this buffer is refilled two tiles on, by the next iteration's loads
  }

  // the quad's row sums, O / l, lse; stores by the C layout (2 bf16 per 32-bit store)
  float l[2] = {st.l[0], st.l[1]}, lse[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  at::finish_rows<D>(st, l, lse);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + at::group_id(lane) + 8 * r;
    if (row >= T) continue;
#pragma unroll
    for (int n = 0; n < F::kNO; ++n)
      *reinterpret_cast<uint32_t*>(a.out16 + head + static_cast<int64_t>(row) * D + 8 * n + at::c_col(lane, 2 * r)) =
          at::pack_bf16x2(st.o[n][2 * r], st.o[n][2 * r + 1]);
    if (at::thread_in_group(lane) == 0) a.lse[static_cast<int64_t>(bh) * T + row] = lse[r];
  }
}

template <int D, bool kV4> void fa2_launch(const Args& a) {
  const int tiles = (a.T + at::Fa2<D>::kBr - 1) / at::Fa2<D>::kBr;
  const dim3 grid = kV4 ? dim3(a.BH, tiles) : dim3(tiles, a.BH);
  fa2_kernel<D, kV4>
      <<<grid, 128, Fa2Smem<D, kV4>::bytes>>>(a, static_cast<float>(1.0 / std::sqrt(double(D))) * at::kLog2e);
  LAUNCH_CHECK();
}
void v3_forward(const Args& a) { a.D == 64 ? fa2_launch<64, false>(a) : fa2_launch<128, false>(a); }
void v4_forward(const Args& a) { a.D == 64 ? fa2_launch<64, true>(a) : fa2_launch<128, true>(a); }

// every kernel with more than 48 KB of dynamic shared memory opts in
void allow_shared_memory() {
  auto allow = [](const void* kernel, size_t bytes) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  };
  allow(reinterpret_cast<const void*>(v1_kernel<64>), V1<64>::smem);
  allow(reinterpret_cast<const void*>(v1_kernel<128>), V1<128>::smem);
  allow(reinterpret_cast<const void*>(fa2_kernel<64, false>), Fa2Smem<64, false>::bytes);
  allow(reinterpret_cast<const void*>(fa2_kernel<128, false>), Fa2Smem<128, false>::bytes);
  allow(reinterpret_cast<const void*>(fa2_kernel<64, true>), Fa2Smem<64, true>::bytes);
  allow(reinterpret_cast<const void*>(fa2_kernel<128, true>), Fa2Smem<128, true>::bytes);
}

// ------------------------------------------------------------------ peaks measured in this run

// f32: 8 independent FMA chains per thread, enough blocks to fill every SM.
__global__ void fma_peak_kernel(float* sink, int iters) {
  float x[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) x[i] = threadIdx.x * 1e-3f + i;
  for (int it = 0; it < iters; ++it)
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = fmaf(x[i], 0.999999f, 1e-7f);
  float s = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) s += x[i];
  if (s == 12345.f) sink[0] = s;  // keeps the chains
}

// mma.sync m16n8k16 bf16: 8 independent accumulator chains per warp.
__global__ void mma_peak_kernel(float* sink, int iters) {
  const uint32_t a[4] = {at::pack_bf16x2(1e-3f, 2e-3f), at::pack_bf16x2(3e-3f, threadIdx.x * 1e-5f),
                         at::pack_bf16x2(1e-3f, 1e-3f), at::pack_bf16x2(2e-3f, 1e-3f)};
  const uint32_t b0 = at::pack_bf16x2(1e-2f, 2e-2f), b1 = at::pack_bf16x2(3e-2f, 1e-2f);
  float c[8][4] = {};
  for (int it = 0; it < iters; ++it)
#pragma unroll
    for (int i = 0; i < 8; ++i) mma_bf16_16816(c[i], a, b0, b1);
  float s = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) s += c[i][0] + c[i][1] + c[i][2] + c[i][3];
  if (s == 12345.f) sink[0] = s;
}

// TFLOP/s of a peak kernel: the best of 5 launches of SMs x blocks_per_sm blocks of 256 threads
template <class Kernel>
double peak_tflops(Kernel kernel, int sms, int blocks_per_sm, int iters, double flops_per_thread_iter) {
  lab::DeviceBuffer<float> sink(1);
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  auto launch = [&] {
    kernel<<<sms * blocks_per_sm, 256>>>(sink.data(), iters);
    LAUNCH_CHECK();
  };
  launch();  // warm-up
  double best = 1e30;
  for (int i = 0; i < 5; ++i) best = std::min(best, lab::time_events_ms(launch, 1, e0, e1));
  CUDA_CHECK(cudaEventDestroy(e0));
  CUDA_CHECK(cudaEventDestroy(e1));
  return double(sms) * blocks_per_sm * 256 * iters * flops_per_thread_iter / (best / 1e3) / 1e12;
}

// ------------------------------------------------------------------ reference and driver

struct Version {
  const char* name;
  void (*run)(const Args&);
  bool bf16_p, bf16_out;  // rounded to bf16: P before P V, O as stored
  int peak;               // 0: f32 FMA, 1: mma.sync bf16
};
const Version kVersions[] = {
    {"f32 tiles (kiln's kernel)", v1_forward, false, false, 0},         // 1
    {"bf16 tiles, exp2, P in registers", v2_forward, false, true, 0},   // 2
    {"mma.sync + ldmatrix (FA2)", v3_forward, true, true, 1},           // 3
    {"swizzle, cp.async x2, causal order", v4_forward, true, true, 1},  // 4
};

// The f64 reference of every head (attention_model.h), on every hardware thread.
struct Reference {
  std::vector<double> out, out_scale, lse;
  double eps_p = 0;
};
Reference reference(const float* q, const float* k, const float* v, int BH, int T, int D, bool causal) {
  Reference r;
  const size_t per = static_cast<size_t>(T) * D;
  r.out.resize(BH * per), r.out_scale.resize(BH * per), r.lse.resize(static_cast<size_t>(BH) * T);
  std::vector<double> eps(BH);
  const int n = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (int w = 0; w < n; ++w)
    pool.emplace_back([&, w] {
      for (int h = w; h < BH; h += n) {
        const at::HeadReference hr = at::reference_head(q + h * per, k + h * per, v + h * per, T, D, causal);
        std::copy(hr.out.begin(), hr.out.end(), r.out.begin() + h * per);
        std::copy(hr.out_scale.begin(), hr.out_scale.end(), r.out_scale.begin() + h * per);
        std::copy(hr.lse.begin(), hr.lse.end(), r.lse.begin() + static_cast<size_t>(h) * T);
        eps[h] = hr.eps_p;
      }
    });
  for (auto& t : pool) t.join();
  r.eps_p = *std::max_element(eps.begin(), eps.end());
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  // --causal is this program's own flag; the rest is the lab's common command line
  bool causal = false;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i)
    if (std::string(argv[i]) == "--causal") causal = true;
    else args.push_back(argv[i]);
  const lab::Options opt =
      lab::parse_args(static_cast<int>(args.size()), args.data(), kVersions, {8, 12, 1024, 64}, {4}, kUsage);
  const int B = static_cast<int>(opt.size[0]), H = static_cast<int>(opt.size[1]);
  const int T = static_cast<int>(opt.size[2]), D = static_cast<int>(opt.size[3]), BH = B * H;
  if ((D != 64 && D != 128) || T < 1 || BH < 1) {
    std::fprintf(stderr, "lab_attention_cuda: needs D = 64 or 128, T >= 1, B H >= 1\n%s", kUsage);
    return 2;
  }
  const cudaDeviceProp prop = lab::require_device("lab_attention_cuda");
  std::printf(
      "lab_attention_cuda: O = softmax(Q K^T / sqrt(D)%s) V, Q, K, V [B, H, T, D] = [%d, %d, %d, %d] bf16, "
      "forward\n",
      causal ? " + causal mask" : "", B, H, T, D);
  allow_shared_memory();

  const size_t n = static_cast<size_t>(BH) * T * D;
  std::vector<float> q(n), k(n), v(n);
  std::vector<uint16_t> q16(n), k16(n), v16(n);
  lab::fill_normal(q.data(), n, 1), lab::fill_normal(k.data(), n, 2), lab::fill_normal(v.data(), n, 3);
  for (size_t i = 0; i < n; ++i) {
    q16[i] = at::bf16_bits(q[i]), k16[i] = at::bf16_bits(k[i]), v16[i] = at::bf16_bits(v[i]);
    q[i] = at::bf16_float(q16[i]), k[i] = at::bf16_float(k16[i]), v[i] = at::bf16_float(v16[i]);
  }
  const Reference ref = reference(q.data(), k.data(), v.data(), BH, T, D, causal);

  lab::DeviceBuffer<float> d_q(n), d_k(n), d_v(n), d_out32(n), d_lse(static_cast<size_t>(BH) * T);
  lab::DeviceBuffer<uint16_t> d_q16(n), d_k16(n), d_v16(n), d_out16(n);
  d_q.upload(q.data()), d_k.upload(k.data()), d_v.upload(v.data());
  d_q16.upload(q16.data()), d_k16.upload(k16.data()), d_v16.upload(v16.data());
  const Args args_{d_q.data(),
                   d_k.data(),
                   d_v.data(),
                   d_q16.data(),
                   d_k16.data(),
                   d_v16.data(),
                   d_out32.data(),
                   d_out16.data(),
                   d_lse.data(),
                   BH,
                   T,
                   D,
                   causal};

  const int sms = prop.multiProcessorCount;
  const std::vector<lab::Peak> peaks{{"f32 FMA", peak_tflops(fma_peak_kernel, sms, 8, 4096, 16.0)},
                                     {"mma.sync bf16", peak_tflops(mma_peak_kernel, sms, 4, 1024, 8 * 4096.0 / 32)}};
  const double flops = (causal ? 2.0 : 4.0) * BH * double(T) * T * D;
  std::vector<float> out(n), lse(static_cast<size_t>(BH) * T);
  std::vector<uint16_t> out16(n);
  lab::Report report("TFLOP/s");
  report.header(peaks);
  for (int vi : opt.versions) {
    const Version& ver = kVersions[vi - 1];
    // the validating call: outputs poisoned (NaN) first, so an element a kernel misses fails
    if (vi == 1) d_out32.poison();
    else d_out16.poison();
    d_lse.poison();
    ver.run(args_);
    CUDA_CHECK(cudaDeviceSynchronize());
    if (vi == 1) {
      d_out32.download(out.data());
    } else {
      d_out16.download(out16.data());
      for (size_t i = 0; i < n; ++i) out[i] = at::bf16_float(out16[i]);
    }
    d_lse.download(lse.data());
    const at::Tolerance tol = at::tolerance(ref.eps_p, T, ver.bf16_p, ver.bf16_out);
    lab::Check c;
    c.compare("out", out.data(), ref.out.data(), static_cast<int64_t>(n), tol.out, [&](int64_t i) {
       return ref.out_scale[i] + 1e-300;
     }).compare("lse", lse.data(), ref.lse.data(), static_cast<int64_t>(BH) * T, tol.lse, [&](int64_t i) {
      return 1 + std::abs(ref.lse[i]);
    });
    report.row(
        vi, ver.name, 0, c, [&] { return lab::time_gpu([&] { ver.run(args_); }, opt); }, flops / 1e3, peaks[ver.peak]);
  }
  std::printf(
      "TFLOP/s: %s B H T^2 D / median time; %%peak: of the named peak; max err: worst |out - ref| / (P|V|) "
      "(lse: / (1 + |lse|)), tol from bf16 rounding (attention_model.h)\n",
      causal ? "2" : "4");
  return report.exit_code();
}
