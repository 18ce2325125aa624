// The host model of the lab's tensor-core attention kernel (bench/lab/attention_model.h): the mma
// and ldmatrix fragment layouts against the PTX ISA's formulas written out again here, the modelled
// mma against a plain matrix product, the modelled FlashAttention-2 forward against an f64
// softmax(Q K^T / sqrt(d)) V, and planted index bugs that these checks must catch. Nothing here
// needs a GPU: it checks the index arithmetic the kernel shares with the model.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <tuple>
#include <vector>

#include "bench/lab/attention_model.h"

namespace at = lab::attention;

namespace {

// The PTX ISA's formulas ("Matrix Fragments for mma.m16n8k16 with floating point type"), as
// written there, independent of the helpers' bit tricks.
int ptx_a_row(int lane, int i) {
  const int groupID = lane >> 2;
  return ((0 <= i && i < 2) || (4 <= i && i < 6)) ? groupID : groupID + 8;
}
int ptx_a_col(int lane, int i) {
  const int threadID_in_group = lane % 4;
  return i < 4 ? (threadID_in_group * 2) + (i & 0x1) : (threadID_in_group * 2) + (i & 0x1) + 8;
}
int ptx_b_row(int lane, int i) {
  const int threadID_in_group = lane % 4;
  return i < 2 ? (threadID_in_group * 2) + (i & 0x1) : (threadID_in_group * 2) + (i & 0x1) + 8;
}
int ptx_b_col(int lane) { return lane >> 2; }
int ptx_c_row(int lane, int i) { return i < 2 ? (lane >> 2) : (lane >> 2) + 8; }
int ptx_c_col(int lane, int i) { return ((lane % 4) * 2) + (i & 0x1); }

std::vector<uint16_t> random_bf16(size_t n, uint32_t seed, float stddev = 1.f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.f, stddev);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = at::bf16_bits(dist(gen));
  return v;
}

std::vector<float> to_float(const std::vector<uint16_t>& b) {
  std::vector<float> f(b.size());
  for (size_t i = 0; i < b.size(); ++i) f[i] = at::bf16_float(b[i]);
  return f;
}

// The number of lanes whose ldmatrix .x4 of the 16x16 block at (0, 0) of `tile` (element offsets by
// smem_offset(ld, swizzle)) does not give what the operand's fragments need:
//  'q': the A fragment of the block (rows x cols);
//  'k': B fragments of S = Q K^T for keys 0-7 (registers 0, 1) and 8-15 (2, 3): B(k, n) = tile(n, k);
//  'v': B fragments of O = P V for columns 0-7 and 8-15: B(k, n) = tile(k, n).
int ldmatrix_mismatches(char operand, at::RowCol (*at_lane)(int), bool trans, int ld, bool swizzle) {
  std::vector<uint16_t> tile(16 * ld, 0xffff);
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) tile[at::smem_offset(r, c, ld, swizzle)] = static_cast<uint16_t>(r * 16 + c);
  int addr[at::kWarp];
  for (int lane = 0; lane < at::kWarp; ++lane) {
    const at::RowCol rc = at_lane(lane);
    addr[lane] = at::smem_offset(rc.row, rc.col, ld, swizzle);
  }
  uint32_t reg[at::kWarp][4];
  at::ldmatrix_x4(reg, tile.data(), addr, trans);
  auto half = [&](int lane, int r, int h) { return static_cast<int>(h ? reg[lane][r] >> 16 : reg[lane][r] & 0xffff); };
  int bad = 0;
  for (int lane = 0; lane < at::kWarp; ++lane) {
    bool ok = true;
    if (operand == 'q') {
      for (int i = 0; i < 8; ++i) ok &= half(lane, i / 2, i % 2) == ptx_a_row(lane, i) * 16 + ptx_a_col(lane, i);
    } else {
      for (int blk = 0; blk < 2; ++blk)
        for (int i = 0; i < 4; ++i) {
          const int k = ptx_b_row(lane, i), n = ptx_b_col(lane) + 8 * blk;
          const int want = operand == 'k' ? n * 16 + k : k * 16 + n;
          ok &= half(lane, 2 * blk + i / 2, i % 2) == want;
        }
    }
    bad += !ok;
  }
  return bad;
}

}  // namespace

