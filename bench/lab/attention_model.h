#pragma once
// A host model of the tensor-core attention kernel of the lab (attention_cuda.cu, versions 3 and 4),
// so that its index arithmetic is checked on a CPU (tests/core/test_attention_model.cpp) before any
// GPU runs it. Plain C++17; the helpers marked LAB_HD are __host__ __device__ under nvcc and are
// called by the kernel itself, so the model and the kernel share one truth for:
//
//  (a) the fragments of mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (PTX ISA, "Matrix
//      Fragments for mma.m16n8k16 with floating point type"): with g = lane / 4 (groupID) and
//      t = lane % 4 (threadID_in_group), a lane holds
//        A 16x16 (4 registers, 2 bf16 each; element i = 0..7, register i / 2, low half first):
//          row g + 8 [i in {2,3,6,7}],  col 2t + (i & 1) + 8 [i >= 4]
//        B 16x8  (2 registers; element i = 0..3):  row (k) 2t + (i & 1) + 8 [i >= 2],  col (n) g
//        C/D 16x8 (4 f32; element i = 0..3):        row g + 8 [i >= 2],  col 2t + (i & 1)
//  (b) ldmatrix.sync.aligned.m8n8.x4{.trans}.shared.b16 (PTX ISA, "ldmatrix"): lane 8 m + r gives
//      the address of row r of 8x8 matrix m (8 consecutive b16, 16 bytes); register m of lane l
//      receives row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of matrix m, or with .trans the
//      transposed matrix's: rows 2 (l % 4) and 2 (l % 4) + 1 of column l / 4;
//  (c) the FlashAttention-2 forward per warp: a block of 4 warps owns 64 query rows, each warp 16
//      of them (its Q fragments loaded once by ldmatrix); for each tile of 64 keys it computes
//      S = Q K^T with m16n8k16 (K read by ldmatrix, no .trans: a row of K is a column of B), scales
//      by scale * log2(e) so that exp2 gives exp, masks, keeps a running max m and a per-lane
//      partial sum l per row (rows g and g + 8 of the warp), rescales its O accumulator by
//      exp2(m_old - m_new), and turns the C fragments of P = exp2(S - m) into the A fragments of
//      O += P V without leaving the registers (C fragments of key blocks 2j, 2j + 1 are the A
//      fragment of key block j of 16: the layouts of C and A agree row for row); V is read by
//      ldmatrix .trans. Causal key tiles past the block's last row are never loaded. At the end
//      the quad (the 4 lanes of a row) sums l, O is divided by l, and lse = m ln 2 + ln l.
//
// The model runs the same per-lane arithmetic as the kernel: the same fragments, the same helpers
// for scaling, masking, the online softmax and the bf16 packing of P; only the warp-collective
// instructions (ldmatrix, mma, the quad shuffles) are replaced by loops over the 32 lanes of
// modelled registers, reading a modelled shared memory laid out as the kernel lays it out (rows
// padded by 8 elements, or XOR-swizzled 16-byte chunks). A wrong lane or register index therefore
// gives a wrong result here, on a CPU; the mma's accumulation order inside the tensor core is not
// specified by PTX, so the model sums the 16 products in k order in f32 and the checks allow for
// any order.
//
// The f64 reference and its tolerances (used by the test and by the lab program):
//  - inputs are bf16 values, so products are exact in f32; S = q k^T over D terms in f32 errs by
//    at most gamma_D sum_d |q_d k_d| (gamma_n = n u / (1 - n u), u = 2^-24), which changes
//    p = exp(scale S) by the relative error eps_p = max_ij scale gamma_D sum_d |q_id k_jd| + 2^-21
//    (the last term: exp2 approximated to two ulps);
//  - l (f32 sum of T positive terms) and O's numerator (f32 sum of T products) add gamma_T each;
//  - when P is rounded to bf16 before P V (the tensor-core versions), each p_j gains a relative
//    error up to 2^-8; when O is stored as bf16, O gains 2^-8 |O| <= 2^-8 (P|V|);
//  so |O - O_ref| <= (2 eps_p + 2 gamma_T + [2^-8 bf16 P] + [2^-8 bf16 O] + 8 u) (P|V|)_ic, with
//  (P|V|)_ic = sum_j p_ij |v_jc|: the error of an output is measured relative to that scale.
//  lse_i = ln sum_j exp(scale S_ij) errs by at most eps_p + 2 gamma_T + 8 u (1 + |lse_i|).
//  These are worst-case bounds. An output whose scale is made of one or two keys' terms can come
//  within a factor of two of the bf16 term (one rounding of p, up to 2^-8 relative, is then the
//  whole error), so the bound is not loose where it matters; an index bug gives errors of order one.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__CUDACC__)
#define LAB_HD __host__ __device__ __forceinline__
#else
#define LAB_HD inline
#endif

