#pragma once
// What every kernel-lab program shares (docs/lab.md): the command line, timing (warm-up, then the
// median of repeats), validation against a reference with a tolerance derived from the math, the
// peaks the versions are compared with, and the result table.
//
// Standard C++ only (OpenMP when the program is built with it), so the CUDA programs include it
// too; the CPU peaks (x86 intrinsics, OpenMP) are left out of a CUDA compilation.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__x86_64__) && !defined(__CUDACC__)
#include <immintrin.h>
#define LAB_X86_PEAKS 1
#endif

namespace lab {

// ------------------------------------------------------------------------------ command line

struct Options {
  std::vector<int> versions;  // the versions to run, in order
  std::vector<int64_t> size;  // the program's --size values (its defaults when not given)
  int repeats = 7;            // timed calls, at most
  int warmup = 1;             // untimed calls before them (after the validation call)
  double budget_s = 3.0;      // a version stops repeating once its timed calls took this long
};

// `usage` is printed for --help and for a bad argument; `sizes_allowed` lists how many --size
// values the program takes (e.g. {1, 3}: "N" or "M,N,K").
inline Options parse_args(int argc, char** argv, int num_versions, std::vector<int64_t> default_size,
                          std::vector<size_t> sizes_allowed, const char* usage) {
  auto fail = [&](const std::string& why) {
    if (!why.empty()) std::fprintf(stderr, "%s: %s\n", argv[0], why.c_str());
    std::fprintf(stderr,
                 "usage: %s [VERSION[,VERSION...]|all] [--size ...] [--repeats N] [--warmup N] "
                 "[--budget SECONDS] [--threads N (CPU programs)]\n%s",
                 argv[0], usage);
    std::exit(why.empty() ? 0 : 2);
  };
  auto ints = [&](const std::string& s) {
    std::vector<int64_t> v;
    size_t pos = 0;
    while (pos <= s.size()) {
      size_t end = s.find(',', pos);
      if (end == std::string::npos) end = s.size();
      char* stop = nullptr;
      const std::string item = s.substr(pos, end - pos);
      const long long x = std::strtoll(item.c_str(), &stop, 10);
      if (item.empty() || *stop != '\0' || x < 0) fail("not a list of non-negative integers: '" + s + "'");
      v.push_back(x);
      pos = end + 1;
    }
    return v;
  };
  Options o;
  o.size = std::move(default_size);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) fail(a + " needs a value");
      return argv[++i];
    };
    if (a == "-h" || a == "--help") {
      fail("");
    } else if (a == "--size") {
      o.size = ints(value());
      if (std::find(sizes_allowed.begin(), sizes_allowed.end(), o.size.size()) == sizes_allowed.end())
        fail("wrong number of --size values");
    } else if (a == "--repeats") {
      o.repeats = static_cast<int>(ints(value()).at(0));
      if (o.repeats < 1) fail("--repeats must be at least 1");
    } else if (a == "--warmup") {
      o.warmup = static_cast<int>(ints(value()).at(0));
    } else if (a == "--budget") {
      o.budget_s = std::atof(value().c_str());
    } else if (a == "--threads") {
#ifdef _OPENMP
      omp_set_num_threads(std::max<int>(1, static_cast<int>(ints(value()).at(0))));
#else
      value();
#endif
    } else if (a == "all") {
      for (int v = 1; v <= num_versions; ++v) o.versions.push_back(v);
    } else if (!a.empty() && a[0] != '-') {
      for (int64_t v : ints(a)) {
        if (v < 1 || v > num_versions)
          fail("no version " + std::to_string(v) + " (1.." + std::to_string(num_versions) + ")");
        o.versions.push_back(static_cast<int>(v));
      }
    } else {
      fail("unknown argument '" + a + "'");
    }
  }
  if (o.versions.empty())
    for (int v = 1; v <= num_versions; ++v) o.versions.push_back(v);
  return o;
}

// The same for a program's table of versions, kVersions[v - 1] being version v: its length is
// the number of versions.
template <class Version, size_t N>
Options parse_args(int argc, char** argv, const Version (&versions)[N], std::vector<int64_t> default_size,
                   std::vector<size_t> sizes_allowed, const char* usage) {
  return parse_args(argc, argv, static_cast<int>(N), std::move(default_size), std::move(sizes_allowed), usage);
}

// The OpenMP threads a parallel region gets (1 without OpenMP).
inline int max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// ------------------------------------------------------------------------------ memory and data

