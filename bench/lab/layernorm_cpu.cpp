// lab_layernorm_cpu: layer norm over the last dimension of x [R, C], forward and backward, f32.
//   forward:  mean_r = sum_j x_rj / C,  rstd_r = 1 / sqrt(sum_j (x_rj - mean_r)^2 / C + eps),
//             y_rj = (x_rj - mean_r) rstd_r w_j + b_j        (mean and rstd are saved)
//   backward: xhat = (x - mean) rstd,  gw = g w,
//             dx_rj = rstd_r (gw_rj - mean_j(gw_r) - xhat_rj mean_j(gw_r xhat_r)),
//             dw_j = sum_r g_rj xhat_rj,  db_j = sum_r g_rj
// A row (C floats) fits in L1, so the passes over it after the first cost no memory traffic: the
// kernels are memory-bound once their arithmetic keeps up, and are compared with the streaming
// bandwidth (lab.h, stream_gbs) measured in the same run on as many threads as the version uses. GB/s counts the
// minimal traffic: forward reads x and writes y (8 bytes per element), backward reads x and g and
// writes dx (12 bytes per element); the per-row statistics and dw, db are counted too.
//
//   1 naive     one thread; each sum is one chain of dependent f32 additions
//   2 simd      one thread; the sums kept in vector lanes
//   3 wide      version 2 compiled for the processor's widest vectors (AVX-512, AVX2 or SSE)
//   4 threads   version 3 with rows spread over the threads
//   5 kiln      kiln's layer-norm kernels (kiln/kernels/norm.h, kernels/cpu/norm.cpp)
//
// Validation against f64 (layernorm_ref.h, shared with layernorm_cuda.cu; each C-term sum rounds
// like sum_tol(C), each R-term sum like sum_tol(R)): y against |w| (|xhat| + 1) + |b|; mean
// against |mean| + std; rstd against itself;
// dx against rstd (|gw| + mean|gw| + |xhat| mean|gw xhat|); dw, db against the sums of |terms|.
// The backward of every version gets the same (f32) mean and rstd.
//
//   lab_layernorm_cpu [VERSION|all] [--size R,C] [--repeats N] [--warmup N] [--budget S] [--threads N]
#include <cstdio>

#include <kiln/kiln.h>

#include "kiln/kernels/norm.h"
#include "lab.h"
#include "layernorm_ref.h"

namespace {

const char* kUsage =
    "  --size R,C   rows and row length (default 32768,768: GPT-2's width, 32 x 1024 tokens)\n"
    "versions: 1 naive, 2 simd, 3 wide, 4 threads, 5 kiln\n";
using lab::layernorm::kEps;

struct Inputs {  // forward: x, w, b; backward: also g and the saved statistics
  const float *x, *w, *b, *g, *mean, *rstd;
  int64_t R, C;
};
struct Outputs {
  float *y, *mean, *rstd, *dx, *dw, *db;
};

// ------------------------------------------------------------------ 1: naive
// The formulas as written, one row after another. The row is read three times (sum, squared
// deviations, output) but from L1 after the first; what limits it is that `s += x[j]` is a chain
// of dependent additions (4 cycles each), which the compiler may not reorder for floats.
void fwd_naive(const Inputs& in, const Outputs& out) {
  const int64_t C = in.C;
  for (int64_t r = 0; r < in.R; ++r) {
    const float* x = in.x + r * C;
    float* y = out.y + r * C;
    float s = 0;
    for (int64_t j = 0; j < C; ++j) s += x[j];
    const float m = s / C;
    float v = 0;
    for (int64_t j = 0; j < C; ++j) v += (x[j] - m) * (x[j] - m);
    const float rs = 1.0f / std::sqrt(v / C + kEps);
    for (int64_t j = 0; j < C; ++j) y[j] = (x[j] - m) * rs * in.w[j] + in.b[j];
    out.mean[r] = m;
    out.rstd[r] = rs;
  }
}

void bwd_naive(const Inputs& in, const Outputs& out) {
  const int64_t C = in.C;
  std::fill(out.dw, out.dw + C, 0.0f);
  std::fill(out.db, out.db + C, 0.0f);
  for (int64_t r = 0; r < in.R; ++r) {
    const float *x = in.x + r * C, *g = in.g + r * C;
    const float m = in.mean[r], rs = in.rstd[r];
    float a = 0, b = 0;
    for (int64_t j = 0; j < C; ++j) {
      a += g[j] * in.w[j];
      b += g[j] * in.w[j] * (x[j] - m) * rs;
    }
    a /= C;
    b /= C;
    for (int64_t j = 0; j < C; ++j) {
      const float xh = (x[j] - m) * rs;
      out.dx[r * C + j] = rs * (g[j] * in.w[j] - a - xh * b);
      out.dw[j] += g[j] * xh;
      out.db[j] += g[j];
    }
  }
}

// ------------------------------------------------------------------ 2: simd
// `omp simd reduction(+ : s)` allows the sums to be reassociated: each vector lane keeps its own
// partial sum and they are added at the end, so 4-16 additions (the lanes) are in flight per
// instruction and several instructions overlap. The results change by rounding only, and the
// lane-wise sums are usually more accurate than one long chain. (always_inline: version 3
// compiles these row functions again inside its own.)
__attribute__((always_inline)) inline void fwd_row_simd(const float* x, const float* w, const float* bias, float* y,
                                                        float* mean, float* rstd, int64_t C) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < C; ++j) s += x[j];
  const float m = s / C;
  float v = 0;
