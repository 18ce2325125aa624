// Host arithmetic of the CUDA backend that the GPU tests cannot isolate: grid sizes capped at the
// y/z limit, operand alignments told to cuBLASLt, the text of a failed launch, and the device
// error check being harmless without a device. Plain C++, so it runs in CI.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>

#include <kiln/cuda/device_error.h>
#include <kiln/cuda/launch_error.h>
#include <kiln/kernels/cuda/launch_limits.h>
#include <kiln/kernels/cuda/matmul_alignment.h>
#include <kiln/kiln.h>

namespace kc = kiln::kernels::cuda;

TEST_CASE("grid_yz caps a row count at gridDim.y's limit", "[core][cuda]") {
  REQUIRE(kc::grid_yz(0) == 1u);
  REQUIRE(kc::grid_yz(1) == 1u);
  REQUIRE(kc::grid_yz(65534) == 65534u);
  REQUIRE(kc::grid_yz(65535) == 65535u);
  REQUIRE(kc::grid_yz(65536) == 65535u);
  REQUIRE(kc::grid_yz(70000) == 65535u);
  REQUIRE(kc::grid_yz(int64_t{1} << 40) == 65535u);
}

TEST_CASE("operand_alignment: the largest power of two <= 256 dividing every matrix's address", "[core][cuda]") {
  REQUIRE(kc::operand_alignment(0) == 256u);
  REQUIRE(kc::operand_alignment(0x7f0000000000) == 256u);
  REQUIRE(kc::operand_alignment(0x7f0000001000) == 256u);
  REQUIRE(kc::operand_alignment(0x7f0000000080) == 128u);
  // a[1:] of f32, f16 and f64 tensors on a 256-byte aligned allocation
  REQUIRE(kc::operand_alignment(0x7f0000000000 + 4) == 4u);
  REQUIRE(kc::operand_alignment(0x7f0000000000 + 2) == 2u);
  REQUIRE(kc::operand_alignment(0x7f0000000000 + 8) == 8u);
  REQUIRE(kc::operand_alignment(0x7f0000000000 + 48) == 16u);
  REQUIRE(kc::operand_alignment(0x7f0000000001) == 1u);
  // strided batches: every matrix of the batch counts, not only the first
  REQUIRE(kc::operand_alignment(0x7f0000000000, 5 * 9 * 4) == 4u);      // [3, 5, 9] f32
  REQUIRE(kc::operand_alignment(0x7f0000000000, 64 * 64 * 2) == 256u);  // [b, 64, 64] f16
  REQUIRE(kc::operand_alignment(0x7f0000000040, 64 * 64 * 2) == 64u);
  REQUIRE(kc::operand_alignment(0x7f0000000000, 24) == 8u);
  REQUIRE(kc::kEpilogueAlignment == 16u);
}

TEST_CASE("a failed kernel launch names the kernel", "[core][cuda]") {
  const std::string msg = kiln::cuda::internal::launch_error_message(
      "row_reduce_kernel (partials)", "cudaErrorInvalidConfiguration", "invalid configuration argument");
  REQUIRE(msg.find("row_reduce_kernel (partials)") != std::string::npos);
  REQUIRE(msg.find("cudaErrorInvalidConfiguration") != std::string::npos);
  REQUIRE(msg.find("invalid configuration argument") != std::string::npos);
}

TEST_CASE("device error records: site ids are stable, checks need no device", "[core][cuda]") {
  const int32_t a = kiln::cuda::internal::error_site("embedding");
  const int32_t b = kiln::cuda::internal::error_site("gather");
  REQUIRE(a != b);
  REQUIRE(kiln::cuda::internal::error_site("embedding") == a);
  REQUIRE(kiln::cuda::internal::error_site(std::string("gath").append("er").c_str()) == b);
  if (!kiln::cuda::is_available()) {
    // Nothing ran on a device, so there is nothing to report (and no device is touched).
    REQUIRE_NOTHROW(kiln::cuda::check_device_errors());
    REQUIRE_NOTHROW(kiln::cuda::internal::check_device_errors_on(kiln::Stream{kiln::Device::cuda(0), nullptr}));
  }
}