// A 64-byte aligned array of T (a cache line, and one AVX-512 vector), left uninitialised.
template <class T> class Buffer {
 public:
  explicit Buffer(size_t n = 0)
      : n_(n), p_(static_cast<T*>(std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64 + 64))) {
    if (!p_) {
      std::fprintf(stderr, "out of memory (%zu bytes)\n", n * sizeof(T));
      std::exit(2);
    }
  }
  T* data() { return p_.get(); }
  const T* data() const { return p_.get(); }
  size_t size() const { return n_; }
  T& operator[](size_t i) { return p_.get()[i]; }
  const T& operator[](size_t i) const { return p_.get()[i]; }
  // Fills with NaN before a version's validating call, so an element it does not write fails the
  // check (DeviceBuffer::poison on the GPU).
  void poison() { std::fill(data(), data() + n_, std::numeric_limits<T>::quiet_NaN()); }

 private:
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  size_t n_;
  std::unique_ptr<T, Free> p_;
};

// Deterministic pseudo-random numbers (splitmix64): the same data for any thread count.
inline uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
inline double uniform01(uint64_t& s) { return (splitmix(s) >> 11) * (1.0 / 9007199254740992.0); }

// p[i] = mean + stddev * N(0, 1) (Box-Muller), in chunks seeded from (seed, chunk).
inline void fill_normal(float* p, int64_t n, uint64_t seed, double mean = 0, double stddev = 1) {
  const int64_t chunk = 1 << 16;
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
  for (int64_t c0 = 0; c0 < n; c0 += chunk) {
    uint64_t s = seed * 0x100000001B3ull + static_cast<uint64_t>(c0);
    for (int64_t i = c0; i < std::min(n, c0 + chunk); i += 2) {
      const double r = std::sqrt(-2.0 * std::log(1.0 - uniform01(s))), t = 6.283185307179586 * uniform01(s);
      p[i] = static_cast<float>(mean + stddev * r * std::cos(t));
      if (i + 1 < n) p[i + 1] = static_cast<float>(mean + stddev * r * std::sin(t));
    }
  }
}

// ------------------------------------------------------------------------------ timing

struct Timing {
  double median_s = 0, min_s = 0, max_s = 0;
  int runs = 0;
};

inline Timing summarize(std::vector<double> t) {
  Timing r;
  if (t.empty()) return r;
  std::sort(t.begin(), t.end());
  const size_t n = t.size();
  r.median_s = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
  r.min_s = t.front();
  r.max_s = t.back();
  r.runs = static_cast<int>(n);
  return r;
}

// Wall time of fn (a CPU kernel): o.warmup untimed calls, then up to o.repeats timed ones, fewer
// when they exceed o.budget_s (at least one).
template <class F> Timing time_cpu(F&& fn, const Options& o) {
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < o.warmup; ++i) fn();
  std::vector<double> t;
  double total = 0;
  while (static_cast<int>(t.size()) < o.repeats && (t.empty() || total < o.budget_s)) {
    const auto a = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - a).count());
    total += t.back();
  }
  return summarize(std::move(t));
}

// ------------------------------------------------------------------------------ validation

constexpr double kEpsF32 = std::numeric_limits<float>::epsilon();  // 2^-23: one ulp at 1.0

// The tolerance for a value formed from a K-term f32 sum, relative to the sum of the terms'
// magnitudes: each addition rounds by at most eps/2, and independent roundings grow like
// sqrt(K); the + 4 stands for the few roundings of the formula around the sum (a division, a
// square root, a scale and shift), which dominate when K is small. k leaves room for the largest
// of many outputs. For terms of either sign and similar size (dot products, sums of activations).
inline double sum_tol(int64_t K, double k = 4) {
  return k * kEpsF32 * (std::sqrt(static_cast<double>(std::max<int64_t>(K, 1))) + 4);
}

// The worst case, K eps / 2: the bound of a K-term sum added one term at a time. Needed for many
// positive terms far smaller than their sum (the exps of a softmax over a vocabulary): a running
// sum cuts off the low bits of every small term, so those roundings do not cancel but lean the
// same way, and the error grows like K, not sqrt(K).
inline double sum_tol_linear(int64_t K) { return 0.5 * kEpsF32 * static_cast<double>(std::max<int64_t>(K, 1)); }

