// kiln::cudnn settings (kiln/cuda/cudnn.h) in every build: the benchmark / deterministic flags,
// the version and availability queries, and the autotuner cache's store / lookup / clear. Also
// that f16 convolution and pooling on the CPU still compute through the f32 kernels (CUDA
// tensors take f16/bf16 natively; the CPU path must be unchanged).
#include <catch2/catch.hpp>

#include <kiln/kiln.h>
#include <kiln/nn/functional.h>

namespace {
// Restores both flags at scope exit so test order does not matter.
struct FlagsGuard {
  bool b = kiln::cudnn::benchmark(), d = kiln::cudnn::deterministic();
  ~FlagsGuard() {
    kiln::cudnn::set_benchmark(b);
    kiln::cudnn::set_deterministic(d);
  }
};
}  // namespace

TEST_CASE("cudnn flags: defaults off, set and read back", "[cudnn]") {
  FlagsGuard guard;
  REQUIRE_FALSE(kiln::cudnn::benchmark());
  REQUIRE_FALSE(kiln::cudnn::deterministic());
  kiln::cudnn::set_benchmark(true);
  REQUIRE(kiln::cudnn::benchmark());
  REQUIRE_FALSE(kiln::cudnn::deterministic());
  kiln::cudnn::set_deterministic(true);
  REQUIRE(kiln::cudnn::deterministic());
  kiln::cudnn::set_benchmark(false);
  REQUIRE_FALSE(kiln::cudnn::benchmark());
  REQUIRE(kiln::cudnn::deterministic());
  kiln::cudnn::set_deterministic(false);
  REQUIRE_FALSE(kiln::cudnn::deterministic());
}

TEST_CASE("cudnn version and availability follow the build", "[cudnn]") {
  REQUIRE(kiln::cudnn::built_with_cudnn() == (KILN_WITH_CUDNN != 0));
  if (KILN_WITH_CUDNN) {
    REQUIRE(KILN_WITH_CUDA);
    // major * 10000 + minor * 100 + patch, cuDNN 8 or later (the library answers without a GPU)
    REQUIRE(kiln::cudnn::version() >= 80000);
    REQUIRE(kiln::cudnn::version() < 1000000);
  } else {
    REQUIRE(kiln::cudnn::version() == 0);
  }
  REQUIRE(kiln::cudnn::is_available() == (kiln::cudnn::built_with_cudnn() && kiln::cuda::is_available()));
}

TEST_CASE("cudnn autotune cache: store, lookup, clear", "[cudnn]") {
  namespace D = kiln::cudnn::detail;
  kiln::cudnn::clear_autotune_cache();
  REQUIRE(kiln::cudnn::autotune_cache_size() == 0);
  D::AlgoChoice c;
  REQUIRE_FALSE(D::autotune_lookup("key-a", &c));
  D::autotune_store("key-a", {3, 1, 4096});
  D::autotune_store(std::string("key\0b", 5), {7, 2, 0});  // keys are byte strings
  REQUIRE(kiln::cudnn::autotune_cache_size() == 2);
  REQUIRE(D::autotune_lookup("key-a", &c));
  REQUIRE(c.algo == 3);
  REQUIRE(c.math_type == 1);
  REQUIRE(c.workspace == 4096);
  REQUIRE(D::autotune_lookup(std::string("key\0b", 5), &c));
  REQUIRE(c.algo == 7);
  REQUIRE_FALSE(D::autotune_lookup("key", &c));
  D::autotune_store("key-a", {5, 0, 0});  // a new search replaces the old choice
  REQUIRE(D::autotune_lookup("key-a", &c));
  REQUIRE(c.algo == 5);
  kiln::cudnn::clear_autotune_cache();
  REQUIRE(kiln::cudnn::autotune_cache_size() == 0);
  REQUIRE_FALSE(D::autotune_lookup("key-a", &c));
}

TEST_CASE("f16/bf16 conv2d and pooling on the CPU compute in f32", "[cudnn][conv]") {
  namespace F = kiln::nn::functional;
  kiln::manual_seed(5);
  for (kiln::DType dt : {kiln::DType::F16, kiln::DType::BF16}) {
    kiln::Tensor x = kiln::randn({2, 4, 9, 9}).to(dt), w = kiln::randn({6, 2, 3, 3}).to(dt);
    kiln::Tensor b = kiln::randn({6}).to(dt);
    F::Conv2dParams p;
    p.padding = {1, 1};
    p.groups = 2;
    kiln::Tensor y = F::conv2d(x, w, b, p);
    REQUIRE(y.dtype() == dt);
    // the f32 convolution of the same (rounded) values, rounded once: identical
    kiln::Tensor ref = F::conv2d(x.to(kiln::DType::F32), w.to(kiln::DType::F32), b.to(kiln::DType::F32), p).to(dt);
    REQUIRE(kiln::equal(y, ref));
    kiln::Tensor m = F::max_pool2d(x, {3, 3}, {2, 2}, {1, 1});
    REQUIRE(m.dtype() == dt);
    REQUIRE(kiln::equal(m, F::max_pool2d(x.to(kiln::DType::F32), {3, 3}, {2, 2}, {1, 1}).to(dt)));
    kiln::Tensor a = F::adaptive_avg_pool2d(x, {4, 3});
    REQUIRE(kiln::equal(a, F::adaptive_avg_pool2d(x.to(kiln::DType::F32), {4, 3}).to(dt)));
  }
}