#pragma omp simd reduction(+ : v)
  for (int64_t j = 0; j < C; ++j) v += (x[j] - m) * (x[j] - m);
  const float rs = 1.0f / std::sqrt(v / C + kEps);
#pragma omp simd
  for (int64_t j = 0; j < C; ++j) y[j] = (x[j] - m) * rs * w[j] + bias[j];
  *mean = m;
  *rstd = rs;
}

// One row's dx, and its terms added to the dw, db accumulators.
__attribute__((always_inline)) inline void bwd_row_simd(const float* x, const float* g, const float* w, float m,
                                                        float rs, float* dx, float* dw, float* db, int64_t C) {
  float a = 0, b = 0;
#pragma omp simd reduction(+ : a, b)
  for (int64_t j = 0; j < C; ++j) {
    a += g[j] * w[j];
    b += g[j] * w[j] * (x[j] - m) * rs;
  }
  a /= C;
  b /= C;
#pragma omp simd
  for (int64_t j = 0; j < C; ++j) {
    const float xh = (x[j] - m) * rs;
    dx[j] = rs * (g[j] * w[j] - a - xh * b);
    dw[j] += g[j] * xh;
    db[j] += g[j];
  }
}

// The loops over the rows around a version's row functions (versions 2 and 3 differ only in
// those): the forward's, and the backward's, which adds each row's terms to dw, db.
template <auto fwd_row> void fwd_rows(const Inputs& in, const Outputs& out) {
  for (int64_t r = 0; r < in.R; ++r)
    fwd_row(in.x + r * in.C, in.w, in.b, out.y + r * in.C, out.mean + r, out.rstd + r, in.C);
}

template <auto bwd_row> void bwd_rows(const Inputs& in, const Outputs& out) {
  std::fill(out.dw, out.dw + in.C, 0.0f);
  std::fill(out.db, out.db + in.C, 0.0f);
  for (int64_t r = 0; r < in.R; ++r)
    bwd_row(in.x + r * in.C, in.g + r * in.C, in.w, in.mean[r], in.rstd[r], out.dx + r * in.C, out.dw, out.db, in.C);
}

// ------------------------------------------------------------------ 3: wide
// The program is compiled for any x86-64, so versions 1 and 2 get 4-float SSE vectors. The row
// functions of version 2 compiled again for AVX-512 (16 floats per instruction) and AVX2 (8, with
// FMA), the processor's copy picked when the program loads (LAB_CPU_CLONES in lab.h): the same
// source does 2-4x more per instruction, as kiln's kernels, compiled once per CPU level, do.
LAB_CPU_CLONES void fwd_row_wide(const float* x, const float* w, const float* bias, float* y, float* mean, float* rstd,
                                 int64_t C) {
  fwd_row_simd(x, w, bias, y, mean, rstd, C);
}
LAB_CPU_CLONES void bwd_row_wide(const float* x, const float* g, const float* w, float m, float rs, float* dx,
                                 float* dw, float* db, int64_t C) {
  bwd_row_simd(x, g, w, m, rs, dx, dw, db, C);
}

// ------------------------------------------------------------------ 4: threads
// One core cannot pull the memory bandwidth of the whole processor: rows are independent, so
// they are split among the threads. dw and db sum over rows, so each thread accumulates its own
// partial sums, added in thread order afterwards (the same result on every run).
void fwd_threads(const Inputs& in, const Outputs& out) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < in.R; ++r)
    fwd_row_wide(in.x + r * in.C, in.w, in.b, out.y + r * in.C, out.mean + r, out.rstd + r, in.C);
}

void bwd_threads(const Inputs& in, const Outputs& out) {
  const int64_t C = in.C;
  const int T = lab::max_threads();
  std::vector<float> partial(2 * T * C, 0.0f);  // [thread][dw | db][C]
#pragma omp parallel num_threads(T)
  {
    float* dw = partial.data() + 2 * C * omp_get_thread_num();
    float* db = dw + C;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < in.R; ++r)
      bwd_row_wide(in.x + r * C, in.g + r * C, in.w, in.mean[r], in.rstd[r], out.dx + r * C, dw, db, C);
  }
  std::fill(out.dw, out.dw + C, 0.0f);
  std::fill(out.db, out.db + C, 0.0f);
  for (int t = 0; t < T; ++t)
    for (int64_t j = 0; j < C; ++j) out.dw[j] += partial[2 * C * t + j], out.db[j] += partial[2 * C * t + C + j];
}

