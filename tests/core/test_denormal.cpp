// kiln::set_flush_denormal: FTZ/DAZ on the calling thread and the OpenMP pool; results that
// would be denormal become 0 while it is on and are kept again after it is turned off.
#include <catch2/catch.hpp>

#include <omp.h>

#include <cfloat>
#include <vector>

#include <kiln/kiln.h>
#include "tests/test_util.h"

namespace {

// 1e-30f * 1e-10f = 1e-40f: below FLT_MIN (~1.2e-38), a denormal unless flushed.
float tiny_product() {
  volatile float a = 1e-30f, b = 1e-10f;
  return a * b;
}

}  // namespace

TEST_CASE("set_flush_denormal: denormal results become zero on every kernel thread", "[core][denormal]") {
#if defined(__x86_64__) || defined(__SSE__)
  REQUIRE(kiln::set_flush_denormal(true));
  CHECK(kiln::flush_denormal());
  CHECK(tiny_product() == 0.0f);
  std::vector<int> flushing(omp_get_max_threads(), 0);
#pragma omp parallel
  flushing[omp_get_thread_num()] = kiln::flush_denormal() && tiny_product() == 0.0f;
  for (size_t t = 0; t < flushing.size(); ++t) {
    INFO("OpenMP thread " << t);
    CHECK(flushing[t] == 1);
  }
  // a kiln kernel large enough to run on the pool
  kiln::Tensor x = kiln::full({1 << 16}, 1e-30, kiln::DType::F32) * 1e-10;
  CHECK(x.abs().max().item<double>() == 0.0);

  REQUIRE(kiln::set_flush_denormal(false));
  CHECK_FALSE(kiln::flush_denormal());
  const float d = tiny_product();
  CHECK(d > 0.0f);
  CHECK(d < FLT_MIN);
  kiln::Tensor y = kiln::full({1 << 16}, 1e-30, kiln::DType::F32) * 1e-10;
  CHECK(y.min().item<double>() > 0.0);
#else
  CHECK_FALSE(kiln::set_flush_denormal(true));  // no such mode: nothing changes
  CHECK_FALSE(kiln::flush_denormal());
#endif
}
