// Host <-> device transfers: every dtype, pinned and pageable, blocking and not, strided sources.
#include <catch2/catch.hpp>

#include <kiln/kiln.h>

using kiln::DType;

TEST_CASE("round trip host -> device -> host keeps every dtype's bits", "[cuda]") {
  kiln::manual_seed(3);
  auto src = kiln::randn({1023}) * 100.0;
  for (DType dt : {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64, DType::I32, DType::U8, DType::Bool}) {
    auto host = src.to(dt);
    auto dev = host.to(kiln::Device::cuda(0));
    REQUIRE(dev.device() == kiln::Device::cuda(0));
    REQUIRE(dev.dtype() == dt);
    REQUIRE(kiln::equal(dev.cpu(), host));
  }
}

TEST_CASE("pinned non-blocking copies equal blocking ones", "[cuda]") {
  auto host = kiln::randn({4097}).pin_memory();
  REQUIRE(host.is_pinned());
  auto dev = host.to(kiln::Device::cuda(0), /*non_blocking=*/true);
  kiln::cuda::synchronize();
  REQUIRE(kiln::equal(dev.cpu(), host));
}

TEST_CASE("strided and converting transfers", "[cuda]") {
  auto host = kiln::arange(12, DType::F64).reshape({3, 4}).t();  // non-contiguous
  auto dev = host.to(kiln::Device::cuda(0), DType::F32);
  REQUIRE(kiln::equal(dev.cpu(), host.to(DType::F32)));
}

TEST_CASE("a host tensor copied into a strided device tensor lands element by element", "[cuda]") {
  auto host = kiln::arange(12, DType::F64).reshape({3, 4});
  auto dev_t = kiln::zeros({4, 3}, kiln::TensorOptions().dtype(DType::F32).device(kiln::Device::cuda(0))).t();
  REQUIRE_FALSE(dev_t.is_contiguous());
  {
    kiln::NoGradGuard ng;
    dev_t.copy_(host);  // converts on the host, uploads densely, scatters on the device
  }
  REQUIRE(kiln::equal(dev_t.cpu(), host.to(DType::F32)));
}

TEST_CASE("mixing devices in one op is an error naming both", "[cuda]") {
  auto x = kiln::ones({3}, kiln::Device::cuda(0));
  REQUIRE_THROWS_WITH(kiln::ones({3}) + x, Catch::Contains("cpu") && Catch::Contains("cuda:0"));
}
