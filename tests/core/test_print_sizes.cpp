// Tensor::sizes() / strides() streamed from code outside namespace kiln (no using-directive in
// this file): argument-dependent lookup must find kiln's operator<<, which prints as libtorch.
#include <catch2/catch.hpp>

#include <cstdint>
#include <iostream>
#include <sstream>
#include <vector>

#include <kiln/kiln.h>

TEST_CASE("sizes() and strides() print as [2, 3] outside namespace kiln", "[tensor][print]") {
  kiln::Tensor t = kiln::zeros({2, 3});
  std::ostringstream os;
  os << t.sizes() << ' ' << t.strides() << ' ' << t.transpose(0, 1).sizes();
  REQUIRE(os.str() == "[2, 3] [3, 1] [3, 2]");
  std::ostringstream empty;
  empty << kiln::zeros({}).sizes();
  REQUIRE(empty.str() == "[]");
  std::ostringstream list;
  list << kiln::IntList{4, 5};
  REQUIRE(list.str() == "[4, 5]");
  std::cout << t.sizes() << '\n';  // the line a model writer types
}

TEST_CASE("IntList is still a std::vector<int64_t> wherever one is expected", "[tensor][print]") {
  kiln::Tensor t = kiln::zeros({2, 3});
  std::vector<int64_t> copy = t.sizes();
  const std::vector<int64_t>& ref = t.sizes();
  kiln::IntList back = kiln::zeros(copy).sizes();
  REQUIRE(copy == std::vector<int64_t>{2, 3});
  REQUIRE(ref.size() == 2);
  REQUIRE(back == t.sizes());
  REQUIRE(t.sizes() == kiln::IntList{2, 3});
  int64_t n = 1;
  for (int64_t s : t.sizes()) n *= s;
  REQUIRE(n == 6);
  REQUIRE(t.view(t.sizes()).sizes()[1] == 3);
}
