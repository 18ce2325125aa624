// lab_gemm_cpu: C = A B in f32 on one core, from the textbook triple loop to kiln's GEMM.
// A is M x K, B is K x N, C is M x N, all row-major. Every version runs on one thread, so it is
// compared with the one-thread multiply-add peak of the instruction set it is written for
// (measured in the same run); "kiln" is the production kernel (kiln/kernels/cpu/gemm.h, the
// design in docs/kernels.md, "The CPU GEMM") asked for one thread at each CPU level.
//
//   1 naive              i-j-k triple loop
//   2 blocked            cache blocks, i-k-j order inside (vectorised by the compiler)
//   3 packed avx2        packed panels and a 6 x 16 AVX2 register tile
//   4 packed avx512      the same with a 12 x 32 AVX-512 tile
//   5 kiln avx2          kiln's GEMM at its avx2 level
//   6 kiln avx512        kiln's GEMM at its avx512 level
//
// Validation: each C is compared with the product computed in f64. The rounding error of a K-term
// dot product is bounded by K * eps * sum_k |a_ik b_kj| <= K * eps * |a_i| |b_j| (Cauchy-Schwarz,
// 2-norms of row i of A and column j of B), and grows like sqrt(K) when the roundings are
// independent, so the error is |c_ij - ref_ij| / (|a_i| |b_j|) against 4 eps (sqrt(K) + 4)
// (lab.h, sum_tol).
//
//   lab_gemm_cpu [VERSION|all] [--size N | --size M,N,K] [--repeats R] [--warmup W] [--budget S]
#include <cstdio>
#include <cstring>
#include <string>

#include <kiln/kiln.h>

#include "kiln/kernels/cpu/gemm.h"
#include "lab.h"

namespace {

const char* kUsage =
    "  --size N or M,N,K   the product's sizes (default 1024)\n"
    "versions: 1 naive, 2 blocked, 3 packed avx2, 4 packed avx512, 5 kiln avx2, 6 kiln avx512\n";

struct Problem {
  int64_t M, N, K;
  lab::Buffer<float> a, b, c;
  lab::Buffer<double> ref, row_norm, col_norm;
  Problem(int64_t m, int64_t n, int64_t k)
      : M(m), N(n), K(k), a(m * k), b(k * n), c(m * n), ref(m * n), row_norm(m), col_norm(n) {}
};

// ------------------------------------------------------------------ 1: naive
// The definition: c_ij = sum_k a_ik b_kj. The inner loop walks B down a column, N floats apart,
// so every b_kj comes from a different cache line, and the sum is one dependent chain of adds
// (the compiler may not reorder f32 additions, so it cannot vectorise it).
void gemm_naive(const float* A, const float* B, float* C, int64_t M, int64_t N, int64_t K) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      float s = 0;
      for (int64_t k = 0; k < K; ++k) s += A[i * K + k] * B[k * N + j];
      C[i * N + j] = s;
    }
}

// ------------------------------------------------------------------ 2: blocked
// i-k-j order: the inner loop adds a_ik times row k of B to row i of C, both contiguous and
// independent across j, so the compiler vectorises it. Blocks of 64 rows x 256 depth x 512
// columns keep the B block (512 KB) in L2 and the rows of C being updated in L1 while they are
// reused. C is still loaded and stored once per k: the loop is bound by L1 traffic, not FMAs.
void gemm_blocked(const float* A, const float* B, float* C, int64_t M, int64_t N, int64_t K) {
  constexpr int64_t MB = 64, KB = 256, NB = 512;
  std::fill(C, C + M * N, 0.0f);
  for (int64_t j0 = 0; j0 < N; j0 += NB)
    for (int64_t k0 = 0; k0 < K; k0 += KB)
      for (int64_t i0 = 0; i0 < M; i0 += MB)
        for (int64_t i = i0; i < std::min(M, i0 + MB); ++i)
          for (int64_t k = k0; k < std::min(K, k0 + KB); ++k) {
            const float a = A[i * K + k];
            const float* b = B + k * N;
            float* c = C + i * N;
            for (int64_t j = j0; j < std::min(N, j0 + NB); ++j) c[j] += a * b[j];
          }
}

