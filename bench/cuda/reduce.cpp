// GPU reductions (kiln/kernels/cuda/reduce.cu) on 64M f32 elements: the sum over everything,
// over rows (the last dim: [kept, reduced] rows, one or more blocks per row) and over columns
// (the leading dim: the coalesced column kernel, the bias-gradient case), for square, tall and
// wide shapes, plus amax over rows and a bf16 sum.
// A reduction reads its input once and writes little, so GB/s counts the bytes read; the ceiling
// is the device copy bandwidth (bytes read + written per second, cudaMemcpyAsync) measured in the
// same run, the DRAM's total bandwidth, which a pure read stream can reach too.
// Every result is validated against the CPU backend (which sums in double) before timing.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>

#include "cuda_bench_util.h"

namespace {

using namespace kiln::bench;  // gpu::, validate
using gpu::kGpu;
using kiln::DType;
using kiln::IntList;
using kiln::Tensor;

std::string shape_str(const IntList& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

void run(const std::string& name, const Tensor& x_cpu, const std::function<Tensor(const Tensor&)>& f, double rtol,
         double ceiling) {
  const std::string what = name + " " + shape_str(x_cpu.sizes()) + " " + kiln::dtype_name(x_cpu.dtype());
  Tensor x = x_cpu.to(kGpu);
  {
    kiln::NoGradGuard ng;
    Tensor c = f(x_cpu).to(DType::F64), g = f(x).cpu().to(DType::F64);
    // sums of n terms: relative to the sum of |x| they add up, not to the (cancelling) result
    Tensor scale = f(x_cpu.abs()).to(DType::F64).abs() + 1e-30;
    const double err = ((g - c).abs() / scale).max().item<double>();
    kiln::bench::validate(err <= rtol, what.c_str(), err);
  }
  const double ms = gpu::time_ms([&] { f(x); });
  const double bw = gpu::gbs(static_cast<double>(x.nbytes()), ms);
  std::printf("%-44s %8.3f ms %8.1f GB/s read %6.1f%% of copy\n", what.c_str(), ms, bw, 100.0 * bw / ceiling);
  // recorded under the printed name, e.g. "sum all [8192, 8192] float32"
  gpu::record("reduce", what, "kiln", ms, gpu::bytes(static_cast<double>(x.nbytes())));
}

}  // namespace

int main() {
  gpu::start("bench_cuda_reduce");
  const double ceiling = gpu::copy_bandwidth_gbs(size_t{256} << 20);
  std::printf("device copy bandwidth (256 MiB, read + write): %.1f GB/s\n", ceiling);
  for (IntList s : {IntList{8192, 8192}, IntList{65536, 1024}, IntList{1024, 65536}, IntList{4194304, 16}}) {
    Tensor x = kiln::randn(s);
    run(
        "sum all", x, [](const Tensor& t) { return t.sum(); }, 1e-5, ceiling);
    run(
        "sum over rows (dim -1)", x, [](const Tensor& t) { return t.sum({-1}); }, 1e-5, ceiling);
    run(
        "sum over columns (dim 0)", x, [](const Tensor& t) { return t.sum({0}); }, 1e-5, ceiling);
  }
  Tensor x = kiln::randn({8192, 8192});
  run(
      "amax over rows", x, [](const Tensor& t) { return t.amax({-1}); }, 0, ceiling);
  run(
      "mean over rows", x, [](const Tensor& t) { return t.mean({-1}); }, 1e-5, ceiling);
  run(
      "sum all", x.to(DType::BF16), [](const Tensor& t) { return t.sum(); }, 1e-2, ceiling);
  run(
      "sum over columns (dim 0)", x.to(DType::BF16), [](const Tensor& t) { return t.sum({0}); }, 1e-2, ceiling);
  return 0;
}
