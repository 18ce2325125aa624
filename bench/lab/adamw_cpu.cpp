// lab_adamw_cpu: one AdamW step over a model's parameter list (torch.optim.AdamW's rule), f32.
//   p *= 1 - lr wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// The parameters are GPT-2's (width 768) block after block, cut at --size elements in all: big
// matrices beside many 768-element vectors, as in a real model. Each element is read (p, g, m, v)
// and written (p, m, v) once at least, 28 bytes: GB/s counts that minimal traffic and is compared
// with the streaming bandwidth (lab.h, stream_gbs) measured in the same run on as many threads.
//
//   1 unfused        one pass per tensor operation, as a loop of tensor ops does (5 passes, a temporary)
//   2 fused          the whole update in one pass per tensor
//   3 fused threads  version 2 with each tensor split over the threads
//   4 multi-tensor   every tensor cut into fixed chunks, all chunks in one parallel loop
//   5 kiln           kiln::optim::AdamW::step() (the multi-tensor launcher of kernels/multi_tensor.h)
//
// Validation: three steps from p0, m = v = 0 (t = 1, 2, 3, the same g) against the same steps in
// f64 (adamw_ref.h, shared with adamw_cuda.cu). No sums are involved, only a few roundings per
// operation, so p is compared against |p| + lr and m, v against themselves, with tol = 32 eps
// (p: three steps of ~10 roundings) and 16 eps (m, v). kiln keeps its moments to itself: its p is
// checked.
//
//   lab_adamw_cpu [VERSION|all] [--size N] [--repeats N] [--warmup N] [--budget S] [--threads N]
#include <cstdio>
#include <memory>

#include <kiln/kiln.h>

#include "adamw_ref.h"
#include "lab.h"

namespace {

const char* kUsage =
    "  --size N   parameters in all (default 28000000: four GPT-2 blocks)\n"
    "versions: 1 unfused, 2 fused, 3 fused threads, 4 multi-tensor, 5 kiln\n";
using lab::adamw::Hyper;
using lab::adamw::kBeta1, lab::adamw::kBeta2, lab::adamw::kEps, lab::adamw::kLr, lab::adamw::kWd;
using lab::adamw::Param;

struct State {
  std::vector<Param> list;
  float *p, *m, *v, *tmp;
  const float* g;
  std::unique_ptr<kiln::optim::AdamW> kiln_opt;  // version 5's optimizer, made at t = 1
};

// ------------------------------------------------------------------ 1: unfused
// What `for p in params: p.mul_(...); m.lerp_(...); v.mul_(...).addcmul_(...); ...` does: each
// operation is a loop over the whole tensor, so p, m, v are read and written several times and
// sqrt(v) goes through a temporary: about 14 arrays' worth of traffic instead of 7.
void adamw_unfused(State& S, int t) {
  const Hyper h(t);
  for (const Param& T : S.list) {
    float *p = S.p + T.offset, *m = S.m + T.offset, *v = S.v + T.offset, *tmp = S.tmp + T.offset;
    const float* g = S.g + T.offset;
    const int64_t n = T.numel;
    for (int64_t i = 0; i < n; ++i) p[i] *= h.decay;
    for (int64_t i = 0; i < n; ++i) m[i] = h.b1 * m[i] + h.one_minus_b1 * g[i];
    for (int64_t i = 0; i < n; ++i) v[i] = h.b2 * v[i] + h.one_minus_b2 * g[i] * g[i];
    for (int64_t i = 0; i < n; ++i) tmp[i] = std::sqrt(v[i]) * h.inv_bc2_sqrt + h.eps;
    for (int64_t i = 0; i < n; ++i) p[i] -= h.step_size * (m[i] / tmp[i]);
  }
}

// ------------------------------------------------------------------ 2: fused
// The update of one element needs only that element of p, g, m, v: do all of it while they are
// in registers. One pass, 7 arrays' traffic, no temporary; the loop vectorises (sqrt and
// division have vector instructions).
inline void adamw_range(const Hyper& h, float* p, const float* g, float* m, float* v, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float mi = h.b1 * m[i] + h.one_minus_b1 * g[i];
    const float vi = h.b2 * v[i] + h.one_minus_b2 * g[i] * g[i];
    p[i] = p[i] * h.decay - h.step_size * (mi / (std::sqrt(vi) * h.inv_bc2_sqrt + h.eps));
    m[i] = mi;
    v[i] = vi;
  }
}

void adamw_fused(State& S, int t) {
  const Hyper h(t);
  for (const Param& T : S.list) adamw_range(h, S.p + T.offset, S.g + T.offset, S.m + T.offset, S.v + T.offset, T.numel);
}

// ------------------------------------------------------------------ 3: fused threads
// One core cannot use the whole memory bandwidth: split each tensor among the threads. Every
// tensor pays a fork and a join, and a 768-element one is not worth splitting.
void adamw_fused_threads(State& S, int t) {
  const Hyper h(t);
  const int T = lab::max_threads();
  for (const Param& X : S.list) {
    const int64_t per = (X.numel + T - 1) / T;
#pragma omp parallel for schedule(static) num_threads(T)
    for (int k = 0; k < T; ++k) {
      const int64_t b = std::min(X.numel, k * per), e = std::min(X.numel, b + per);
      adamw_range(h, S.p + X.offset + b, S.g + X.offset + b, S.m + X.offset + b, S.v + X.offset + b, e - b);
    }
  }
}