// ------------------------------------------------------------------ 3 and 4: packed
// The design of BLIS and kiln: C is computed in MR x NR tiles held in registers for a whole
// KC-deep slice, so each loaded value of A or B feeds NR or MR multiply-adds and C is touched
// once per slice. Packing copies a KC x NC block of B into NR-wide panels and an MC x KC block of
// A into MR-tall panels, so the micro-kernel reads both sequentially (no strides, no TLB misses)
// from L1 (the B panel) and L2 (the A block); zero padding makes every panel full.
constexpr int64_t kKC = 256, kMC = 96, kNC = 1536;

// B[0:kc, 0:nc] (row stride ldb) -> panels of NR columns: panel q, row p at out[(q * kc + p) * NR],
// zeros past column nc.
void pack_b(const float* B, int64_t ldb, int64_t kc, int64_t nc, int NR, float* out) {
  for (int64_t j0 = 0; j0 < nc; j0 += NR) {
    const int64_t cols = std::min<int64_t>(NR, nc - j0);
    for (int64_t p = 0; p < kc; ++p, out += NR) {
      const float* src = B + p * ldb + j0;
      for (int64_t j = 0; j < cols; ++j) out[j] = src[j];
      for (int64_t j = cols; j < NR; ++j) out[j] = 0.0f;
    }
  }
}

// A[0:mc, 0:kc] (row stride lda) -> panels of MR rows: panel q, step p at out[(q * kc + p) * MR],
// zeros past row mc. Each row of A is read contiguously and scattered MR floats apart (in L1).
void pack_a(const float* A, int64_t lda, int64_t mc, int64_t kc, int MR, float* out) {
  for (int64_t i0 = 0; i0 < mc; i0 += MR, out += kc * MR) {
    const int64_t rows = std::min<int64_t>(MR, mc - i0);
    for (int64_t i = 0; i < MR; ++i) {
      const float* src = A + (i0 + i) * lda;
      if (i < rows)
        for (int64_t p = 0; p < kc; ++p) out[p * MR + i] = src[p];
      else
        for (int64_t p = 0; p < kc; ++p) out[p * MR + i] = 0.0f;
    }
  }
}

// *p += v for a vector v stored at any address p (memcpy: an unaligned vector load and store).
template <class V> __attribute__((always_inline)) inline void add_to(float* p, const V& v) {
  V sum;
  std::memcpy(&sum, p, sizeof sum);
  sum += v;
  std::memcpy(p, &sum, sizeof sum);
}

// C[0:rows, 0:cols] (row stride ldc) += the MR x NR tile c, row r in the two vectors c[r]: in place
// for a full tile; at the edge of C, where a full tile would write past the matrix, through an
// aligned copy. Written with GCC's vector operators and memcpy, not intrinsics, so one template
// serves both micro-kernels: inlined into each, it compiles to that kernel's instruction set.
template <int MR, int NR, class V>
__attribute__((always_inline)) inline void add_tile(const V (&c)[MR][2], float* C, int64_t ldc, int rows, int cols) {
  if (rows == MR && cols == NR) {
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r) {
      add_to(C + r * ldc, c[r][0]);
      add_to(C + r * ldc + NR / 2, c[r][1]);
    }
  } else {
    alignas(64) float tile[MR * NR];
    std::memcpy(tile, c, sizeof tile);  // c is the tile row-major
    for (int r = 0; r < rows; ++r)
      for (int j = 0; j < cols; ++j) C[r * ldc + j] += tile[r * NR + j];
  }
}

// 6 x 16 tile: 12 ymm accumulators (6 rows x 2 vectors of 8), 2 for the B row, 1 for the
// broadcast a value: 15 of the 16 ymm registers. Per step of k: 2 loads, 6 broadcasts, 12 FMAs.
__attribute__((target("avx2,fma"))) void micro_avx2(int64_t kc, const float* a, const float* b, float* C, int64_t ldc,
                                                    int rows, int cols) {
  __m256 c[6][2];  // every loop over it is unrolled, so the compiler keeps it in registers
#pragma GCC unroll 6
  for (int r = 0; r < 6; ++r) c[r][0] = c[r][1] = _mm256_setzero_ps();
  for (int64_t p = 0; p < kc; ++p, a += 6, b += 16) {
    const __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
#pragma GCC unroll 6
    for (int r = 0; r < 6; ++r) {
      const __m256 ar = _mm256_broadcast_ss(a + r);
      c[r][0] = _mm256_fmadd_ps(ar, b0, c[r][0]);
      c[r][1] = _mm256_fmadd_ps(ar, b1, c[r][1]);
    }
  }
  add_tile<6, 16>(c, C, ldc, rows, cols);
}