namespace lab::attention {

constexpr int kWarp = 32;
constexpr float kLog2e = 1.4426950408889634f;
constexpr double kLn2 = 0.6931471805599453;

// ------------------------------------------------------------------------------ bf16

// x rounded to bf16 (round to nearest even), as bits; NaN stays a (quiet) NaN.
inline uint16_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
LAB_HD float bf16_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float x;
  memcpy(&x, &u, 4);
  return x;
}
inline float bf16_round(float x) { return bf16_float(bf16_bits(x)); }

// Two floats as a bf16x2 register: lo in bits 0-15 (the lower-numbered element of a fragment).
LAB_HD uint32_t pack_bf16x2(float lo, float hi) {
#ifdef __CUDA_ARCH__
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));  // d = {a: upper, b: lower}
  return r;
#else
  return static_cast<uint32_t>(bf16_bits(lo)) | (static_cast<uint32_t>(bf16_bits(hi)) << 16);
#endif
}
LAB_HD float lo_half(uint32_t r) { return bf16_float(static_cast<uint16_t>(r & 0xffffu)); }
LAB_HD float hi_half(uint32_t r) { return bf16_float(static_cast<uint16_t>(r >> 16)); }

// 2^x: one MUFU.EX2 on the GPU (ex2.approx: two ulps; 2^-inf = 0), the library's on the host.
LAB_HD float exp2_approx(float x) {
#ifdef __CUDA_ARCH__
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return std::exp2(x);
#endif
}

// ------------------------------------------------------------------------------ (a) mma fragments

LAB_HD constexpr int group_id(int lane) { return lane >> 2; }        // groupID
LAB_HD constexpr int thread_in_group(int lane) { return lane & 3; }  // threadID_in_group

// A 16x16 (row-major operand), element i = 0..7 of a lane (register i / 2, half i % 2).
LAB_HD constexpr int a_row(int lane, int i) { return group_id(lane) + 8 * ((i >> 1) & 1); }
LAB_HD constexpr int a_col(int lane, int i) { return 2 * thread_in_group(lane) + (i & 1) + 8 * (i >> 2); }
// B 16x8 (column operand), element i = 0..3: row = k, column = n.
LAB_HD constexpr int b_row(int lane, int i) { return 2 * thread_in_group(lane) + (i & 1) + 8 * (i >> 1); }
LAB_HD constexpr int b_col(int lane, int) { return group_id(lane); }
// C/D 16x8 (f32 accumulators), element i = 0..3.
LAB_HD constexpr int c_row(int lane, int i) { return group_id(lane) + 8 * (i >> 1); }
LAB_HD constexpr int c_col(int lane, int i) { return 2 * thread_in_group(lane) + (i & 1); }

// ------------------------------------------------------------------------------ (b) ldmatrix

// Which row of which 8x8 matrix a lane addresses in an ldmatrix .x4, and which element of which
// matrix lands in half h of register m of a lane.
LAB_HD constexpr int ldsm_matrix_of(int lane) { return lane >> 3; }
LAB_HD constexpr int ldsm_row_of(int lane) { return lane & 7; }
LAB_HD constexpr int ldsm_dst_row(int lane, int h, bool trans) { return trans ? 2 * (lane & 3) + h : lane >> 2; }
LAB_HD constexpr int ldsm_dst_col(int lane, int h, bool trans) { return trans ? lane >> 2 : 2 * (lane & 3) + h; }

struct RowCol {
  int row, col;
};