// ------------------------------------------------------------------ 4: multi-tensor
// The whole list as one piece of work: cut every tensor into chunks of at most 64K elements and
// run all chunks in a single parallel loop. One fork and join per step, small tensors share a
// thread's time instead of being split, and the threads get equal shares of the traffic.
void adamw_multi_tensor(State& S, int t) {
  const Hyper h(t);
  constexpr int64_t kChunk = 65536;
  struct Chunk {
    int64_t offset, numel;
  };
  std::vector<Chunk> chunks;  // cheap next to the step; a real optimizer builds it once
  for (const Param& X : S.list)
    for (int64_t b = 0; b < X.numel; b += kChunk) chunks.push_back({X.offset + b, std::min(kChunk, X.numel - b)});
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < chunks.size(); ++c) {
    const Chunk& k = chunks[c];
    adamw_range(h, S.p + k.offset, S.g + k.offset, S.m + k.offset, S.v + k.offset, k.numel);
  }
}

// ------------------------------------------------------------------ 5: kiln
// kiln::optim::AdamW: the multi-tensor design of 4 (chunks over threads, one parallel region),
// the update rule written once for the CPU and CUDA, compiled per CPU level; the step count and
// learning rate live in tensors so a CUDA step needs no host synchronisation.
void adamw_kiln(State& S, int t) {
  if (t == 1) {  // a fresh optimizer: zero moments, step 1
    std::vector<kiln::Tensor> params;
    for (const Param& X : S.list) {
      kiln::Tensor p = kiln::from_blob(S.p + X.offset, {X.numel});
      p.requires_grad_();
      p.set_grad(kiln::from_blob(const_cast<float*>(S.g) + X.offset, {X.numel}));
      params.push_back(p);
    }
    S.kiln_opt = std::make_unique<kiln::optim::AdamW>(
        params, kiln::optim::AdamWOptions(kLr).betas({kBeta1, kBeta2}).eps(kEps).weight_decay(kWd));
  }
  S.kiln_opt->step();
}

// ------------------------------------------------------------------ driver

struct Version {
  const char* name;
  void (*step)(State&, int);
  bool threaded;
  bool moments_visible;  // whether m and v are in the lab's buffers (kiln keeps its own)
};
const Version kVersions[] = {
    {"unfused (one pass per op)", adamw_unfused, false, true},             // 1
    {"fused", adamw_fused, false, true},                                   // 2
    {"fused, each tensor over threads", adamw_fused_threads, true, true},  // 3
    {"multi-tensor chunks", adamw_multi_tensor, true, true},               // 4
    {"kiln AdamW", adamw_kiln, true, false},                               // 5
};

}  // namespace

int main(int argc, char** argv) {
  const lab::Options opt = lab::parse_args(argc, argv, kVersions, {28000000}, {1}, kUsage);
  const int T = lab::max_threads();
  int64_t padded = 0;
  State S;
  S.list = lab::adamw::gpt2_like_list(opt.size[0], &padded);
  const int64_t N = opt.size[0];
  std::printf("lab_adamw_cpu: AdamW step, f32, %lld parameters in %zu tensors; %d threads\n", (long long)N,
              S.list.size(), T);
  lab::Buffer<float> p0(padded), p(padded), g(padded), m(padded), v(padded), tmp(padded);
  lab::adamw::fill_inputs(p0.data(), g.data(), padded);
  S.p = p.data(), S.m = m.data(), S.v = v.data(), S.tmp = tmp.data(), S.g = g.data();
  const lab::adamw::Reference ref(p0.data(), g.data(), S.list, padded);

  const std::vector<lab::Peak> peaks = lab::stream_peaks(T);
  lab::Report report("GB/s");
  report.header(peaks);
  for (int vi : opt.versions) {
    const Version& ver = kVersions[vi - 1];
    std::copy(p0.data(), p0.data() + padded, p.data());
    std::fill(m.data(), m.data() + padded, 0.0f);
    std::fill(v.data(), v.data() + padded, 0.0f);
    for (int t = 1; t <= lab::adamw::kCheckedSteps; ++t) ver.step(S, t);
    lab::Check check;
    ref.compare_p(check, p.data());
    if (ver.moments_visible) ref.compare_m(check, m.data()), ref.compare_v(check, v.data());
    int t = lab::adamw::kCheckedSteps + 1;
    report.row(
        vi, ver.name, ver.threaded ? T : 1, check, [&] { return lab::time_cpu([&] { ver.step(S, t++); }, opt); },
        lab::adamw::bytes(N), ver.threaded ? peaks.back() : peaks.front());
    S.kiln_opt.reset();
  }
  std::printf(
      "GB/s: minimal traffic (28 bytes per parameter) / median time; %%peak: of the stream bandwidth on the "
      "version's threads; max err: worst |out - ref| / scale (see the header of bench/lab/adamw_cpu.cpp)\n");
  return report.exit_code();
}
