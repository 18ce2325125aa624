// kiln::set_num_threads / get_num_threads: the OpenMP pool of the CPU kernels.
#include <catch2/catch.hpp>

#include <omp.h>

#include <kiln/kiln.h>
#include "tests/test_util.h"

using namespace kiln_test;

TEST_CASE("set_num_threads sets the CPU kernels' pool", "[threads]") {
  const int before = kiln::get_num_threads();
  REQUIRE(before >= 1);
  kiln::set_num_threads(1);
  REQUIRE(kiln::get_num_threads() == 1);
  int seen = 0;
#pragma omp parallel
  {
#pragma omp single
    seen = omp_get_num_threads();
  }
  REQUIRE(seen == 1);
  // kernels still give the same results with one thread
  auto a = kiln::arange(1000, DType::F64).reshape({10, 100});
  double s1 = a.sum().item<double>();
  kiln::set_num_threads(3);
  REQUIRE(kiln::get_num_threads() == 3);
  REQUIRE(a.sum().item<double>() == s1);
  REQUIRE_THROWS_AS(kiln::set_num_threads(0), kiln::Error);
  REQUIRE_THROWS_WITH(kiln::set_num_threads(-2), Catch::Contains("at least 1, got -2"));
  REQUIRE(kiln::get_num_threads() == 3);
  kiln::set_num_threads(before);
}