TEST_CASE("attention model: fragment helpers follow the PTX formulas and cover each matrix once", "[attention_model]") {
  int a_seen[16][16] = {}, b_seen[16][8] = {}, c_seen[16][8] = {};
  for (int lane = 0; lane < at::kWarp; ++lane) {
    for (int i = 0; i < 8; ++i) {
      REQUIRE(at::a_row(lane, i) == ptx_a_row(lane, i));
      REQUIRE(at::a_col(lane, i) == ptx_a_col(lane, i));
      ++a_seen[at::a_row(lane, i)][at::a_col(lane, i)];
    }
    for (int i = 0; i < 4; ++i) {
      REQUIRE(at::b_row(lane, i) == ptx_b_row(lane, i));
      REQUIRE(at::b_col(lane, i) == ptx_b_col(lane));
      REQUIRE(at::c_row(lane, i) == ptx_c_row(lane, i));
      REQUIRE(at::c_col(lane, i) == ptx_c_col(lane, i));
      ++b_seen[at::b_row(lane, i)][at::b_col(lane, i)];
      ++c_seen[at::c_row(lane, i)][at::c_col(lane, i)];
    }
  }
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) REQUIRE(a_seen[r][c] == 1);
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 8; ++c) REQUIRE((b_seen[r][c] == 1 && c_seen[r][c] == 1));
  // The register reuse of FA2: C fragments 2j, 2j+1 (keys 16j + 0..7, + 8..15) are the A fragment
  // of keys 16j..16j+15, row for row and column for column.
  for (int lane = 0; lane < at::kWarp; ++lane)
    for (int i = 0; i < 8; ++i) {
      const int c_block = i / 4, c_elem = i % 4;  // A register i/2 <- C fragment c_block, elements
      REQUIRE(at::a_row(lane, i) == at::c_row(lane, c_elem));
      REQUIRE(at::a_col(lane, i) == 8 * c_block + at::c_col(lane, c_elem));
    }
}

TEST_CASE("attention model: the modelled mma equals a matrix product", "[attention_model]") {
  // D = A B + C with A, B bf16 (products exact in f32) and 16 f32 additions into C in any order:
  // |D - D_exact| <= gamma_16 (|C| + sum_k |A_ik B_kj|), gamma_n = n u / (1 - n u), u = 2^-24.
  std::mt19937 gen(3);
  std::normal_distribution<float> dist(0.f, 1.f);
  for (int trial = 0; trial < 20; ++trial) {
    float A[16][16], B[16][8], C[16][8];
    for (auto& row : A)
      for (float& x : row) x = at::bf16_round(dist(gen) * (trial % 2 ? 100.f : 1.f));
    for (auto& row : B)
      for (float& x : row) x = at::bf16_round(dist(gen));
    for (auto& row : C)
      for (float& x : row) x = dist(gen);
    uint32_t a[at::kWarp][4] = {}, b[at::kWarp][2] = {};
    float c[at::kWarp][4], d[at::kWarp][4];
    for (int lane = 0; lane < at::kWarp; ++lane) {
      for (int i = 0; i < 8; ++i)
        a[lane][i / 2] |= static_cast<uint32_t>(at::bf16_bits(A[ptx_a_row(lane, i)][ptx_a_col(lane, i)]))
                          << (16 * (i % 2));
      for (int i = 0; i < 4; ++i)
        b[lane][i / 2] |= static_cast<uint32_t>(at::bf16_bits(B[ptx_b_row(lane, i)][ptx_b_col(lane)]))
                          << (16 * (i % 2));
      for (int i = 0; i < 4; ++i) c[lane][i] = C[ptx_c_row(lane, i)][ptx_c_col(lane, i)];
    }
    at::mma_m16n8k16(d, a, b, c);
    for (int lane = 0; lane < at::kWarp; ++lane)
      for (int i = 0; i < 4; ++i) {
        const int r = ptx_c_row(lane, i), col = ptx_c_col(lane, i);
        double exact = C[r][col], mag = std::abs(C[r][col]);
        for (int k = 0; k < 16; ++k) exact += double(A[r][k]) * B[k][col], mag += std::abs(double(A[r][k]) * B[k][col]);
        INFO("trial " << trial << " lane " << lane << " element " << i);
        REQUIRE(std::abs(d[lane][i] - exact) <= at::gamma_n(16) * mag);
      }
  }
}

TEST_CASE("attention model: ldmatrix addresses give the fragments each operand needs", "[attention_model]") {
  for (const bool swizzle : {false, true}) {
    const int ld = swizzle ? 64 : 64 + 8;  // version 4 (D = 64, swizzled) and version 3 (padded)
    CHECK(ldmatrix_mismatches(
              'q', [](int l) { return at::ldsm_q_addr(l); }, false, ld, swizzle) == 0);
    CHECK(ldmatrix_mismatches(
              'k', [](int l) { return at::ldsm_k_addr(l); }, false, ld, swizzle) == 0);
    CHECK(ldmatrix_mismatches(
              'v', [](int l) { return at::ldsm_v_addr(l); }, true, ld, swizzle) == 0);
  }
  // bank conflicts: padded and swizzled rows give one wavefront per 8x8 matrix; unpadded rows of
  // 128 bytes put all 8 rows of a matrix in the same 4 banks (8 wavefronts)
  for (const auto& [ld, swizzle, want] :
       {std::tuple{72, false, 1}, {64, true, 1}, {64, false, 8}, {136, false, 1}, {128, true, 1}}) {
    int addr[at::kWarp];
    for (int lane = 0; lane < at::kWarp; ++lane) {
      const at::RowCol rc = at::ldsm_q_addr(lane);
      addr[lane] = at::smem_offset(rc.row, 16 + rc.col, ld, swizzle);
    }
    INFO("ld " << ld << " swizzle " << swizzle);
    CHECK(at::ldmatrix_wavefronts(addr) == want);
  }
}