// The (row, col) a lane addresses, relative to the top-left of the 16x16 block being loaded, for
// the three operands of the kernel (each an ldmatrix .x4):
//  - Q as A: matrices (rows 0-7 | 8-15) x (cols 0-7 | 8-15) in the order of registers a0..a3;
//  - K as B of S = Q K^T (rows of the tile = keys = n, columns = head dim = k; no .trans, since
//    row n of K is column n of B): registers {0, 1} are the B fragment of keys 0-7 (k 0-7, 8-15),
//    {2, 3} of keys 8-15;
//  - V as B of O = P V (rows = keys = k, columns = head dim = n; .trans): registers {0, 1} are the B
//    fragment of columns 0-7 (k 0-7, 8-15), {2, 3} of columns 8-15. Its lanes address the same
//    (row, col) as Q's.
LAB_HD constexpr RowCol ldsm_q_addr(int lane) { return {lane & 15, 8 * (lane >> 4)}; }
LAB_HD constexpr RowCol ldsm_k_addr(int lane) { return {(lane & 7) + 8 * (lane >> 4), 8 * ((lane >> 3) & 1)}; }
LAB_HD constexpr RowCol ldsm_v_addr(int lane) { return {lane & 15, 8 * (lane >> 4)}; }

// Element offset of (row, col) in a shared tile of rows of ld elements. Padded tiles (ld = D + 8)
// shift each row by 16 bytes, so the 8 rows an ldmatrix reads fall in 8 different 16-byte bank
// groups; swizzled tiles (ld = D, D >= 64) keep rows unpadded and XOR the 16-byte chunk index with
// row % 8, which spreads the same 8 rows as well while every chunk stays 16-byte aligned for
// cp.async.
LAB_HD constexpr int smem_offset(int row, int col, int ld, bool swizzle) {
  return swizzle ? row * ld + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7) : row * ld + col;
}

// ------------------------------------------------------------------------------ (c) FA2 per lane

// Tile sizes of versions 3 and 4 for head dim D.
template <int D> struct Fa2 {
  static_assert(D % 16 == 0 && D >= 64, "head dim: a multiple of 16, at least 64 (the swizzle needs 8 chunks)");
  static constexpr int kWarps = 4;         // warps per block
  static constexpr int kBr = 16 * kWarps;  // query rows per block
  static constexpr int kBc = 64;           // keys per tile
  static constexpr int kNS = kBc / 8;      // C fragments of S per warp (n blocks of 8 keys)
  static constexpr int kNO = D / 8;        // C fragments of O per warp
  static constexpr int kKQ = D / 16;       // k steps of Q K^T = A fragments of Q
  static constexpr int kKP = kBc / 16;     // k steps of P V = A fragments of P
  static constexpr int kLdPad = D + 8;     // padded row length (version 3)
};

// What a lane keeps across key tiles: O's C fragments, and per row (g, g + 8) the running max of
// the log2-domain scores and this lane's part of the row sum (the quad is summed at the end only).
template <int D> struct LaneState {
  float o[Fa2<D>::kNO][4];
  float m[2], l[2];
};

template <int D> LAB_HD void lane_init(LaneState<D>& st) {
  for (int n = 0; n < Fa2<D>::kNO; ++n)
    for (int i = 0; i < 4; ++i) st.o[n][i] = 0.f;
  for (int r = 0; r < 2; ++r) st.m[r] = -INFINITY, st.l[r] = 0.f;
}

// s (this lane's C fragments of S for keys key0 .. key0 + kBc - 1) times scale_log2 = scale * log2(e),
// or -inf where the key is past T or, causal, after the query row. row0: the warp's first row.
// When `mask` is false (a tile wholly visible to every row of the warp) the compares are left out.
template <int D>
LAB_HD void scale_and_mask(float (&s)[Fa2<D>::kNS][4], int lane, int row0, int key0, int T, bool causal,
                           float scale_log2, bool mask) {
  for (int n = 0; n < Fa2<D>::kNS; ++n)
    for (int i = 0; i < 4; ++i) {
      const int row = row0 + c_row(lane, i), key = key0 + 8 * n + c_col(lane, i);
      const bool hidden = mask && (key >= T || (causal && key > row));
      s[n][i] = hidden ? -INFINITY : s[n][i] * scale_log2;
    }
}

