// Collectives over the gloo process group, each test a job of 2-4 rank processes over loopback
// (tests/distributed/spawn.h) that must finish within its deadline.
#include <catch2/catch.hpp>

#include "tests/distributed/require_ranks.h"

using kiln_test::describe;
using kiln_test::require_ranks_pass;
using kiln_test::spawn_ranks;
using kiln_test::SpawnOptions;

namespace {

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace

TEST_CASE("collectives: every collective and reduction, 1 to 4 ranks") {
  for (int world : {1, 2, 3, 4}) require_ranks_pass(world, {"collectives"}, 60);
}

// The gloo group's path for CUDA tensors (pinned host buffers, copies both ways around the CPU
// collective) run over CPU tensors: every collective must read its inputs from the staged copies
// and write its outputs back (docs/distributed.md, "Several ranks on one GPU").
TEST_CASE("collectives: every collective staged through host buffers, 1 to 3 ranks") {
  for (int world : {1, 2, 3}) require_ranks_pass(world, {"collectives"}, 60, {{"KILN_GLOO_STAGE_CPU_TENSORS", "1"}});
}

TEST_CASE("collectives: new_group with a non-member rank") { require_ranks_pass(3, {"new_group"}, 60); }

TEST_CASE("collectives: bad input is a kiln::Error on every rank and the ranks stay in step") {
  require_ranks_pass(2, {"bad_input"}, 60);
}

TEST_CASE("failures: a rank killed with SIGKILL mid-training makes every survivor raise an Error") {
  // 4 ranks started by hand (no kiln-run); rank 2 dies at step 20. The timeout is 10 s, so each
  // survivor must fail within 10 s plus a few; a dead peer's closed sockets usually fail it at once.
  for (int victim : {2, 0}) {  // 0 also hosts the store
    SpawnOptions opt;
    opt.world_size = 4;
    opt.deadline_seconds = 40;
    auto results = spawn_ranks({KILN_DIST_WORKER, "peer_killed", std::to_string(victim), "20", "10"}, opt);
    INFO("victim " << victim << "\n" << describe(results));
    for (int r = 0; r < 4; ++r) {
      if (r == victim) {
        CHECK(results[r].signal == SIGKILL);
        continue;
      }
      CHECK_FALSE(results[r].killed_at_deadline);
      CHECK(results[r].exit_code == 3);
      CHECK(results[r].seconds < 10 + 8);
      CHECK(contains(results[r].output, "all_reduce #"));
      CHECK(contains(results[r].output, "failed"));
      // The store's server saw the victim's connection close (or, for rank 0, is gone with it).
      CHECK(contains(results[r].output, "Rank " + std::to_string(victim) + " has exited"));
    }
  }
}

TEST_CASE("failures: a rank that never joins ends the rendezvous with an Error naming it") {
  SpawnOptions opt;
  opt.world_size = 3;
  opt.ranks = {0, 1};  // rank 2 is never started
  opt.deadline_seconds = 30;
  auto results = spawn_ranks({KILN_DIST_WORKER, "join", "3"}, opt);
  INFO(describe(results));
  for (const auto& r : results) {
    CHECK_FALSE(r.killed_at_deadline);
    CHECK(r.exit_code == 5);
    CHECK(r.seconds < 3 + 8);
    CHECK(contains(r.output, "ranks [2] of 3 never joined"));
  }
}

TEST_CASE("failures: ranks with different KILN_GLOO_SEGMENT_BYTES stop with an Error naming both") {
  SpawnOptions opt;
  opt.world_size = 3;
  opt.deadline_seconds = 40;
  auto results = spawn_ranks({KILN_DIST_WORKER, "segment_mismatch"}, opt);
  INFO(describe(results));
  for (int r = 0; r < 3; ++r) {
    CHECK_FALSE(results[r].killed_at_deadline);
    CHECK(results[r].exit_code == (r == 2 ? 5 : 6));
  }
  CHECK(contains(results[2].output,
                 "rank 2 cuts all-reduces into segments of 2097152 bytes but "
                 "rank 0 into 4194304"));
}

TEST_CASE("failures: a KILN_GLOO_SEGMENT_BYTES that is not a size is an Error at init on every rank") {
  for (const char* bad : {"12", "4MB", "-4194304"}) {
    SpawnOptions opt;
    opt.world_size = 2;
    opt.deadline_seconds = 30;
    opt.env["KILN_GLOO_SEGMENT_BYTES"] = bad;
    auto results = spawn_ranks({KILN_DIST_WORKER, "join", "10"}, opt);
    INFO("KILN_GLOO_SEGMENT_BYTES=" << bad << "\n" << describe(results));
    for (const auto& r : results) {
      CHECK_FALSE(r.killed_at_deadline);
      CHECK(r.exit_code == 5);
      CHECK(contains(r.output, std::string("KILN_GLOO_SEGMENT_BYTES must be a whole number of bytes, at "
                                           "least 1024, got '") +
                                   bad + "'"));
    }
  }
}

TEST_CASE("failures: mismatched collectives under KILN_DISTRIBUTED_DEBUG name both sides") {
  SpawnOptions opt;
  opt.world_size = 3;
  opt.deadline_seconds = 40;
  opt.env["KILN_DISTRIBUTED_DEBUG"] = "1";
  auto results = spawn_ranks({KILN_DIST_WORKER, "mismatch"}, opt);
  INFO(describe(results));
  for (const auto& r : results) {
    CHECK_FALSE(r.killed_at_deadline);
    CHECK(r.exit_code == 4);
    CHECK(contains(r.output, "collective #1 differs across ranks"));
    CHECK(contains(r.output, "ranks 0, 1 called all_reduce(Sum) float32 [[10]]"));
    CHECK(contains(r.output, "rank 2 called all_reduce(Sum) float32 [[12]]"));
  }
}
