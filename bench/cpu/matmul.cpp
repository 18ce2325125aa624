// CPU f32 matmul at every CPU level this machine has (kiln/core/cpu_isa.h): kiln::matmul's
// GFLOP/s for square products, the share of the level's FMA peak measured in the same run (a
// loop of independent register FMAs on every thread), and the ratio to the baseline level (Eigen's
// GEMM, compiled for plain x86-64). Each product is checked against a double-precision reference
// on sampled entries. Target (docs/kernels.md, "The CPU GEMM"): >= 75% of the peak at 512-2048.
//   bench_matmul [N...]      sizes (default 256 512 1024 2048)
// KILN_CPU_ISA=level restricts the run to one level. bench/cpu/compare_matmul.sh runs PyTorch on
// the same sizes and threads beside it.
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <kiln/kiln.h>

#include "../bench_util.h"
#include "../lab/lab.h"

namespace {

// GFLOP/s of the level's peak on every thread at once: the kernel lab's chains of independent
// multiply-adds (bench/lab/lab.h, fma_peak_gflops) on the level's instruction set.
double peak_gflops(kiln::CpuIsa isa) {
  const lab::Isa lab_isa = isa == kiln::CpuIsa::avx512 ? lab::Isa::avx512
                           : isa == kiln::CpuIsa::avx2 ? lab::Isa::avx2
                                                       : lab::Isa::sse;
  return lab::fma_peak_gflops(lab_isa, omp_get_max_threads(), 20'000'000);
}

// The worst error of 64 sampled entries of c = a @ b against double sums, relative to
// sum |a_ik b_kj| (the scale of a dot product's rounding error).
double sampled_error(const kiln::Tensor& a, const kiln::Tensor& b, const kiln::Tensor& c) {
  const int64_t n = a.size(0), k = a.size(1), m = b.size(1);
  const float *pa = a.data_ptr<float>(), *pb = b.data_ptr<float>(), *pc = c.data_ptr<float>();
  double worst = 0;
  for (int s = 0; s < 64; ++s) {
    const int64_t i = (s * 7919) % n, j = (s * 104729) % m;
    double sum = 0, scale = 0;
    for (int64_t t = 0; t < k; ++t) {
      sum += double(pa[i * k + t]) * pb[t * m + j];
      scale += std::abs(double(pa[i * k + t]) * pb[t * m + j]);
    }
    worst = std::max(worst, std::abs(pc[i * m + j] - sum) / scale);
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  kiln::NoGradGuard ng;
  kiln::manual_seed(0);
  std::vector<int64_t> sizes;
  for (int i = 1; i < argc; ++i) sizes.push_back(std::atoll(argv[i]));
  if (sizes.empty()) sizes = {256, 512, 1024, 2048};
  const char* only = std::getenv("KILN_CPU_ISA");
  std::printf("CPU levels: %s; %d threads\n", kiln::cpu_isa_summary().c_str(), omp_get_max_threads());
  std::printf("%-9s %-6s %9s %9s %8s %8s %10s\n", "level", "n", "ms", "GFLOP/s", "of peak", "vs base", "peak GF/s");
  std::vector<double> base_ms(sizes.size(), 0);
  for (int l = 0; l < kiln::kNumCpuIsas; ++l) {
    const auto isa = static_cast<kiln::CpuIsa>(l);
    if (!kiln::cpu_supports(isa) || !kiln::cpu_isa_built(isa)) continue;
    if (only && *only && std::string(only) != "auto" && kiln::parse_cpu_isa(only) != isa) continue;
    kiln::set_cpu_isa(isa);
    const double peak = peak_gflops(isa);
    for (size_t s = 0; s < sizes.size(); ++s) {
      const int64_t n = sizes[s];
      const kiln::Tensor a = kiln::randn({n, n}), b = kiln::randn({n, n});
      kiln::Tensor c;
      const double t = kiln::bench::time_median([&] { c = kiln::matmul(a, b); }, n >= 2048 ? 5 : 9);
      // f32 dot products of n terms: relative error ~ sqrt(n) * 2^-24 typically, n * 2^-24 at worst
      const double err = sampled_error(a, b, c);
      kiln::bench::validate(err < n * 6e-8, "matmul vs double sums", err);
      const double gf = 2.0 * n * n * n / t / 1e9;
      if (isa == kiln::CpuIsa::baseline) base_ms[s] = t * 1e3;
      char vs[16] = "-";
      if (base_ms[s] > 0) std::snprintf(vs, sizeof vs, "%.2fx", base_ms[s] / (t * 1e3));
      std::printf("%-9s %-6lld %9.3f %9.1f %7.0f%% %8s %10.1f\n", kiln::cpu_isa_name(isa), (long long)n, t * 1e3, gf,
                  100 * gf / peak, vs, peak);
    }
  }
  kiln::reset_cpu_isa();
  std::printf("peak: independent FMAs (baseline: multiply + add) on every thread; vs base: baseline ms / this ms\n");
  return 0;
}