// This lane's maxima of rows g and g + 8 (elements 0, 1 and 2, 3 of each fragment), with the
// running max folded in; the quad's max is then taken by two xor-shuffles (1, 2).
template <int D> LAB_HD void lane_row_max(const float (&s)[Fa2<D>::kNS][4], const LaneState<D>& st, float (&mx)[2]) {
  mx[0] = st.m[0], mx[1] = st.m[1];
  for (int n = 0; n < Fa2<D>::kNS; ++n)
    for (int i = 0; i < 4; ++i) mx[i >> 1] = fmaxf(mx[i >> 1], s[n][i]);
}

// The online-softmax step of a tile, given the quad's new row maxima: rescale O and l by
// exp2(m_old - m_new), p = exp2(s - m_new) added (unrounded) to l, and P packed to bf16 as the A
// fragments of P V: A fragment j (keys 16 j .. 16 j + 15) = C fragments 2 j (registers 0, 1: rows
// g, g + 8 of keys 16 j + 2t, +1) and 2 j + 1 (registers 2, 3: keys 16 j + 8 + 2t, +1).
// A row that has seen only masked keys (m = -inf) uses 0 as its max, so it never computes
// exp2(-inf + inf); its p are exp2(-inf) = 0.
template <int D>
LAB_HD void softmax_update(const float (&s)[Fa2<D>::kNS][4], const float (&m_new)[2], LaneState<D>& st,
                           uint32_t (&p)[Fa2<D>::kKP][4]) {
  float base[2], alpha[2];
  for (int r = 0; r < 2; ++r) {
    base[r] = m_new[r] == -INFINITY ? 0.f : m_new[r];
    alpha[r] = exp2_approx(st.m[r] - base[r]);  // 0 on the first tile (m_old = -inf)
    st.m[r] = m_new[r];
    st.l[r] *= alpha[r];
  }
  for (int n = 0; n < Fa2<D>::kNO; ++n)
    for (int i = 0; i < 4; ++i) st.o[n][i] *= alpha[i >> 1];
  for (int j = 0; j < Fa2<D>::kKP; ++j) {
    float e[2][4];
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 4; ++i) {
        e[h][i] = exp2_approx(s[2 * j + h][i] - base[i >> 1]);
        st.l[i >> 1] += e[h][i];
      }
    p[j][0] = pack_bf16x2(e[0][0], e[0][1]);  // A a0, a1: row g,     cols 2t, 2t + 1
    p[j][1] = pack_bf16x2(e[0][2], e[0][3]);  // A a2, a3: row g + 8, cols 2t, 2t + 1
    p[j][2] = pack_bf16x2(e[1][0], e[1][1]);  // A a4, a5: row g,     cols 8 + 2t, 8 + 2t + 1
    p[j][3] = pack_bf16x2(e[1][2], e[1][3]);  // A a6, a7: row g + 8, cols 8 + 2t, 8 + 2t + 1
  }
}

// The end of a row, given the quad's total l: O / l for this lane's elements (in place) and the
// natural log-sum-exp of rows g and g + 8.
template <int D> LAB_HD void finish_rows(LaneState<D>& st, const float (&l_total)[2], float (&lse)[2]) {
  float inv[2];
  for (int r = 0; r < 2; ++r) {
    inv[r] = l_total[r] > 0.f ? 1.f / l_total[r] : 0.f;
    lse[r] = l_total[r] > 0.f ? st.m[r] * static_cast<float>(kLn2) + logf(l_total[r]) : -INFINITY;
  }
  for (int n = 0; n < Fa2<D>::kNO; ++n)
    for (int i = 0; i < 4; ++i) st.o[n][i] *= inv[i >> 1];
}

// Whether a warp whose rows are row0 .. row0 + 15 has any visible key in [key0, key0 + kBc) (causal:
// key0 <= its last row), and whether the tile needs the per-element mask (a key past T, or, causal,
// a key after the warp's first row).
LAB_HD constexpr bool warp_sees_tile(int row0, int key0, bool causal) { return !causal || key0 <= row0 + 15; }
LAB_HD constexpr bool tile_needs_mask(int row0, int key0, int kbc, int T, bool causal) {
  return key0 + kbc > T || (causal && key0 + kbc - 1 > row0);
}

// The number of key tiles a block of query rows q0 .. q0 + br - 1 visits.
LAB_HD constexpr int key_tiles(int q0, int br, int T, int bc, bool causal) {
  return ((causal && q0 + br < T ? q0 + br : T) + bc - 1) / bc;
}

