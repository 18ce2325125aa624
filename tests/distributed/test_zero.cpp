// ZeroRedundancyOptimizer (ZeRO-1) over Gloo, ranks as processes
// (tests/distributed/worker/zero.cpp).
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "tests/distributed/spawn.h"

namespace {

void run_zero_ranks(int world, const std::vector<std::string>& scenario_and_args) {
  std::vector<std::string> argv = {KILN_DIST_WORKER};
  argv.insert(argv.end(), scenario_and_args.begin(), scenario_and_args.end());
  kiln_test::SpawnOptions opts;
  opts.world_size = world;
  opts.deadline_seconds = 120;
  auto results = kiln_test::spawn_ranks(argv, opts);
  INFO(kiln_test::describe(results));
  REQUIRE(results.size() == static_cast<size_t>(world));
  for (const auto& r : results) REQUIRE(r.exit_code == 0);
}

}  // namespace

TEST_CASE("ZeRO-1: AdamW on shards matches plain AdamW, with 1/world of the state per rank",
          "[zero]") {
  const int world = GENERATE(2, 3);  // 212 parameters: 3 ranks need padding
  INFO("world size " << world);
  run_zero_ranks(world, {"zero_matches_adamw", "steps=5"});
}

TEST_CASE("ZeRO-1: per-rank state_dict resumes training exactly", "[zero]") {
  run_zero_ranks(2, {"zero_state_dict_resume"});
}
