// lab_softmax_xent_cpu: softmax + cross-entropy of logits x [R, C] with class targets t [R], and
// its gradient, f32: what a language model's last layer costs in a training step.
//   forward:  m = max_j x_j,  s = sum_j exp(x_j - m),  lse = m + log s,  loss_r = lse - x_t
//   backward: dx_j = (exp(x_j - lse) - [j == t]) g_r       (g_r = 1/R: the mean over rows)
// Each version computes the per-row losses and dx, forward and backward timed together. GB/s
// counts the minimal traffic, one read of x and one write of dx (8 bytes per element), and is
// compared with the streaming bandwidth (lab.h, stream_gbs) measured in the same run on as many
// threads.
//
//   1 composite  log_softmax written out, then the loss and the gradient read it back (std::exp)
//   2 fused      only lse is kept per row; the backward recomputes exp(x - lse) from x
//   3 vector exp a polynomial exp the compiler vectorises, and vectorised max and sum
//   4 wide       version 3 compiled for the processor's widest vectors (AVX-512, AVX2 or SSE)
//   5 threads    version 4 with rows spread over the threads
//   6 kiln       kiln's fused cross-entropy kernels (kiln/kernels/cross_entropy.h, cpu/xent.cpp)
//
// Validation against f64: the loss is compared against 1 + |x_t - m| + log s and dx_j against
// g (p_j (1 + |x_j - m| + log s) + [j == t] + 1e-30) (the roundings of x_j - m and log s, then of
// p_t - 1, and a floor). s is a sum of C positive terms mostly far smaller than s, whose
// roundings do not cancel (lab.h, sum_tol_linear), so the tolerance is the worst-case C eps / 2:
// a sum added one term at a time (versions 1, 2) comes much nearer to it than one kept in 4-16
// vector lanes (3-5) or kiln's blocked sums (6), which the max err column shows.
//
//   lab_softmax_xent_cpu [VERSION|all] [--size R,C] [--repeats N] [--warmup N] [--budget S] [--threads N]
#include <cstdio>
#include <cstring>

#include <kiln/kiln.h>

#include "kiln/kernels/cross_entropy.h"
#include "lab.h"
#include "softmax_xent_ref.h"

namespace {

const char* kUsage =
    "  --size R,C   rows and classes (default 1024,50257: GPT-2's vocabulary)\n"
    "versions: 1 composite, 2 fused, 3 vector exp, 4 wide, 5 threads, 6 kiln\n";

struct Problem {
  const float* x;
  const int64_t* target;
  float g;  // the loss gradient of every row
  int64_t R, C;
  float* loss;
  float* dx;
  float* logp;  // [R, C] scratch, used by the composite only
};

// ------------------------------------------------------------------ 1: composite
// What log_softmax followed by nll_loss does: the forward writes log p (R x C floats) and the
// backward reads it back to form exp(log p) - onehot. Every pass is scalar: std::exp is a
// library call the compiler cannot vectorise, and a max or sum of floats is a dependent chain.
struct RowMax {    // a row's statistics in versions 1 and 2
  float m, log_s;  // m = max_j x_j, log_s = log sum_j exp(x_j - m)
};

RowMax row_max_log_sum(const float* x, int64_t C) {
  float m = -INFINITY, s = 0;
  for (int64_t j = 0; j < C; ++j) m = std::max(m, x[j]);
  for (int64_t j = 0; j < C; ++j) s += std::exp(x[j] - m);
  return {m, std::log(s)};
}

void xent_composite(const Problem& P) {
  const int64_t C = P.C;
  for (int64_t r = 0; r < P.R; ++r) {
    const float* x = P.x + r * C;
    float* lp = P.logp + r * C;
    const RowMax row = row_max_log_sum(x, C);
    for (int64_t j = 0; j < C; ++j) lp[j] = x[j] - row.m - row.log_s;
    P.loss[r] = -lp[P.target[r]];
  }
  for (int64_t r = 0; r < P.R; ++r)
    for (int64_t j = 0; j < C; ++j) P.dx[r * C + j] = (std::exp(P.logp[r * C + j]) - (j == P.target[r])) * P.g;
}

// ------------------------------------------------------------------ 2: fused
// Nothing of size R x C is written but dx: the forward keeps lse per row, and the backward
// recomputes exp(x - lse) from x itself. That saves a write and a read of R x C floats, but the
// exp calls still dominate, so it gains little until they are vectorised.
void xent_row_fused(const Problem& P, int64_t r) {
  const int64_t C = P.C;
  const float* x = P.x + r * C;
  float* dx = P.dx + r * C;
  const RowMax row = row_max_log_sum(x, C);
  const float lse = row.m + row.log_s;
  P.loss[r] = row.log_s - (x[P.target[r]] - row.m);
  for (int64_t j = 0; j < C; ++j) dx[j] = std::exp(x[j] - lse) * P.g;
  dx[P.target[r]] -= P.g;
}

// Versions 2 to 4 differ only in their row function, run on one row after another.
template <auto xent_row> void xent_rows(const Problem& P) {
  for (int64_t r = 0; r < P.R; ++r) xent_row(P, r);
}

// ------------------------------------------------------------------ 3: vector exp
// exp(x) written out so loops over it vectorise: x = n ln2 + r with n = round(x / ln2) and
// |r| <= ln2/2, exp(r) by its Taylor series to degree 7 (truncation error below 1e-8 there),
// times 2^n made in the exponent bits. Branch-free (inputs are clamped to [-87, 88], where 2^n
// is a normal float), so one instruction computes several of them. Max and sum keep their partial
// results in vector lanes (omp simd reduction), which also shortens the dependent chains.
__attribute__((always_inline)) inline float exp_poly(float x) {
  x = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x;
  const float big = 12582912.0f;                                // 1.5 * 2^23: adding it rounds to an integer
  const float n = (x * 1.44269504f + big) - big;                // round(x / ln 2)
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  // x - n ln2 in two parts (exact first product)
  float p = 1.0f / 5040;
  p = p * r + 1.0f / 720, p = p * r + 1.0f / 120, p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6, p = p * r + 0.5f, p = p * r + 1.0f, p = p * r + 1.0f;
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return p * two_n;
}

__attribute__((always_inline)) inline void xent_row_vec(const Problem& P, int64_t r) {
  const int64_t C = P.C;
  const float* x = P.x + r * C;
  float* dx = P.dx + r * C;
  float m = -INFINITY, s = 0;
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < C; ++j) m = std::max(m, x[j]);
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < C; ++j) s += exp_poly(x[j] - m);
  const float log_s = std::log(s), lse = m + log_s, g = P.g;
  P.loss[r] = log_s - (x[P.target[r]] - m);
