#pragma once
// For the Catch2 tests of tests/distributed: a job of kiln-dist-worker ranks that must all pass.
// (spawn.h itself stays free of Catch: the distributed benches start their ranks with it too.)
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "tests/distributed/spawn.h"

namespace kiln_test {

// Runs the rank program kiln-dist-worker (tests/distributed/worker) with `scenario_and_args` on
// `world` ranks and REQUIREs every rank to exit 0; a failure shows every rank's output.
// `env` adds variables to every rank's environment.
inline void require_ranks_pass(int world, const std::vector<std::string>& scenario_and_args,
                               double deadline_seconds = 120, const std::map<std::string, std::string>& env = {}) {
  std::vector<std::string> argv = {KILN_DIST_WORKER};
  argv.insert(argv.end(), scenario_and_args.begin(), scenario_and_args.end());
  SpawnOptions opts;
  opts.world_size = world;
  opts.deadline_seconds = deadline_seconds;
  opts.env = env;
  auto results = spawn_ranks(argv, opts);
  INFO(describe(results));
  REQUIRE(results.size() == static_cast<size_t>(world));
  for (const auto& r : results) REQUIRE(r.exit_code == 0);
}

}  // namespace kiln_test