// 12 x 32 tile: 24 of the 32 zmm registers accumulate (12 rows x 2 vectors of 16). Twice the
// lanes of AVX2 and twice the registers, so the tile has four times the area and each loaded
// value feeds twice as many FMAs: 2 loads, 12 broadcasts, 24 FMAs per step of k.
__attribute__((target("avx512f"))) void micro_avx512(int64_t kc, const float* a, const float* b, float* C, int64_t ldc,
                                                     int rows, int cols) {
  __m512 c[12][2];
#pragma GCC unroll 12
  for (int r = 0; r < 12; ++r) c[r][0] = c[r][1] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kc; ++p, a += 12, b += 32) {
    const __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
#pragma GCC unroll 12
    for (int r = 0; r < 12; ++r) {
      const __m512 ar = _mm512_set1_ps(a[r]);
      c[r][0] = _mm512_fmadd_ps(ar, b0, c[r][0]);
      c[r][1] = _mm512_fmadd_ps(ar, b1, c[r][1]);
    }
  }
  add_tile<12, 32>(c, C, ldc, rows, cols);
}

using MicroKernel = void (*)(int64_t, const float*, const float*, float*, int64_t, int, int);

// The loop nest around the micro-kernel: NC-wide column blocks, KC-deep slices (B's slice packed
// once per slice), MC-tall row blocks (A's block packed once per block), then every tile.
template <int MR, int NR, MicroKernel kernel>
void gemm_packed(const float* A, const float* B, float* C, int64_t M, int64_t N, int64_t K) {
  lab::Buffer<float> bp(kKC * (kNC + NR)), ap((kMC + MR) * kKC);
  std::fill(C, C + M * N, 0.0f);
  for (int64_t jc = 0; jc < N; jc += kNC) {
    const int64_t nc = std::min(kNC, N - jc);
    for (int64_t pc = 0; pc < K; pc += kKC) {
      const int64_t kc = std::min(kKC, K - pc);
      pack_b(B + pc * N + jc, N, kc, nc, NR, bp.data());
      for (int64_t ic = 0; ic < M; ic += kMC) {
        const int64_t mc = std::min(kMC, M - ic);
        pack_a(A + ic * K + pc, K, mc, kc, MR, ap.data());
        for (int64_t jr = 0; jr < nc; jr += NR)
          for (int64_t ir = 0; ir < mc; ir += MR)
            kernel(kc, ap.data() + ir * kc, bp.data() + jr * kc, C + (ic + ir) * N + jc + jr, N,
                   static_cast<int>(std::min<int64_t>(MR, mc - ir)), static_cast<int>(std::min<int64_t>(NR, nc - jr)));
      }
    }
  }
}

// ------------------------------------------------------------------ 5 and 6: kiln
// kiln's GEMM at one CPU level on one thread: the packed design of 3 and 4 plus what a library
// needs (any strides and transposes, masked edges instead of a tile copy, A read in place when
// row-major, narrower kernels for a short last panel, threads splitting C); docs/kernels.md.
void gemm_kiln(const float* A, const float* B, float* C, int64_t M, int64_t N, int64_t K) {
  using kiln::kernels::cpu::row_major;
  kiln::kernels::cpu::gemm_f32_in_use.on(kiln::Device::cpu(), row_major(A, M, K, K), row_major(B, K, N, N),
                                         row_major(C, M, N, N), /*accumulate=*/false, /*threads=*/1,
                                         /*packed_lhs=*/false);
}

// ------------------------------------------------------------------ reference and driver

// The product in f64 (rows over threads, i-k-j so the inner loop vectorises), and the 2-norms of
// A's rows and B's columns that scale the error.
void reference(Problem& P) {
  const int64_t M = P.M, N = P.N, K = P.K;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < M; ++i) {
    double* r = P.ref.data() + i * N;
    std::fill(r, r + N, 0.0);
    double norm = 0;
    for (int64_t k = 0; k < K; ++k) {
      const double a = P.a[i * K + k];
      norm += a * a;
      for (int64_t j = 0; j < N; ++j) r[j] += a * P.b[k * N + j];
    }
    P.row_norm[i] = std::sqrt(norm);
  }
  for (int64_t j = 0; j < N; ++j) P.col_norm[j] = 0;
  for (int64_t k = 0; k < K; ++k)
    for (int64_t j = 0; j < N; ++j) P.col_norm[j] += double(P.b[k * N + j]) * P.b[k * N + j];
  for (int64_t j = 0; j < N; ++j) P.col_norm[j] = std::sqrt(P.col_norm[j]);
}