// ------------------------------------------------------------------------------ host model: warp collectives

// ldmatrix .x4 (.trans) from a modelled shared memory of b16 elements: addr[lane] is the element
// offset of the row that lane gives (16-byte aligned: a multiple of 8).
inline void ldmatrix_x4(uint32_t (&dst)[kWarp][4], const uint16_t* smem, const int (&addr)[kWarp], bool trans) {
  for (int lane = 0; lane < kWarp; ++lane)
    for (int m = 0; m < 4; ++m) {
      uint16_t h[2];
      for (int e = 0; e < 2; ++e) {
        const int r = ldsm_dst_row(lane, e, trans), c = ldsm_dst_col(lane, e, trans);
        h[e] = smem[addr[8 * m + r] + c];
      }
      dst[lane][m] = static_cast<uint32_t>(h[0]) | (static_cast<uint32_t>(h[1]) << 16);
    }
}

// The shared-memory wavefronts one 8x8 matrix of an ldmatrix takes: its 8 rows of 16 bytes each
// cover 4 of the 32 four-byte banks; rows that share a bank are served one after another. 1 is
// conflict-free. Returns the worst of the 4 matrices.
inline int ldmatrix_wavefronts(const int (&addr)[kWarp]) {
  int worst = 1;
  for (int m = 0; m < 4; ++m) {
    int count[32] = {};
    for (int r = 0; r < 8; ++r)
      for (int w = 0; w < 4; ++w) ++count[(addr[8 * m + r] / 2 + w) % 32];
    for (int b = 0; b < 32; ++b) worst = std::max(worst, count[b]);
  }
  return worst;
}

// d = a b + c for one m16n8k16 (bf16 inputs, f32 accumulators), warp-wide: A from a[lane][0..3],
// B from b[lane][0..1], C and D by the C layout. The 16 products (exact in f32) are added to c in
// k order in f32.
inline void mma_m16n8k16(float (&d)[kWarp][4], const uint32_t (&a)[kWarp][4], const uint32_t (&b)[kWarp][2],
                         const float (&c)[kWarp][4]) {
  float A[16][16], B[16][8];
  for (int lane = 0; lane < kWarp; ++lane) {
    for (int i = 0; i < 8; ++i) {
      const uint32_t r = a[lane][i / 2];
      A[a_row(lane, i)][a_col(lane, i)] = i % 2 ? hi_half(r) : lo_half(r);
    }
    for (int i = 0; i < 4; ++i) {
      const uint32_t r = b[lane][i / 2];
      B[b_row(lane, i)][b_col(lane, i)] = i % 2 ? hi_half(r) : lo_half(r);
    }
  }
  for (int lane = 0; lane < kWarp; ++lane)
    for (int i = 0; i < 4; ++i) {
      const int row = c_row(lane, i), col = c_col(lane, i);
      float acc = c[lane][i];
      for (int k = 0; k < 16; ++k) acc += A[row][k] * B[k][col];
      d[lane][i] = acc;
    }
}

// The quad butterfly of the kernel's two __shfl_xor_sync (offsets 1, 2), for max or sum.
template <class Op> void quad_allreduce(float (&v)[kWarp], Op op) {
  for (int offset = 1; offset <= 2; offset *= 2) {
    float w[kWarp];
    for (int lane = 0; lane < kWarp; ++lane) w[lane] = op(v[lane], v[lane ^ offset]);
    std::copy(w, w + kWarp, v);
  }
}

// ------------------------------------------------------------------------------ host model: the forward

// Faults a test plants to show that the checks catch a wrong index (tests/core/test_attention_model.cpp).
enum class Fault {
  none,
  q_rows_mod_8,         // Q's ldmatrix addresses rows lane % 8 (the second 8 rows are never read)
  p_registers_swapped,  // P's A fragment with registers 1 and 2 exchanged (rows g+8 <-> keys 8..15)
  v_without_trans,      // V read by ldmatrix without .trans
  k_halves_swapped,     // K's ldmatrix addresses swap the two k halves of a key block
};

struct ModelStats {
  int64_t mma = 0, ldmatrix = 0, tiles = 0, warp_tiles_skipped = 0;
  int worst_wavefronts = 0;  // of every ldmatrix the model issued (1: no bank conflict)
};

