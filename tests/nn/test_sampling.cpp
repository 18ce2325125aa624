// kiln::nn::sample_next_token: greedy limits (top-k 1, tiny top-p, temperature 0), the filtered
// distribution, and the draws' frequencies against it.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include <kiln/kiln.h>
#include "tests/test_util.h"

using kiln::Tensor;
using kiln::nn::SamplingOptions;

using namespace kiln_test;

TEST_CASE("sampling: top_k = 1, tiny top_p and temperature 0 are argmax", "[sampling]") {
  kiln::manual_seed(3);
  auto logits = kiln::randn({4, 50});
  auto want = values(logits.argmax(1));
  for (auto o : {SamplingOptions().top_k(1), SamplingOptions().top_p(1e-9), SamplingOptions().temperature(0),
                 SamplingOptions().temperature(1e-6)}) {
    for (int rep = 0; rep < 5; ++rep) {
      auto t = kiln::nn::sample_next_token(logits, o);
      REQUIRE(t.dtype() == DType::I64);
      REQUIRE(t.sizes() == IntList{4});
      REQUIRE(values(t) == want);
    }
  }
  auto one = kiln::nn::sample_next_token(logits[2], SamplingOptions().top_k(1));
  REQUIRE(one.dim() == 0);
  REQUIRE(one.item<int64_t>() == static_cast<int64_t>(want[2]));
}

TEST_CASE("sampling: the filtered distribution", "[sampling]") {
  auto logits = kiln::tensor({0.0, 1.0, 2.0, 3.0}, DType::F64);
  std::vector<double> e = {1, std::exp(1.0), std::exp(2.0), std::exp(3.0)};
  double z = e[0] + e[1] + e[2] + e[3];
  check_close(kiln::nn::sampling_probs(logits), {e[0] / z, e[1] / z, e[2] / z, e[3] / z}, 1e-12, 0);
  double z2 = e[2] + e[3];
  check_close(kiln::nn::sampling_probs(logits, SamplingOptions().top_k(2)), {0, 0, e[2] / z2, e[3] / z2}, 1e-12, 0);
  // top_p = 0.8: 0.644 (token 3) < 0.8 <= 0.644 + 0.237: tokens 2 and 3
  check_close(kiln::nn::sampling_probs(logits, SamplingOptions().top_p(0.8)), {0, 0, e[2] / z2, e[3] / z2}, 1e-12, 0);
  // temperature 2 flattens
  std::vector<double> h = {1, std::exp(0.5), std::exp(1.0), std::exp(1.5)};
  double zh = h[0] + h[1] + h[2] + h[3];
  check_close(kiln::nn::sampling_probs(logits, SamplingOptions().temperature(2)),
              {h[0] / zh, h[1] / zh, h[2] / zh, h[3] / zh}, 1e-12, 0);
  REQUIRE_THROWS_AS(kiln::nn::sample_next_token(logits, SamplingOptions().top_p(0)), kiln::Error);
  REQUIRE_THROWS_AS(kiln::nn::sample_next_token(logits, SamplingOptions().top_k(-1)), kiln::Error);
  REQUIRE_THROWS_AS(kiln::nn::sample_next_token(kiln::randn({2, 3, 4})), kiln::Error);
  REQUIRE_THROWS_AS(kiln::nn::sample_next_token(kiln::tensor({1, 2})), kiln::Error);
}

TEST_CASE("sampling: draws follow the distribution", "[sampling]") {
  auto logits = kiln::tensor({0.5, -1.0, 2.0, 0.0, 1.0}, DType::F64);
  const auto o = SamplingOptions().temperature(0.8).top_k(4).top_p(0.95);
  auto p = values(kiln::nn::sampling_probs(logits, o));
  const int n = 20000;
  // many rows at once: each row draws independently
  auto rows = logits.unsqueeze(0).expand({n, 5}).contiguous();
  kiln::Generator gen(1234);
  auto draws = values(kiln::nn::sample_next_token(rows, o, &gen));
  std::vector<double> freq(5, 0);
  for (double d : draws) freq[static_cast<size_t>(d)] += 1.0 / n;
  for (int i = 0; i < 5; ++i) {
    INFO("token " << i << ": p " << p[i] << " freq " << freq[i]);
    REQUIRE(std::abs(freq[i] - p[i]) < 4 * std::sqrt(p[i] * (1 - p[i]) / n) + 1e-12);
  }
  REQUIRE(p[1] == 0);  // outside top-k
  // the same generator state gives the same draws
  kiln::Generator g1(7), g2(7);
  REQUIRE(values(kiln::nn::sample_next_token(rows.slice(0, 0, 100), o, &g1)) ==
          values(kiln::nn::sample_next_token(rows.slice(0, 0, 100), o, &g2)));
}

TEST_CASE("sampling: GPT::generate samples through it", "[sampling]") {
  kiln::manual_seed(0);
  kiln::nn::models::GPT gpt(kiln::nn::models::GPTConfig::tiny(64, 16));
  auto idx = kiln::tensor({1, 2, 3}).view({1, -1});
  auto greedy = gpt.generate(idx, 5, SamplingOptions().temperature(0));
  REQUIRE(greedy.sizes() == IntList{1, 8});
  REQUIRE(values(greedy) == values(gpt.generate(idx, 5, SamplingOptions().top_k(1))));
  kiln::Generator g1(5), g2(5);
  REQUIRE(values(gpt.generate(idx, 6, SamplingOptions().top_p(0.9), &g1)) ==
          values(gpt.generate(idx, 6, SamplingOptions().top_p(0.9), &g2)));
  REQUIRE(gpt.generate(idx, 4, 0.7, 10).sizes() == IntList{1, 7});
}
