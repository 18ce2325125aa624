#pragma once
// What the GPU test files share: the device they run on, per-dtype tolerances, and the checks every
// GPU-against-CPU comparison starts with. Header-only, every function inline.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include <kiln/kiln.h>

namespace kiln_cuda_test {

inline const kiln::Device kGpu = kiln::Device::cuda(0);

// A value per floating dtype, in the order f64, f32, f16, bf16 (any other dtype takes the f32 one):
// the tolerance tables of the GPU tests.
inline double per_dtype(kiln::DType dt, double f64, double f32, double f16, double bf16) {
  switch (dt) {
    case kiln::DType::F64: return f64;
    case kiln::DType::F16: return f16;
    case kiln::DType::BF16: return bf16;
    default: return f32;
  }
}

// The tolerance of an elementwise result both backends compute with the same functors: a 16-bit
// result is rounded once on each side, and the CPU's fast exp/erf differ from CUDA's by a few ulps.
inline double elementwise_tol(kiln::DType dt) { return per_dtype(dt, 1e-12, 1e-5, 2e-3, 2e-2); }

// "what sizes [..] dtype ..": the INFO line of a comparison with cpu.
inline std::string describe(const std::string& what, const kiln::Tensor& cpu) {
  return what + " sizes " + kiln::detail::concat(cpu.sizes()) + " dtype " + kiln::dtype_name(cpu.dtype());
}

// REQUIREs that gpu is a defined tensor on the GPU with the sizes and dtype of cpu: the start of a
// comparison of the two.
inline void require_gpu_twin(const kiln::Tensor& gpu, const kiln::Tensor& cpu) {
  REQUIRE(gpu.defined());
  REQUIRE(gpu.device() == kGpu);
  REQUIRE(gpu.sizes() == cpu.sizes());
  REQUIRE(gpu.dtype() == cpu.dtype());
}

// require_gpu_twin, then REQUIREs max |gpu - cpu| <= tol * max(1, max |cpu|), in f64 (NaN fails): a
// tolerance relative to the tensor's scale.
inline void require_near(const kiln::Tensor& gpu, const kiln::Tensor& cpu, double tol, const std::string& what) {
  INFO(what);
  REQUIRE(cpu.defined());
  require_gpu_twin(gpu, cpu);
  kiln::Tensor a = gpu.cpu().to(kiln::DType::F64), b = cpu.to(kiln::DType::F64);
  const double scale = b.numel() ? std::max(1.0, kiln::abs(b).max().item<double>()) : 1.0;
  const double err = b.numel() ? kiln::abs(a - b).max().item<double>() : 0.0;
  INFO("max error " << err << ", scale " << scale << ", tol " << tol);
  REQUIRE(err <= tol * scale);
}

// require_gpu_twin, then REQUIREs kiln::allclose of gpu's values (copied to the host) and cpu's.
inline void require_allclose(const kiln::Tensor& gpu, const kiln::Tensor& cpu, double rtol, double atol,
                             const std::string& what) {
  INFO(describe(what, cpu));
  require_gpu_twin(gpu, cpu);
  REQUIRE(kiln::allclose(gpu.cpu(), cpu, rtol, atol));
}

// Calls check(name, p, q) for every parameter p of model (named name) and the parameter q of ref
// in the same place, after REQUIRing that the two have as many.
template <class Check>
void for_each_parameter_pair(const kiln::nn::Module& model, const kiln::nn::Module& ref, Check&& check) {
  const auto mine = model.named_parameters(), theirs = ref.named_parameters();
  REQUIRE(mine.size() == theirs.size());
  for (size_t i = 0; i < mine.size(); ++i) check(mine[i].first, mine[i].second, theirs[i].second);
}

}  // namespace kiln_cuda_test