// The forward of one head, as version 3 (padded shared rows, every tile masked) or 4 (XOR-swizzled
// rows, the mask only on tiles that need it) of the lab runs it: q, k, v [T, D] bf16 bits, scale
// 1 / sqrt(D); out [T, D] f32 (the kernel rounds it to bf16 as it stores it: round it to compare
// with the kernel), lse [T] natural log.
template <int D>
ModelStats fa2_forward(const uint16_t* q, const uint16_t* k, const uint16_t* v, int T, bool causal, int version,
                       float* out, float* lse, Fault fault = Fault::none) {
  using F = Fa2<D>;
  const bool swizzle = version >= 4;
  const int ld = swizzle ? D : F::kLdPad;
  const float scale_log2 = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D))) * kLog2e;
  std::vector<uint16_t> Qs(F::kBr * ld), Ks(F::kBc * ld), Vs(F::kBc * ld);
  ModelStats stats;
  // a [rows, D] tile from global rows r0 ..: zero past T (the kernel's zero fill)
  auto load_tile = [&](std::vector<uint16_t>& dst, const uint16_t* src, int rows, int r0) {
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < D; ++c)
        dst[smem_offset(r, c, ld, swizzle)] = r0 + r < T ? src[static_cast<int64_t>(r0 + r) * D + c] : uint16_t(0);
  };
  // an ldmatrix .x4 of the 16x16 block at (row0, col0) of a tile, lane addresses from `at`
  auto ldsm = [&](uint32_t(&dst)[kWarp][4], const std::vector<uint16_t>& tile, int row0, int col0, RowCol (*at)(int),
                  bool trans) {
    int addr[kWarp];
    for (int lane = 0; lane < kWarp; ++lane) {
      const RowCol rc = at(lane);
      addr[lane] = smem_offset(row0 + rc.row, col0 + rc.col, ld, swizzle);
    }
    ldmatrix_x4(dst, tile.data(), addr, trans);
    stats.worst_wavefronts = std::max(stats.worst_wavefronts, ldmatrix_wavefronts(addr));
    ++stats.ldmatrix;
  };
  RowCol (*q_at)(int) = [](int lane) { return ldsm_q_addr(lane); };
  RowCol (*k_at)(int) = [](int lane) { return ldsm_k_addr(lane); };
  RowCol (*v_at)(int) = [](int lane) { return ldsm_v_addr(lane); };
  if (fault == Fault::q_rows_mod_8) q_at = [](int lane) { return RowCol{lane & 7, 8 * (lane >> 4)}; };
  if (fault == Fault::k_halves_swapped)
    k_at = [](int lane) { return RowCol{(lane & 7) + 8 * (lane >> 4), 8 - 8 * ((lane >> 3) & 1)}; };
  const bool v_trans = fault != Fault::v_without_trans;

  std::vector<LaneState<D>> st(F::kWarps * kWarp);  // [warp * 32 + lane]
  std::vector<uint32_t> qf(static_cast<size_t>(F::kWarps) * F::kKQ * kWarp * 4);
  auto qfrag = [&](int w, int kk) -> uint32_t(&)[kWarp][4] {
    return *reinterpret_cast<uint32_t(*)[kWarp][4]>(&qf[(static_cast<size_t>(w) * F::kKQ + kk) * kWarp * 4]);
  };
  for (int q0 = 0; q0 < T; q0 += F::kBr) {
    load_tile(Qs, q, F::kBr, q0);
    for (int w = 0; w < F::kWarps; ++w) {
      for (int kk = 0; kk < F::kKQ; ++kk) ldsm(qfrag(w, kk), Qs, 16 * w, 16 * kk, q_at, false);
      for (int lane = 0; lane < kWarp; ++lane) lane_init(st[w * kWarp + lane]);
    }
    const int tiles = key_tiles(q0, F::kBr, T, F::kBc, causal);
    for (int t = 0; t < tiles; ++t) {
      const int key0 = t * F::kBc;
      load_tile(Ks, k, F::kBc, key0);
      load_tile(Vs, v, F::kBc, key0);
      ++stats.tiles;
      for (int w = 0; w < F::kWarps; ++w) {
        const int row0 = q0 + 16 * w;
        if (!warp_sees_tile(row0, key0, causal)) {
          ++stats.warp_tiles_skipped;
          continue;
        }
        LaneState<D>* ls = &st[w * kWarp];
        // S = Q K^T: C fragment n (keys 8n .. 8n + 7) of every lane
        float S[F::kNS][kWarp][4] = {};
        for (int kk = 0; kk < F::kKQ; ++kk)
          for (int np = 0; np < F::kNS / 2; ++np) {
            uint32_t kb[kWarp][4], b[kWarp][2];
            ldsm(kb, Ks, 16 * np, 16 * kk, k_at, false);
            for (int h = 0; h < 2; ++h) {
              for (int lane = 0; lane < kWarp; ++lane) b[lane][0] = kb[lane][2 * h], b[lane][1] = kb[lane][2 * h + 1];
              mma_m16n8k16(S[2 * np + h], qfrag(w, kk), b, S[2 * np + h]);
              ++stats.mma;
            }
          }
        // the online softmax, lane by lane, with the quad's maxima between its two halves
        const bool mask = version < 4 || tile_needs_mask(row0, key0, F::kBc, T, causal);
        float s[kWarp][F::kNS][4], mx[2][kWarp];
        for (int lane = 0; lane < kWarp; ++lane) {
          for (int n = 0; n < F::kNS; ++n)
            for (int i = 0; i < 4; ++i) s[lane][n][i] = S[n][lane][i];
          scale_and_mask<D>(s[lane], lane, row0, key0, T, causal, scale_log2, mask);
          float m2[2];
          lane_row_max<D>(s[lane], ls[lane], m2);
          mx[0][lane] = m2[0], mx[1][lane] = m2[1];
        }
        for (int r = 0; r < 2; ++r) quad_allreduce(mx[r], [](float a, float b) { return std::max(a, b); });
        uint32_t p[kWarp][F::kKP][4];
        for (int lane = 0; lane < kWarp; ++lane) {
          const float m_new[2] = {mx[0][lane], mx[1][lane]};
          softmax_update<D>(s[lane], m_new, ls[lane], p[lane]);
          if (fault == Fault::p_registers_swapped)
            for (int j = 0; j < F::kKP; ++j) std::swap(p[lane][j][1], p[lane][j][2]);
        }
        // O += P V: P's A fragments straight from the registers, V by ldmatrix .trans
        for (int j = 0; j < F::kKP; ++j) {
          uint32_t a[kWarp][4];
          for (int lane = 0; lane < kWarp; ++lane)
            for (int r = 0; r < 4; ++r) a[lane][r] = p[lane][j][r];
          for (int np = 0; np < F::kNO / 2; ++np) {
            uint32_t vb[kWarp][4], b[kWarp][2];
            ldsm(vb, Vs, 16 * j, 16 * np, v_at, v_trans);
            for (int h = 0; h < 2; ++h) {
              float o[kWarp][4];
              for (int lane = 0; lane < kWarp; ++lane) {
                b[lane][0] = vb[lane][2 * h], b[lane][1] = vb[lane][2 * h + 1];
                for (int i = 0; i < 4; ++i) o[lane][i] = ls[lane].o[2 * np + h][i];
              }
              mma_m16n8k16(o, a, b, o);
              ++stats.mma;
              for (int lane = 0; lane < kWarp; ++lane)
                for (int i = 0; i < 4; ++i) ls[lane].o[2 * np + h][i] = o[lane][i];
            }
          }
        }
      }
    }
    // the end of the block's rows: the quad's l, O / l, lse; stores by the C layout
    for (int w = 0; w < F::kWarps; ++w) {
      LaneState<D>* ls = &st[w * kWarp];
      float l[2][kWarp];
      for (int lane = 0; lane < kWarp; ++lane) l[0][lane] = ls[lane].l[0], l[1][lane] = ls[lane].l[1];
      for (int r = 0; r < 2; ++r) quad_allreduce(l[r], [](float a, float b) { return a + b; });
      for (int lane = 0; lane < kWarp; ++lane) {
        const float lt[2] = {l[0][lane], l[1][lane]};
        float ls_out[2];
        finish_rows<D>(ls[lane], lt, ls_out);
        for (int n = 0; n < F::kNO; ++n)
          for (int i = 0; i < 4; ++i) {
            const int row = q0 + 16 * w + c_row(lane, i), col = 8 * n + c_col(lane, i);
            if (row < T) out[static_cast<int64_t>(row) * D + col] = ls[lane].o[n][i];
          }
        for (int r = 0; r < 2; ++r) {
          const int row = q0 + 16 * w + group_id(lane) + 8 * r;
          if (thread_in_group(lane) == 0 && row < T) lse[row] = ls_out[r];
        }
      }
    }
  }
  return stats;
}