// ------------------------------------------------------------------ 5: kiln
// kiln's kernels: rows over threads as in 4, compiled once per CPU level (AVX2, AVX-512) and
// picked at run time, the statistics and dw, db accumulated in f64 (one pass for the mean and
// variance, shifted by the row's first value so that pass stays accurate).
kiln::Tensor view(const float* p, kiln::IntList sizes) { return kiln::from_blob(const_cast<float*>(p), sizes); }

void fwd_kiln(const Inputs& in, const Outputs& out) {
  kiln::kernels::row_norm_forward(view(out.y, {in.R, in.C}), view(out.mean, {in.R}), view(out.rstd, {in.R}),
                                  view(in.x, {in.R, in.C}), view(in.w, {in.C}), view(in.b, {in.C}), false, kEps);
}

void bwd_kiln(const Inputs& in, const Outputs& out) {
  kiln::kernels::row_norm_backward(view(out.dx, {in.R, in.C}), view(out.dw, {in.C}), view(out.db, {in.C}),
                                   view(in.g, {in.R, in.C}), view(in.x, {in.R, in.C}), view(in.w, {in.C}),
                                   view(in.mean, {in.R}), view(in.rstd, {in.R}), false);
}

// ------------------------------------------------------------------ driver

struct Version {
  const char* name;
  void (*fwd)(const Inputs&, const Outputs&);
  void (*bwd)(const Inputs&, const Outputs&);
  bool threaded;
};
const Version kVersions[] = {
    {"naive", fwd_naive, bwd_naive, false},                           // 1
    {"simd", fwd_rows<fwd_row_simd>, bwd_rows<bwd_row_simd>, false},  // 2
    {"wide", fwd_rows<fwd_row_wide>, bwd_rows<bwd_row_wide>, false},  // 3
    {"threads", fwd_threads, bwd_threads, true},                      // 4
    {"kiln", fwd_kiln, bwd_kiln, true},                               // 5
};

}  // namespace

int main(int argc, char** argv) {
  const lab::Options opt = lab::parse_args(argc, argv, kVersions, {32768, 768}, {2}, kUsage);
  const int64_t R = opt.size[0], C = opt.size[1];
  const int T = lab::max_threads();
  std::printf("lab_layernorm_cpu: layer norm of x[%lld, %lld], f32, forward and backward; %d threads\n", (long long)R,
              (long long)C, T);
  lab::Buffer<float> x(R * C), g(R * C), w(C), b(C), y(R * C), dx(R * C), mean(R), rstd(R), smean(R), srstd(R), dw(C),
      db(C);
  lab::layernorm::fill_inputs(x.data(), g.data(), w.data(), b.data(), R, C);
  // the statistics every backward gets: the f32 forward's (naive version), so all agree
  Inputs in{x.data(), w.data(), b.data(), g.data(), smean.data(), srstd.data(), R, C};
  fwd_naive(in, Outputs{y.data(), smean.data(), srstd.data(), nullptr, nullptr, nullptr});
  const lab::layernorm::Reference ref(x.data(), g.data(), w.data(), b.data(), smean.data(), srstd.data(), R, C);

  const std::vector<lab::Peak> peaks = lab::stream_peaks(T);
  lab::Report report("GB/s");
  report.header(peaks);
  const Outputs out{y.data(), mean.data(), rstd.data(), dx.data(), dw.data(), db.data()};
  for (int vi : opt.versions) {
    const Version& v = kVersions[vi - 1];
    const int threads = v.threaded ? T : 1;
    const lab::Peak& peak = v.threaded ? peaks.back() : peaks.front();
    for (auto* buf : {&y, &mean, &rstd}) buf->poison();
    v.fwd(in, out);
    report.row(
        vi, std::string(v.name) + ": forward", threads, ref.check_forward(y.data(), mean.data(), rstd.data()),
        [&] { return lab::time_cpu([&] { v.fwd(in, out); }, opt); }, lab::layernorm::forward_bytes(R, C), peak);
    for (auto* buf : {&dx, &dw, &db}) buf->poison();
    v.bwd(in, out);
    report.row(
        vi, std::string(v.name) + ": backward", threads, ref.check_backward(dx.data(), dw.data(), db.data()),
        [&] { return lab::time_cpu([&] { v.bwd(in, out); }, opt); }, lab::layernorm::backward_bytes(R, C), peak);
  }
  std::printf(
      "GB/s: minimal traffic / median time (forward 8, backward 12 bytes per element); %%peak: of the stream "
      "bandwidth on the version's threads; max err: worst |out - ref| / scale (see the header of "
      "bench/lab/layernorm_cpu.cpp), tol = 4 eps (sqrt(C) + 4) (R for dw, db)\n");
  return report.exit_code();
}