#pragma omp simd
  for (int64_t j = 0; j < C; ++j) dx[j] = exp_poly(x[j] - lse) * g;
  dx[P.target[r]] -= g;
}

// ------------------------------------------------------------------ 4: wide
// The program is compiled for any x86-64, so version 3 computes 4 exps per SSE instruction.
// Compiled again for AVX-512 (16 floats) and AVX2 + FMA (8), the processor's copy picked when the
// program loads (LAB_CPU_CLONES in lab.h), the same source does 2-4x more per instruction: the
// exp polynomial is arithmetic-bound, so this is most of what separates version 3 from kiln.
LAB_CPU_CLONES void xent_row_wide(const Problem& P, int64_t r) { xent_row_vec(P, r); }

// ------------------------------------------------------------------ 5: threads
// Rows are independent: spread them over the threads. One row (C floats, 200 KB for GPT-2) fits
// in L2, so the backward's second read of it comes from cache, not memory.
void xent_threads(const Problem& P) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < P.R; ++r) xent_row_wide(P, r);
}

// ------------------------------------------------------------------ 6: kiln
// kiln's kernels: the forward saves lse (and supports ignore_index and label smoothing), rows over
// threads, one vectorised pass for max and sum (blocked f32 lanes summed in f64 for long rows)
// with kiln's fast exp, compiled per CPU level (AVX2, AVX-512).
void xent_kiln(const Problem& P) {
  auto f32 = [](const float* p, kiln::IntList s) { return kiln::from_blob(const_cast<float*>(p), s); };
  const kiln::Tensor x = f32(P.x, {P.R, P.C});
  const kiln::Tensor t = kiln::from_blob(const_cast<int64_t*>(P.target), {P.R}, /*deleter=*/nullptr,
                                         kiln::TensorOptions().dtype(kiln::DType::I64));
  const kiln::Tensor lse = kiln::empty({P.R});
  kiln::kernels::cross_entropy_forward(f32(P.loss, {P.R}), lse, x, t, /*ignore_index=*/-100, /*label_smoothing=*/0.0);
  kiln::kernels::cross_entropy_backward(f32(P.dx, {P.R, P.C}), kiln::full({1}, P.g), x, lse, t, -100, 0.0);
}

// ------------------------------------------------------------------ driver

struct Version {
  const char* name;
  void (*run)(const Problem&);
  bool threaded;
};
const Version kVersions[] = {
    {"composite (log_softmax + nll)", xent_composite, false},          // 1
    {"fused (lse only)", xent_rows<xent_row_fused>, false},            // 2
    {"vector exp + simd reductions", xent_rows<xent_row_vec>, false},  // 3
    {"wide", xent_rows<xent_row_wide>, false},                         // 4
    {"threads", xent_threads, true},                                   // 5
    {"kiln cross_entropy", xent_kiln, true},                           // 6
};

}  // namespace

int main(int argc, char** argv) {
  const lab::Options opt = lab::parse_args(argc, argv, kVersions, {1024, 50257}, {2}, kUsage);
  const int64_t R = opt.size[0], C = opt.size[1];
  const int T = lab::max_threads();
  std::printf("lab_softmax_xent_cpu: cross-entropy of x[%lld, %lld], f32, forward + backward; %d threads\n",
              (long long)R, (long long)C, T);
  lab::Buffer<float> x(R * C), dx(R * C), logp(R * C), loss(R);
  lab::Buffer<int64_t> target(R);
  lab::softmax_xent::fill_inputs(x.data(), target.data(), R, C);
  const Problem P{x.data(), target.data(), 1.0f / R, R, C, loss.data(), dx.data(), logp.data()};
  const lab::softmax_xent::Reference ref(x.data(), target.data(), P.g, R, C);

  const std::vector<lab::Peak> peaks = lab::stream_peaks(T);
  lab::Report report("GB/s");
  report.header(peaks);
  for (int vi : opt.versions) {
    const Version& v = kVersions[vi - 1];
    dx.poison(), loss.poison();
    v.run(P);
    report.row(
        vi, v.name, v.threaded ? T : 1, ref.check(loss.data(), dx.data()),
        [&] { return lab::time_cpu([&] { v.run(P); }, opt); }, lab::softmax_xent::bytes(R, C),
        v.threaded ? peaks.back() : peaks.front());
  }
  std::printf(
      "GB/s: minimal traffic (read x, write dx: 8 bytes per element) / median time; %%peak: of the stream "
      "bandwidth on the version's threads; max err: worst |out - ref| / scale (see the header of "
      "bench/lab/softmax_xent_cpu.cpp), tol = C eps / 2\n");
  return report.exit_code();
}
