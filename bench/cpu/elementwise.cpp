// CPU elementwise and reduction bandwidth against a multi-threaded memcpy measured in the same
// run (the ceiling). Target: >= 70% of memcpy on large tensors. Bytes counted are
// the bytes each kernel must move (reads + writes).
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <cstring>

#include <kiln/kiln.h>

#include "../bench_util.h"

namespace {

double max_abs_diff(const kiln::Tensor& a, const kiln::Tensor& b) {
  return kiln::abs(a.to(kiln::DType::F64) - b.to(kiln::DType::F64)).max().item<double>();
}

void row(const char* name, double seconds, double bytes, double ceiling_gbs) {
  double gbs = bytes / seconds / 1e9;
  std::printf("%-34s %9.3f ms %8.2f GB/s %6.0f%% of memcpy\n", name, seconds * 1e3, gbs, 100 * gbs / ceiling_gbs);
}

}  // namespace

int main() {
  kiln::NoGradGuard ng;
  kiln::manual_seed(0);
  const int64_t n = 1 << 24;  // 16M floats = 64 MiB per tensor, far beyond the caches
  auto a = kiln::randn({n}), b = kiln::randn({n});
  auto out = kiln::empty({n});
  std::printf("threads: %d, tensor: %lld floats (%.0f MiB)\n", omp_get_max_threads(), (long long)n,
              n * 4.0 / (1 << 20));

  // Ceiling: a parallel memcpy of one tensor (read 64 MiB + write 64 MiB).
  char* dst = static_cast<char*>(out.data_ptr());
  const char* src = static_cast<const char*>(a.data_ptr());
  const int64_t nbytes = n * 4;
  double tc = kiln::bench::time_median([&] {
#pragma omp parallel
    {
      int t = omp_get_thread_num(), nt = omp_get_num_threads();
      int64_t per = (nbytes + nt - 1) / nt, beg = std::min<int64_t>(nbytes, t * per);
      std::memcpy(dst + beg, src + beg, std::min<int64_t>(per, nbytes - beg));
    }
  });
  double t1 = kiln::bench::time_median([&] { std::memcpy(dst, src, nbytes); });
  tc = std::min(tc, t1);  // the better of one thread and all threads
  const double ceiling = 2.0 * nbytes / tc / 1e9;
  std::printf("%-34s %9.3f ms %8.2f GB/s (ceiling)\n", "memcpy (best of 1/all threads)", tc * 1e3, ceiling);

  kiln::Tensor r;
  double t;
  t = kiln::bench::time_median([&] { r = a + b; });
  kiln::bench::validate(max_abs_diff(r.slice(0, 0, 1000), a.slice(0, 0, 1000) + b.slice(0, 0, 1000)) == 0, "add", 0);
  {  // spot-check against scalar math
    float x = a[12345].item<float>(), y = b[12345].item<float>();
    kiln::bench::validate(r[12345].item<float>() == x + y, "add value", r[12345].item<float>() - (x + y));
  }
  row("a + b (new output)", t, 3.0 * nbytes, ceiling);
  t = kiln::bench::time_median([&] { out.copy_(a); });
  row("copy_ (f32 -> f32)", t, 2.0 * nbytes, ceiling);
  t = kiln::bench::time_median([&] { r = a * 3.0; });
  row("a * 3.0", t, 2.0 * nbytes, ceiling);
  t = kiln::bench::time_median([&] { r = kiln::gelu(a); });
  {
    float x = a[777].item<float>();
    double ref = x * 0.5 * (1 + std::erf(x / std::sqrt(2.0)));
    kiln::bench::validate(std::abs(r[777].item<float>() - ref) < 1e-5, "gelu value", r[777].item<float>() - ref);
  }
  row("gelu (fused, erf form)", t, 2.0 * nbytes, ceiling);
  t = kiln::bench::time_median([&] { r = kiln::exp(a); });
  row("exp", t, 2.0 * nbytes, ceiling);
  t = kiln::bench::time_median([&] { r = a.to(kiln::DType::F16); });
  row("cast f32 -> f16", t, 1.5 * nbytes, ceiling);
  t = kiln::bench::time_median([&] { r = a.sum(); });
  {
    double ref = a.to(kiln::DType::F64).sum().item<double>();
    kiln::bench::validate(std::abs(r.item<double>() - ref) < 1e-2, "sum", r.item<double>() - ref);
  }
  row("sum (all)", t, 1.0 * nbytes, ceiling);
  auto m = a.view({4096, 4096});
  t = kiln::bench::time_median([&] { r = m.sum({1}); });
  row("sum over rows [4096, 4096] -> [4096]", t, 1.0 * nbytes, ceiling);
  t = kiln::bench::time_median([&] { r = m.sum({0}); });
  kiln::bench::validate(max_abs_diff(r, m.t().contiguous().sum({1})) < 1e-2, "sum dim 0", 0);
  row("sum over cols [4096, 4096] -> [4096]", t, 1.0 * nbytes, ceiling);
  auto mt = m.t();
  t = kiln::bench::time_median([&] { r = mt.contiguous(); });
  row("transpose copy 4096x4096 (strided)", t, 2.0 * nbytes, ceiling);
  return 0;
}