// The worst of several compared outputs: error = max_i |out_i - ref_i| / scale_i, where scale_i
// is what the rounding error is proportional to (each program's header says which).
class Check {
 public:
  // Compares n outputs; scale(i) gives the i-th scale. Returns *this for chaining.
  template <class Out, class Ref, class Scale>
  Check& compare(const char* what, const Out* out, const Ref* ref, int64_t n, double tol, Scale scale) {
    double worst = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double diff = std::abs(static_cast<double>(out[i]) - static_cast<double>(ref[i]));
      const double e = diff == 0 ? 0.0 : diff / scale(i);  // exact is exact, even where the scale is 0
      if (!(e <= worst)) worst = e;                        // NaN (a NaN output) sticks
      if (std::isnan(worst)) break;
    }
    record(what, worst, tol);
    return *this;
  }
  void record(const char* what, double err, double tol) {
    const double ratio = err / tol;
    if (worst_ == nullptr || !(ratio <= ratio_)) {
      worst_ = what;
      err_ = err;
      tol_ = tol;
      ratio_ = std::isnan(ratio) ? std::numeric_limits<double>::infinity() : ratio;
    }
  }
  bool pass() const { return worst_ != nullptr && ratio_ <= 1.0; }
  double err() const { return err_; }
  double tol() const { return tol_; }
  const char* worst() const { return worst_ ? worst_ : "-"; }

 private:
  const char* worst_ = nullptr;
  double err_ = 0, tol_ = 0, ratio_ = 0;
};

// ------------------------------------------------------------------------------ the table

struct Peak {
  std::string name;  // e.g. "avx512 1t", "stream 2t", "D2D copy"
  double value = 0;  // in the table's unit
};

// Prints one line per version as it finishes and remembers whether any failed.
class Report {
 public:
  explicit Report(const char* unit) : unit_(unit) {}

  void header(const std::vector<Peak>& peaks) const {
    std::printf("peaks measured in this run:");
    for (const Peak& p : peaks) std::printf("  %s %.1f %s", p.name.c_str(), p.value, unit_);
    std::printf("\n%2s  %-34s %3s %10s %21s %9s %6s %-10s %9s %9s %-6s %s\n", "v", "version", "thr", "median ms",
                "[min - max] ms", unit_, "%peak", "of peak", "max err", "tol", "worst", "check");
  }
  void skipped(int v, const char* name, const std::string& why) const {
    std::printf("%2d  %-34s skipped: %s\n", v, name, why.c_str());
  }
  // Version v's line, once its validating call was checked: time() (a callable returning the
  // version's Timing) runs only when the check passed. threads: the CPU threads the version used,
  // 0 for a GPU kernel.
  template <class Time>
  void row(int v, const std::string& name, int threads, const Check& c, Time&& time, double work, const Peak& peak) {
    print_row(v, name.c_str(), threads, c.pass() ? time() : Timing{}, work, peak, c);
  }
  int exit_code() const {
    if (failed_) std::printf("FAILED: at least one version does not match the reference\n");
    return failed_ ? 1 : 0;
  }

 private:
  // A failed check is reported without timings: a fast wrong kernel is not a result.
  void print_row(int v, const char* name, int threads, const Timing& t, double work, const Peak& peak, const Check& c) {
    const std::string thr = threads > 0 ? std::to_string(threads) : "gpu";
    if (!c.pass()) {
      failed_ = true;
      std::printf("%2d  %-34s %3s %10s %21s %9s %6s %-10s %9.2e %9.2e %-6s FAIL\n", v, name, thr.c_str(), "-", "-", "-",
                  "-", "-", c.err(), c.tol(), c.worst());
      std::fflush(stdout);
      return;
    }
    const double rate = work / t.median_s / 1e9;
    char range[32];
    std::snprintf(range, sizeof range, "[%.3f - %.3f]", t.min_s * 1e3, t.max_s * 1e3);
    std::printf("%2d  %-34s %3s %10.3f %21s %9.2f %5.1f%% %-10s %9.2e %9.2e %-6s PASS (%d runs)\n", v, name,
                thr.c_str(), t.median_s * 1e3, range, rate, 100 * rate / peak.value, peak.name.c_str(), c.err(),
                c.tol(), c.worst(), t.runs);
    std::fflush(stdout);
  }

  const char* unit_;
  bool failed_ = false;
};

#ifdef LAB_X86_PEAKS
// ------------------------------------------------------------------------------ CPU peaks

// Compiles a function three times, for AVX-512 (x86-64-v4), AVX2 + FMA (x86-64-v3) and plain
// x86-64, and lets the program loader pick the copy this processor runs (GCC's target_clones).
// Code it calls must be inlined into it to be compiled wider too: mark that `always_inline`.
#define LAB_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

// Memory bandwidth: the better of two streaming loops over 64 MiB arrays (twice the largest L3 of
// current server parts per array), each counted as the kernels' traffic is, by the bytes the
// code reads and writes: the STREAM triad a = b + s c (12 bytes per element; its store also
// makes the cache read a's line first, which the count leaves out, as for the kernels that
// write a separate output) and the in-place update a = a + s b (12 bytes, no such extra read,
// as for AdamW). The best of 5 runs of each on `threads` threads, each thread running the loop
// compiled for the widest vectors the processor has.
LAB_CPU_CLONES inline void triad_range(float* a, const float* b, const float* c, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) a[i] = b[i] + 0.5f * c[i];
}
LAB_CPU_CLONES inline void update_range(float* a, const float* b, const float*, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) a[i] = a[i] + 0.5f * b[i];
}

