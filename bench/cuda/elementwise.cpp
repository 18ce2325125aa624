// GPU pointwise kernels (kiln/kernels/cuda/pointwise.cu, launch.cuh) on 64M elements, through
// the Tensor ops a user calls: add, mul, exp, GELU, casts f32 <-> bf16/f16; contiguous, with a
// broadcast operand, and with a strided (transposed) operand.
// GB/s counts the minimal traffic (every input read once, the output written once); the ceiling
// is the device-to-device copy bandwidth (cudaMemcpyAsync, read + write bytes) measured in the
// same run, and the target for contiguous ops is >= 85% of it.
// Each result is validated against the CPU backend on the same inputs before it is timed.
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "cuda_bench_util.h"

namespace {

using kiln::DType;
using kiln::Tensor;
namespace gpu = kiln::bench::gpu;
using gpu::kGpu;

constexpr int64_t kRows = 8192, kCols = 8192;  // 64M elements
constexpr double kTarget = 85.0;

// Largest |gpu - cpu| - rtol |cpu| over the elements (<= atol passes).
double excess_error(const Tensor& gpu_out, const Tensor& cpu_out, double rtol) {
  kiln::NoGradGuard ng;
  Tensor c = cpu_out.to(DType::F64), g = gpu_out.cpu().to(DType::F64);
  return ((g - c).abs() - c.abs() * rtol).max().item<double>();
}

struct Case {
  std::string name;
  std::vector<Tensor> cpu_inputs;
  std::function<Tensor(const std::vector<Tensor>&)> fn;
  double bytes;  // minimal traffic per call
  double rtol, atol;
  bool contiguous;  // counts towards the 85% target
};

void run(const Case& c, double ceiling) {
  std::vector<Tensor> in;
  for (const Tensor& t : c.cpu_inputs) in.push_back(t.to(kGpu));
  const double err = excess_error(c.fn(in), c.fn(c.cpu_inputs), c.rtol);
  kiln::bench::validate(err <= c.atol, c.name.c_str(), err);
  const double ms = gpu::time_ms([&] { c.fn(in); });
  const double bw = gpu::gbs(c.bytes, ms);
  const double pct = 100.0 * bw / ceiling;
  std::printf("%-40s %8.3f ms %8.1f GB/s %6.1f%% of copy%s\n", c.name.c_str(), ms, bw, pct,
              c.contiguous && pct < kTarget ? "  (below the 85% target)" : "");
  // recorded as the printed name and the sizes, e.g. "add f32 [8192, 8192]"
  gpu::record("elementwise", c.name + " [" + std::to_string(kRows) + ", " + std::to_string(kCols) + "]", "kiln", ms,
              gpu::bytes(c.bytes));
}

}  // namespace

int main() {
  gpu::start("bench_cuda_elementwise");
  const int64_t n = kRows * kCols;
  const double f4 = 4.0 * n, f2 = 2.0 * n;
  const double ceiling = gpu::copy_bandwidth_gbs(static_cast<size_t>(f4));
  std::printf("device copy bandwidth (256 MiB, read + write): %.1f GB/s\n", ceiling);
  std::printf("64M elements ([%ld, %ld]); GB/s = bytes read + written\n", static_cast<long>(kRows),
              static_cast<long>(kCols));

  Tensor a = kiln::randn({kRows, kCols}), b = kiln::randn({kRows, kCols});
  Tensor row = kiln::randn({kCols});
  Tensor a16 = a.to(DType::F16), abf = a.to(DType::BF16);
  const std::vector<Case> cases = {
      {"add f32", {a, b}, [](const auto& x) { return x[0] + x[1]; }, 3 * f4, 1e-6, 1e-6, true},
      {"mul f32", {a, b}, [](const auto& x) { return x[0] * x[1]; }, 3 * f4, 1e-6, 1e-6, true},
      {"mul f32 by a scalar", {a}, [](const auto& x) { return x[0] * 1.5; }, 2 * f4, 1e-6, 1e-6, true},
      {"exp f32", {a}, [](const auto& x) { return x[0].exp(); }, 2 * f4, 1e-5, 1e-6, true},
      {"gelu f32", {a}, [](const auto& x) { return x[0].gelu(); }, 2 * f4, 1e-5, 1e-6, true},
      {"gelu bf16", {abf}, [](const auto& x) { return x[0].gelu(); }, 2 * f2, 1e-2, 1e-2, true},
      {"add bf16", {abf, b.to(DType::BF16)}, [](const auto& x) { return x[0] + x[1]; }, 3 * f2, 1e-2, 1e-2, true},
      {"cast f32 -> bf16", {a}, [](const auto& x) { return x[0].to(DType::BF16); }, f4 + f2, 0, 0, true},
      {"cast bf16 -> f32", {abf}, [](const auto& x) { return x[0].to(DType::F32); }, f2 + f4, 0, 0, true},
      {"cast f32 -> f16", {a}, [](const auto& x) { return x[0].to(DType::F16); }, f4 + f2, 0, 0, true},
      {"cast f16 -> f32", {a16}, [](const auto& x) { return x[0].to(DType::F32); }, f2 + f4, 0, 0, true},
      // a [C] row broadcast over [R, C]: the row stays in cache, so it is not counted
      {"add f32, broadcast row", {a, row}, [](const auto& x) { return x[0] + x[1]; }, 2 * f4, 1e-6, 1e-6, false},
      // one operand read through a transpose (strides [1, R]): uncoalesced on one side
      {"add f32, transposed operand", {a, b}, [](const auto& x) { return x[0] + x[1].t(); }, 3 * f4, 1e-6, 1e-6, false},
      {"copy f32 of a transpose (contiguous())",
       {a},
       [](const auto& x) { return x[0].t().contiguous(); },
       2 * f4,
       0,
       0,
       false},
      {"mul f32, every other column",
       {a},
       [](const auto& x) { return x[0].slice(1, 0, kCols, 2) * 2.0; },
       f4,
       1e-6,
       1e-6,
       false},
  };
  for (const Case& c : cases) run(c, ceiling);
  return 0;
}
