// multinomial: shapes, reproducibility from the seed and an explicit Generator, zero weights never
// drawn, without-replacement draws distinct, frequencies close to the weights, and PyTorch's
// errors (negative / inf / NaN weights, all-zero rows, too many samples without replacement).
#include <catch2/catch.hpp>

#include <cmath>
#include <set>
#include <vector>

#include <kiln/kiln.h>
#include "tests/test_util.h"

using namespace kiln_test;

namespace {

std::vector<int64_t> ints(const Tensor& t) {
  Tensor c = t.contiguous();
  const int64_t* p = c.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + c.numel());
}

}  // namespace

TEST_CASE("multinomial: shapes, dtype and reproducibility", "[multinomial]") {
  Tensor w = kiln::tensor(std::vector<double>{1, 2, 3, 4});
  kiln::manual_seed(7);
  Tensor a = kiln::multinomial(w, 3);
  CHECK(a.sizes() == IntList{3});
  CHECK(a.dtype() == DType::I64);
  kiln::manual_seed(7);
  CHECK(kiln::equal(kiln::multinomial(w, 3), a));
  Tensor m = kiln::rand({5, 6}, DType::F32);
  Tensor b = kiln::multinomial(m, 4, true);
  CHECK(b.sizes() == IntList{5, 4});
  for (int64_t v : ints(b)) CHECK((v >= 0 && v < 6));
  // an explicit generator: the same seed gives the same draws, and its offset advances
  kiln::Generator g1(123), g2(123);
  Tensor c1 = kiln::multinomial(m, 6, false, &g1);
  Tensor c2 = kiln::multinomial(m, 6, false, &g2);
  CHECK(kiln::equal(c1, c2));
  CHECK(g1.offset() == 30);
  CHECK_FALSE(kiln::equal(kiln::multinomial(m, 6, false, &g1), c1));  // next draws differ (almost surely)
  // unnormalised weights and a non-contiguous input
  Tensor t = (kiln::rand({6, 5}, DType::F64) * 100.0).t();
  REQUIRE_FALSE(t.is_contiguous());
  CHECK(kiln::multinomial(t, 2).sizes() == IntList{5, 2});
}

TEST_CASE("multinomial: zero weights are never drawn; without replacement draws are distinct", "[multinomial]") {
  kiln::manual_seed(1);
  Tensor w = kiln::tensor(std::vector<double>{0, 1, 0, 2, 0, 0.5, 0}).view({1, 7});
  for (int64_t v : ints(kiln::multinomial(w, 2000, true))) CHECK((v == 1 || v == 3 || v == 5));
  for (int rep = 0; rep < 20; ++rep) {
    std::vector<int64_t> s = ints(kiln::multinomial(w, 3));
    CHECK(std::set<int64_t>(s.begin(), s.end()) == std::set<int64_t>{1, 3, 5});
  }
  Tensor m = kiln::rand({4, 9}, DType::F64) + 0.01;
  std::vector<int64_t> s = ints(kiln::multinomial(m, 9));
  for (int r = 0; r < 4; ++r) {
    std::set<int64_t> row(s.begin() + r * 9, s.begin() + (r + 1) * 9);
    CHECK(row.size() == 9);
  }
  // a one-hot row always gives its category
  Tensor one = kiln::tensor(std::vector<double>{0, 0, 3});
  for (int64_t v : ints(kiln::multinomial(one, 5, true))) CHECK(v == 2);
}

TEST_CASE("multinomial: frequencies follow the weights", "[multinomial]") {
  kiln::manual_seed(42);
  const int64_t n = 40000;
  Tensor w = kiln::tensor(std::vector<float>{1, 2, 3, 4});
  std::vector<double> count(4, 0);
  for (int64_t v : ints(kiln::multinomial(w, n, true))) count[v] += 1;
  for (int k = 0; k < 4; ++k) CHECK(std::abs(count[k] / n - (k + 1) / 10.0) < 0.01);
  // first draw without replacement follows the weights too
  Tensor rows = w.view({1, 4}).expand({n, 4}).contiguous();
  std::vector<double> first(4, 0);
  std::vector<int64_t> s = ints(kiln::multinomial(rows, 2));
  for (int64_t r = 0; r < n; ++r) first[s[r * 2]] += 1;
  for (int k = 0; k < 4; ++k) CHECK(std::abs(first[k] / n - (k + 1) / 10.0) < 0.01);
}

TEST_CASE("multinomial: errors", "[multinomial][errors]") {
  Tensor w = kiln::tensor(std::vector<double>{1, 2, 3});
  CHECK_THROWS_WITH(kiln::multinomial(kiln::tensor(std::vector<double>{1, -1, 2}), 1),
                    Catch::Contains("inf, nan or element < 0"));
  CHECK_THROWS_WITH(kiln::multinomial(kiln::tensor(std::vector<double>{1, NAN}), 1), Catch::Contains("inf, nan"));
  CHECK_THROWS_WITH(kiln::multinomial(kiln::tensor(std::vector<double>{INFINITY, 1}), 1), Catch::Contains("inf, nan"));
  CHECK_THROWS_WITH(kiln::multinomial(kiln::zeros({2, 3}, DType::F64), 1),
                    Catch::Contains("sum of probabilities <= 0"));
  CHECK_THROWS_WITH(kiln::multinomial(w, 4), Catch::Contains("without replacement"));
  CHECK_THROWS_WITH(kiln::multinomial(kiln::tensor(std::vector<double>{1, 0, 2}), 3),
                    Catch::Contains("has only 2 non-zero weights"));
  CHECK_THROWS_WITH(kiln::multinomial(kiln::ones({2, 2, 2}), 1), Catch::Contains("must be 1 or 2 dim"));
  CHECK_THROWS_WITH(kiln::multinomial(kiln::tensor(std::vector<int64_t>{1, 2}), 1), Catch::Contains("floating point"));
  CHECK_THROWS_AS(kiln::multinomial(w, 0), kiln::Error);
  CHECK(kiln::multinomial(w, 10, true).sizes() == IntList{10});  // with replacement, more than n is fine
}
