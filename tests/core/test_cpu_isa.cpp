// The CPU level in use (kiln/core/cpu_isa.h): names, what the processor and the build have,
// KILN_CPU_ISA and set_cpu_isa, one registration per level for every CPU kernel, and the same
// results (up to rounding) from every level's copy of the kernels.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include "kiln/kernels/pointwise.h"
#include "tests/test_util.h"

using kiln::CpuIsa;
using kiln_test::check_same_tensor;
using kiln_test::for_each_cpu_isa;

namespace {

// Sets an environment variable for one scope, then restores it.
struct ScopedEnv {
  std::string name, old;
  bool had;
  ScopedEnv(const char* n, const char* value) : name(n) {
    const char* o = std::getenv(n);
    had = o != nullptr;
    if (had) old = o;
    setenv(n, value, 1);
  }
  ~ScopedEnv() {
    if (had) setenv(name.c_str(), old.c_str(), 1);
    else unsetenv(name.c_str());
    kiln::reset_cpu_isa();
  }
};

bool available(CpuIsa isa) { return kiln::cpu_supports(isa) && kiln::cpu_isa_built(isa); }

}  // namespace

TEST_CASE("cpu isa: names, the best level, the baseline always there", "[cpu_isa]") {
  for (int i = 0; i < kiln::kNumCpuIsas; ++i) {
    const auto isa = static_cast<CpuIsa>(i);
    CHECK(kiln::parse_cpu_isa(kiln::cpu_isa_name(isa)) == isa);
  }
  CHECK_THROWS_WITH(kiln::parse_cpu_isa("sse4"), Catch::Contains("unknown CPU level 'sse4'"));
  CHECK(kiln::cpu_supports(CpuIsa::baseline));
  CHECK(kiln::cpu_isa_built(CpuIsa::baseline));
  // a processor with AVX-512 (x86-64-v4) has AVX2 (x86-64-v3)
  if (kiln::cpu_supports(CpuIsa::avx512)) CHECK(kiln::cpu_supports(CpuIsa::avx2));
  const CpuIsa best = kiln::best_cpu_isa();
  CHECK(available(best));
  for (int i = static_cast<int>(best) + 1; i < kiln::kNumCpuIsas; ++i) CHECK_FALSE(available(static_cast<CpuIsa>(i)));
  CHECK_THAT(kiln::cpu_isa_summary(), Catch::Contains("built: baseline"));
}

TEST_CASE("cpu isa: KILN_CPU_ISA and set_cpu_isa choose the level, unavailable ones raise", "[cpu_isa]") {
  {
    ScopedEnv env("KILN_CPU_ISA", "auto");
    kiln::reset_cpu_isa();
    CHECK(kiln::cpu_isa() == kiln::best_cpu_isa());
  }
  for (int i = 0; i < kiln::kNumCpuIsas; ++i) {
    const auto isa = static_cast<CpuIsa>(i);
    ScopedEnv env("KILN_CPU_ISA", kiln::cpu_isa_name(isa));
    if (available(isa)) {
      kiln::reset_cpu_isa();
      CHECK(kiln::cpu_isa() == isa);
      kiln::set_cpu_isa(CpuIsa::baseline);
      CHECK(kiln::cpu_isa() == CpuIsa::baseline);
      kiln::set_cpu_isa(isa);
      CHECK(kiln::cpu_isa() == isa);
    } else {
      CHECK_THROWS_AS(kiln::reset_cpu_isa(), kiln::Error);
      CHECK_THROWS_WITH(kiln::set_cpu_isa(isa), Catch::Contains("cannot run the CPU kernels at level"));
    }
  }
  {
    ScopedEnv env("KILN_CPU_ISA", "avx1024");
    CHECK_THROWS_WITH(kiln::reset_cpu_isa(), Catch::Contains("unknown CPU level 'avx1024'"));
  }
}

TEST_CASE("cpu isa: each level built has its own copy of every CPU kernel", "[cpu_isa]") {
  // kernels::unary is registered by kiln/kernels/cpu/pointwise.cpp, which every level compiles
  for (int i = 0; i < kiln::kNumCpuIsas; ++i) {
    const auto isa = static_cast<CpuIsa>(i);
    INFO(kiln::cpu_isa_name(isa));
    CHECK((kiln::kernels::unary.cpu_at(i) != nullptr) == kiln::cpu_isa_built(isa));
    for (int j = 0; j < i; ++j)
      if (kiln::cpu_isa_built(isa)) CHECK(kiln::kernels::unary.cpu_at(i) != kiln::kernels::unary.cpu_at(j));
  }
}

TEST_CASE("cpu isa: every level computes the same ops up to rounding", "[cpu_isa]") {
  kiln::manual_seed(3);
  const kiln::Tensor a = kiln::randn({37, 300}), b = kiln::randn({300, 45});
  // 16+ channels, 3x3, stride 1: the Winograd path (kiln/core/cpu_conv.h)
  const kiln::Tensor x = kiln::randn({2, 16, 13, 11}), w = kiln::randn({20, 16, 3, 3});
  const kiln::nn::functional::Conv2dParams pad1{{1, 1}, {1, 1}};
  const kiln::Tensor want_mm = kiln::matmul(a.to(kiln::DType::F64), b.to(kiln::DType::F64));
  const kiln::Tensor want_conv = kiln::nn::functional::conv2d(x.to(kiln::DType::F64), w.to(kiln::DType::F64), {}, pad1);
  for_each_cpu_isa([&] {
    // f32 sums of K products: error ~ sqrt(K) * 2^-24 * sum |a_ik b_kj|, a few units of 1e-6
    // relative here; Winograd's F(4x4, 3x3) up to 35x a direct sum's (docs/kernels.md)
    check_same_tensor(kiln::matmul(a, b).to(kiln::DType::F64), want_mm, 1e-4, "matmul");
    check_same_tensor(kiln::nn::functional::conv2d(x, w, {}, pad1).to(kiln::DType::F64), want_conv, 1e-4, "conv2d");
    check_same_tensor(kiln::gelu(a).to(kiln::DType::F64), kiln::gelu(a.to(kiln::DType::F64)), 1e-6, "gelu");
    check_same_tensor(kiln::softmax(a, 1).to(kiln::DType::F64), kiln::softmax(a.to(kiln::DType::F64), 1), 1e-6,
                      "softmax");
  });
}