struct Version {
  const char* name;
  void (*run)(const float*, const float*, float*, int64_t, int64_t, int64_t);
  lab::Isa isa;     // the instruction set it needs and whose peak it is compared with
  bool kiln_level;  // runs kiln's GEMM with kiln::set_cpu_isa(the level of `isa`)
};

const Version kVersions[] = {
    {"naive i-j-k", gemm_naive, lab::Isa::sse, false},                                                  // 1
    {"blocked i-k-j", gemm_blocked, lab::Isa::sse, false},                                              // 2
    {"packed, 6x16 avx2 micro-kernel", gemm_packed<6, 16, micro_avx2>, lab::Isa::avx2, false},          // 3
    {"packed, 12x32 avx512 micro-kernel", gemm_packed<12, 32, micro_avx512>, lab::Isa::avx512, false},  // 4
    {"kiln gemm, avx2 level", gemm_kiln, lab::Isa::avx2, true},                                         // 5
    {"kiln gemm, avx512 level", gemm_kiln, lab::Isa::avx512, true},                                     // 6
};

// Why version v cannot run here ("" when it can).
std::string unavailable(const Version& v) {
  if (!lab::cpu_has(v.isa)) return std::string("needs ") + (v.isa == lab::Isa::avx512 ? "AVX-512" : "AVX2 and FMA");
  if (v.kiln_level) {
    const auto level = v.isa == lab::Isa::avx512 ? kiln::CpuIsa::avx512 : kiln::CpuIsa::avx2;
    if (!kiln::cpu_isa_built(level))
      return std::string("this kiln build has no ") + kiln::cpu_isa_name(level) + " kernels";
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  const lab::Options opt = lab::parse_args(argc, argv, kVersions, {1024}, {1, 3}, kUsage);
  const int64_t M = opt.size[0], N = opt.size.size() == 3 ? opt.size[1] : M, K = opt.size.size() == 3 ? opt.size[2] : M;
  std::printf("lab_gemm_cpu: C[%lld x %lld] = A[%lld x %lld] B[%lld x %lld], f32, one thread; kiln CPU levels: %s\n",
              (long long)M, (long long)N, (long long)M, (long long)K, (long long)K, (long long)N,
              kiln::cpu_isa_summary().c_str());
  Problem P(M, N, K);
  lab::fill_normal(P.a.data(), M * K, 1);
  lab::fill_normal(P.b.data(), K * N, 2);
  reference(P);

  std::vector<lab::Peak> peaks;
  for (lab::Isa isa : {lab::Isa::sse, lab::Isa::avx2, lab::Isa::avx512})
    if (lab::cpu_has(isa)) peaks.push_back({std::string(lab::isa_name(isa)) + " 1t", lab::fma_peak_gflops(isa, 1)});
  lab::Report report("GFLOP/s");
  report.header(peaks);
  const double tol = lab::sum_tol(K);
  for (int vi : opt.versions) {
    const Version& v = kVersions[vi - 1];
    if (const std::string why = unavailable(v); !why.empty()) {
      report.skipped(vi, v.name, why);
      continue;
    }
    if (v.kiln_level) kiln::set_cpu_isa(v.isa == lab::Isa::avx512 ? kiln::CpuIsa::avx512 : kiln::CpuIsa::avx2);
    auto run = [&] { v.run(P.a.data(), P.b.data(), P.c.data(), M, N, K); };
    P.c.poison();
    run();
    lab::Check check;
    check.compare("C", P.c.data(), P.ref.data(), M * N, tol,
                  [&](int64_t e) { return P.row_norm[e / N] * P.col_norm[e % N] + 1e-300; });
    const lab::Peak& peak = *std::find_if(peaks.begin(), peaks.end(), [&](const lab::Peak& p) {
      return p.name == std::string(lab::isa_name(v.isa)) + " 1t";
    });
    report.row(
        vi, v.name, 1, check, [&] { return lab::time_cpu(run, opt); }, 2.0 * M * N * K, peak);
    if (v.kiln_level) kiln::reset_cpu_isa();
  }
  std::printf(
      "GFLOP/s = 2 M N K / median time; %%peak: of the one-thread multiply-add peak of the version's "
      "instruction set (\"of peak\"); max err: the worst |c - ref| / (|a_i| |b_j|), tol = 4 eps (sqrt(K) + 4)\n");
  return report.exit_code();
}