inline double stream_gbs(int threads) {
  const int64_t n = int64_t(16) << 20;
  Buffer<float> a(n), b(n), c(n);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t i = 0; i < n; ++i) a[i] = 0, b[i] = 1, c[i] = 2;  // first touch by the same threads
  double best = 1e30;
  for (auto* loop : {triad_range, update_range})
    for (int rep = 0; rep < 5; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
      {
        const int t = omp_get_thread_num(), T = omp_get_num_threads();
        loop(a.data(), b.data(), c.data(), n * t / T, n * (t + 1) / T);  // the static schedule's shares
      }
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  return 12.0 * static_cast<double>(n) / best / 1e9;
}

// The peaks of a memory-bound CPU program: the streaming bandwidth on one thread and, when there
// are more, on all T. A single-threaded version is compared with peaks.front(), a threaded one
// with peaks.back().
inline std::vector<Peak> stream_peaks(int T) {
  std::vector<Peak> peaks{{"stream 1t", stream_gbs(1)}};
  if (T > 1) peaks.push_back({"stream " + std::to_string(T) + "t", stream_gbs(T)});
  return peaks;
}

// Arithmetic peak: 12 independent chains of vector multiply-adds acc = STEP(acc, m, a) per thread
// (enough to cover an FMA's latency on two FMA pipes), so nothing but the FMA units limits them;
// the lanes are summed at the end so the chains are not optimised away. One body for the three
// instruction sets, written as a macro: an intrinsic may only be named in a function compiled for
// its instruction set, and a template shared by the three would be compiled for plain x86-64.
#define LAB_MUL_ADD_CHAINS(NAME, TARGET, V, SET1, STEP)                                  \
  TARGET inline float NAME(int64_t iters) {                                              \
    V acc[12];                                                                           \
    const V m = SET1(0.999999f), a = SET1(1e-7f);                                        \
    for (int i = 0; i < 12; ++i) acc[i] = SET1(static_cast<float>(i));                   \
    for (int64_t k = 0; k < iters; ++k)                                                  \
      _Pragma("GCC unroll 12") for (int i = 0; i < 12; ++i) acc[i] = STEP(acc[i], m, a); \
    float s = 0;                                                                         \
    for (const V& v : acc)                                                               \
      for (size_t l = 0; l < sizeof(V) / sizeof(float); ++l) s += v[l];                  \
    return s;                                                                            \
  }
LAB_MUL_ADD_CHAINS(fma_chains_avx512, __attribute__((target("avx512f"))), __m512, _mm512_set1_ps, _mm512_fmadd_ps)
LAB_MUL_ADD_CHAINS(fma_chains_avx2, __attribute__((target("avx2,fma"))), __m256, _mm256_set1_ps, _mm256_fmadd_ps)
// plain x86-64 has no FMA: a multiply, then an add
__attribute__((always_inline)) inline __m128 mul_then_add(__m128 x, __m128 m, __m128 a) {
  return _mm_add_ps(_mm_mul_ps(x, m), a);
}
LAB_MUL_ADD_CHAINS(mul_add_chains_sse, , __m128, _mm_set1_ps, mul_then_add)
#undef LAB_MUL_ADD_CHAINS

enum class Isa { sse, avx2, avx512 };
inline bool cpu_has(Isa isa) {
  if (isa == Isa::avx512) return __builtin_cpu_supports("avx512f");
  if (isa == Isa::avx2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return true;
}
inline const char* isa_name(Isa isa) { return isa == Isa::avx512 ? "avx512" : isa == Isa::avx2 ? "avx2" : "sse"; }

// GFLOP/s of the chains above on `threads` threads at once, the best of 3 runs of `iters` steps.
inline double fma_peak_gflops(Isa isa, int threads, int64_t iters = 10'000'000) {
  float (*chains)(int64_t) = isa == Isa::avx512 ? fma_chains_avx512
                             : isa == Isa::avx2 ? fma_chains_avx2
                                                : mul_add_chains_sse;
  const int lanes = isa == Isa::avx512 ? 16 : isa == Isa::avx2 ? 8 : 4;
  double best = 1e30;
  float sink = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    sink += chains(iters);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  if (sink == 12345.f) std::printf(" ");  // keeps the chains from being optimised away
  return 2.0 * lanes * 12 * static_cast<double>(iters) * threads / best / 1e9;
}
#endif  // LAB_X86_PEAKS

}  // namespace lab
