// CPU matmul: kiln::matmul (Eigen GEMM behind the tensor API, autograd off) against a plain
// Eigen GEMM on the same data in the same run. Target: >= 90% of plain Eigen at
// 512-2048. Also times a transposed operand (kiln maps it without a copy).
#include <Eigen/Core>
#include <cstdio>
#include <cstring>

#include <kiln/kiln.h>

#include "../bench_util.h"

int main() {
  kiln::NoGradGuard ng;
  kiln::manual_seed(0);
  std::printf("%-22s %10s %10s %10s %8s\n", "case (f32)", "kiln ms", "eigen ms", "GFLOP/s", "ratio");
  for (int64_t n : {128, 512, 1024, 2048}) {
    auto a = kiln::randn({n, n}), b = kiln::randn({n, n});
    using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    Eigen::Map<Mat> ea(a.data_ptr<float>(), n, n), eb(b.data_ptr<float>(), n, n);
    Mat ec(n, n);
    kiln::Tensor c;
    const int reps = n >= 2048 ? 3 : 7;
    double tk = kiln::bench::time_median([&] { c = kiln::matmul(a, b); }, reps);
    double te = kiln::bench::time_median([&] { ec.noalias() = ea * eb; }, reps);
    Eigen::Map<Mat> kc(c.data_ptr<float>(), n, n);
    double err = (kc - ec).cwiseAbs().maxCoeff();
    kiln::bench::validate(err < 1e-3 * n, "matmul vs Eigen", err);
    double gflops = 2.0 * n * n * n / tk / 1e9;
    char name[64];
    std::snprintf(name, sizeof name, "%lldx%lld @ %lldx%lld", (long long)n, (long long)n, (long long)n, (long long)n);
    std::printf("%-22s %10.3f %10.3f %10.1f %7.0f%%\n", name, tk * 1e3, te * 1e3, gflops, 100 * te / tk);
    if (n == 1024) {
      auto at = a.t();  // transposed view: mapped column-major, no copy
      double tt = kiln::bench::time_median([&] { c = kiln::matmul(at, b); }, reps);
      Mat ref = ea.transpose() * eb;
      Eigen::Map<Mat> kt(c.data_ptr<float>(), n, n);
      double e2 = (kt - ref).cwiseAbs().maxCoeff();
      kiln::bench::validate(e2 < 1e-3 * n, "matmul(a.t(), b)", e2);
      std::printf("%-22s %10.3f %10s %10.1f %7.0f%%\n", "a.t() @ b (1024)", tt * 1e3, "-",
                  2.0 * n * n * n / tt / 1e9, 100 * te / tt);
    }
  }
  std::printf("ratio = plain Eigen time / kiln time (100%% = no overhead)\n");
  return 0;
}
