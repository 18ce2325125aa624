// ZeroRedundancyOptimizer (ZeRO-1) over Gloo, ranks as processes
// (tests/distributed/worker/zero.cpp).
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "tests/distributed/require_ranks.h"

using kiln_test::require_ranks_pass;

TEST_CASE("ZeRO-1: AdamW on shards matches plain AdamW, with 1/world of the state per rank", "[zero]") {
  const int world = GENERATE(2, 3);  // 212 parameters: 3 ranks need padding
  INFO("world size " << world);
  require_ranks_pass(world, {"zero_matches_adamw", "steps=5"});
}

TEST_CASE("ZeRO-1: per-rank state_dict resumes training exactly", "[zero]") {
  require_ranks_pass(2, {"zero_state_dict_resume"});
}