TEST_CASE("attention model: a wrong lane mapping fails the layout checks", "[attention_model]") {
  // the check can fail: V without .trans, K read with Q's addresses, Q with the rows of lane % 8
  CHECK(ldmatrix_mismatches(
            'v', [](int l) { return at::ldsm_v_addr(l); }, false, 72, false) > 0);
  CHECK(ldmatrix_mismatches(
            'k', [](int l) { return at::ldsm_q_addr(l); }, false, 72, false) > 0);
  CHECK(ldmatrix_mismatches(
            'q',
            [](int l) {
              return at::RowCol{l & 7, 8 * (l >> 4)};
            },
            false, 64, true) > 0);
  CHECK(ldmatrix_mismatches(
            'q', [](int l) { return at::ldsm_q_addr(l); }, true, 72, false) > 0);
}

namespace {

struct Head {
  int T, D;
  std::vector<uint16_t> q, k, v;
  std::vector<float> qf, kf, vf;
  Head(int T_, int D_, uint32_t seed) : T(T_), D(D_) {
    q = random_bf16(size_t(T) * D, seed), k = random_bf16(size_t(T) * D, seed + 1);
    v = random_bf16(size_t(T) * D, seed + 2);
    qf = to_float(q), kf = to_float(k), vf = to_float(v);
  }
};

template <int D>
at::Errors run_model(const Head& h, const at::HeadReference& ref, bool causal, int version, at::Fault fault,
                     at::ModelStats* stats = nullptr) {
  std::vector<float> out(size_t(h.T) * D, NAN), lse(h.T, NAN);
  const at::ModelStats s =
      at::fa2_forward<D>(h.q.data(), h.k.data(), h.v.data(), h.T, causal, version, out.data(), lse.data(), fault);
  if (stats) *stats = s;
  return at::head_errors(ref, out.data(), lse.data(), h.T, D);
}

template <int D> void check_forward(int T, bool causal) {
  const Head h(T, D, 11 + T + D);
  const at::HeadReference ref = at::reference_head(h.qf.data(), h.kf.data(), h.vf.data(), T, D, causal);
  const at::Tolerance tol = at::tolerance(ref.eps_p, T, /*bf16_p=*/true, /*bf16_out=*/false);
  for (const int version : {3, 4}) {
    at::ModelStats st;
    const at::Errors e = run_model<D>(h, ref, causal, version, at::Fault::none, &st);
    INFO("T " << T << " D " << D << " causal " << causal << " version " << version << ": out err " << e.out << " (tol "
              << tol.out << "), lse err " << e.lse << " (tol " << tol.lse << ")");
    CHECK(e.out <= tol.out);
    CHECK(e.lse <= tol.lse);
    CHECK(st.worst_wavefronts == 1);  // no bank conflict in any ldmatrix
    // tiles: causal visits only key tiles up to each block's last row
    int64_t want_tiles = 0;
    for (int q0 = 0; q0 < T; q0 += 64) want_tiles += at::key_tiles(q0, 64, T, 64, causal);
    CHECK(st.tiles == want_tiles);
    CHECK(st.warp_tiles_skipped == 0);  // with 64-row blocks and 64-key tiles every warp sees key0 <= its rows
  }
}

}  // namespace

TEST_CASE("attention model: the FA2 forward matches softmax(QK^T/sqrt(d))V in f64", "[attention_model]") {
  // Tolerance (attention_model.h): |O - O_ref| <= (2 eps_p + 2 gamma_T + 2^-8 + 8 u) (P|V|), the 2^-8
  // from P rounded to bf16 before P V; lse within eps_p + 2 gamma_T + 8 u (1 + |lse|).
  for (const bool causal : {false, true}) {
    check_forward<64>(77, causal);   // T not a multiple of the tiles: zero-filled keys, masked
    check_forward<64>(200, causal);  // four row blocks, several key tiles, causal skips
    check_forward<128>(77, causal);
    check_forward<128>(130, causal);
  }
}

TEST_CASE("attention model: planted index bugs make the forward fail its check", "[attention_model]") {
  const int T = 77;
  const Head h(T, 64, 5);
  for (const bool causal : {false, true}) {
    const at::HeadReference ref = at::reference_head(h.qf.data(), h.kf.data(), h.vf.data(), T, 64, causal);
    const at::Tolerance tol = at::tolerance(ref.eps_p, T, true, false);
    CHECK(run_model<64>(h, ref, causal, 3, at::Fault::none).out <= tol.out);
    for (const at::Fault f : {at::Fault::q_rows_mod_8, at::Fault::p_registers_swapped, at::Fault::v_without_trans,
                              at::Fault::k_halves_swapped}) {
      const at::Errors e = run_model<64>(h, ref, causal, 4, f);
      INFO("fault " << static_cast<int>(f) << " causal " << causal << ": out err " << e.out << ", tol " << tol.out);
      CHECK(e.out > 10 * tol.out);
    }
  }
}