// ------------------------------------------------------------------------------ the f64 reference

// One head's softmax(scale Q K^T) V in f64 (q, k, v [T, D] as floats: the bf16 values), with the
// scales of the tolerances above: out_scale = P|V| per element, and eps_p.
struct HeadReference {
  std::vector<double> out, out_scale, lse;
  double eps_p = 0;  // the relative error of p from S in f32 and exp2, for this head
};

inline double gamma_n(int64_t n) { return n * 0x1p-24 / (1 - n * 0x1p-24); }

inline HeadReference reference_head(const float* q, const float* k, const float* v, int T, int D, bool causal) {
  HeadReference r;
  r.out.assign(static_cast<size_t>(T) * D, 0.0);
  r.out_scale.assign(static_cast<size_t>(T) * D, 0.0);
  r.lse.assign(T, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<double> s(T), mag(T);
  double worst_mag = 0;
  for (int i = 0; i < T; ++i) {
    const int n = causal ? i + 1 : T;
    double m = -INFINITY;
    for (int j = 0; j < n; ++j) {
      double dot = 0, a = 0;
      for (int d = 0; d < D; ++d) {
        const double x = static_cast<double>(q[static_cast<int64_t>(i) * D + d]) * k[static_cast<int64_t>(j) * D + d];
        dot += x, a += std::abs(x);
      }
      s[j] = dot * scale;
      worst_mag = std::max(worst_mag, a * scale);
      m = std::max(m, s[j]);
    }
    double l = 0;
    for (int j = 0; j < n; ++j) l += (s[j] = std::exp(s[j] - m));
    r.lse[i] = m + std::log(l);
    for (int j = 0; j < n; ++j) {
      const double p = s[j] / l;
      for (int d = 0; d < D; ++d) {
        const double x = v[static_cast<int64_t>(j) * D + d];
        r.out[static_cast<size_t>(i) * D + d] += p * x;
        r.out_scale[static_cast<size_t>(i) * D + d] += p * std::abs(x);
      }
    }
  }
  // S in f32 (any order), its scaling and the subtraction of the max (a few roundings), exp2 to two ulps
  r.eps_p = worst_mag * (gamma_n(D) + 4 * 0x1p-24) + 0x1p-21;
  return r;
}

// The bounds of the header: relative to out_scale for O, to 1 + |lse| for lse.
struct Tolerance {
  double out = 0, lse = 0;
};
inline Tolerance tolerance(double eps_p, int T, bool bf16_p, bool bf16_out) {
  Tolerance t;
  t.out = 2 * eps_p + 2 * gamma_n(T) + (bf16_p ? 0x1p-8 : 0) + (bf16_out ? 0x1p-8 : 0) + 8 * 0x1p-24;
  t.lse = eps_p + 2 * gamma_n(T) + 8 * 0x1p-24;
  return t;
}

// The worst errors of one head's outputs against the reference, in the units of Tolerance.
struct Errors {
  double out = 0, lse = 0;
};
inline Errors head_errors(const HeadReference& r, const float* out, const float* lse, int T, int D) {
  Errors e;
  for (int64_t i = 0; i < static_cast<int64_t>(T) * D; ++i) {
    const double d = std::abs(out[i] - r.out[i]), x = d == 0 ? 0 : d / (r.out_scale[i] + 1e-300);
    if (!(x <= e.out)) e.out = x;  // NaN sticks
  }
  for (int i = 0; i < T; ++i) {
    const double d = std::abs(lse[i] - r.lse[i]), x = d / (1 + std::abs(r.lse[i]));
    if (!(x <= e.lse)) e.lse = x;
  }
  return e;
}

}  // namespace lab::attention
