// DistributedDataParallel over Gloo, ranks as processes (tests/distributed/worker/ddp.cpp holds
// the rank programs), and DistributedSampler's sharding.
#include <kiln/kiln.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <set>
#include <string>
#include <vector>

#include "tests/distributed/require_ranks.h"

using kiln_test::require_ranks_pass;

TEST_CASE("DDP: an MLP's gradients and AdamW steps match one process on the full batch", "[ddp]") {
  const int world = GENERATE(2, 3);
  INFO("world size " << world);
  require_ranks_pass(world, {"ddp_train", "model=mlp", "steps=3"});
}

TEST_CASE("DDP: the same with its buckets staged through host buffers (CUDA tensors' gloo path)", "[ddp]") {
  require_ranks_pass(2, {"ddp_train", "model=mlp", "steps=3"}, 120, {{"KILN_GLOO_STAGE_CPU_TENSORS", "1"}});
}

TEST_CASE("DDP: gradient accumulation under no_sync issues no collective and reduces the sum", "[ddp]") {
  require_ranks_pass(2, {"ddp_train", "model=mlp", "steps=3", "accum=3"});
}

TEST_CASE("DDP: several small buckets, with and without gradient_as_bucket_view", "[ddp]") {
  const int view = GENERATE(0, 1);
  INFO("gradient_as_bucket_view " << view);
  require_ranks_pass(3,
                     {"ddp_train", "model=mlp", "steps=3", "accum=2", "cap_bytes=100", "view=" + std::to_string(view)});
}

TEST_CASE("DDP: BatchNorm model, buffers broadcast from rank 0 at each forward", "[ddp]") {
  const int world = GENERATE(2, 3);
  INFO("world size " << world);
  require_ranks_pass(world, {"ddp_train", "model=bn", "steps=3"});
}

TEST_CASE("DDP: buckets launch in bucket order and are rebuilt in the observed order", "[ddp]") {
  require_ranks_pass(2, {"ddp_bucket_order"});
}

TEST_CASE("DDP: find_unused_parameters with a never-used and a rank-dependent parameter", "[ddp]") {
  const int world = GENERATE(2, 3);
  INFO("world size " << world);
  require_ranks_pass(world, {"ddp_train", "model=unused", "steps=3", "find_unused=1"});
  require_ranks_pass(world, {"ddp_train", "model=branch", "steps=3", "find_unused=1"});
  require_ranks_pass(world, {"ddp_train", "model=branch", "steps=2", "find_unused=1", "view=1", "cap_bytes=100"});
  // `extra` gets its only gradient in a no_sync micro-batch: the reduction must include it
  for (const char* view : {"view=0", "view=1"})
    require_ranks_pass(world,
                       {"ddp_train", "model=branch", "steps=3", "find_unused=1", "accum=2", "extra_micro=0", view});
}

TEST_CASE("DDP: an unused parameter without find_unused_parameters is an Error naming it", "[ddp]") {
  require_ranks_pass(2, {"ddp_unused_error"});
}

TEST_CASE("DDP: a parameter unused on some ranks only: an Error on every rank, no hang", "[ddp]") {
  const int world = GENERATE(2, 3);
  INFO("world size " << world);
  require_ranks_pass(world, {"ddp_unused_on_some_ranks"}, 60);
}

TEST_CASE("DDP: ranks with different models fail at construction naming the difference", "[ddp]") {
  require_ranks_pass(2, {"ddp_mismatch", "kind=shape"});
  require_ranks_pass(2, {"ddp_mismatch", "kind=count"});
}

// ---------------------------------------------------------------- DistributedSampler

TEST_CASE("DistributedSampler: disjoint shards of equal length covering the data set", "[sampler]") {
  const int64_t n = GENERATE(12, 13, 2, 0);
  const int world = GENERATE(1, 3, 4);
  const bool shuffle = GENERATE(false, true);
  INFO("n " << n << ", world " << world << ", shuffle " << shuffle);
  std::vector<int64_t> all;
  for (int r = 0; r < world; ++r) {
    kiln::data::DistributedSampler s(n, r, world, shuffle, /*seed=*/7);
    auto idx = s.indices(0);
    // padded to ceil(n / world) per rank, as PyTorch
    REQUIRE(static_cast<int64_t>(idx.size()) == (n + world - 1) / world);
    REQUIRE(s.size() == static_cast<int64_t>(idx.size()));
    all.insert(all.end(), idx.begin(), idx.end());
  }
  std::set<int64_t> distinct(all.begin(), all.end());
  REQUIRE(static_cast<int64_t>(distinct.size()) == n);  // every sample, and only those
  for (int64_t i : all) REQUIRE((i >= 0 && i < n));
  // only the padding repeats samples
  REQUIRE(static_cast<int64_t>(all.size()) - n < world);
}

TEST_CASE("DistributedSampler: padding repeats the first samples; drop_last drops the tail", "[sampler]") {
  // 10 samples on 4 ranks: 12 slots, samples 0 and 1 again; rank r takes r, r + 4, r + 8.
  std::vector<std::vector<int64_t>> expected = {{0, 4, 8}, {1, 5, 9}, {2, 6, 0}, {3, 7, 1}};
  for (int r = 0; r < 4; ++r) {
    kiln::data::DistributedSampler s(10, r, 4, /*shuffle=*/false);
    REQUIRE(s.indices(0) == expected[static_cast<size_t>(r)]);
  }
  std::set<int64_t> seen;
  for (int r = 0; r < 4; ++r) {
    kiln::data::DistributedSampler s(10, r, 4, /*shuffle=*/true, 3, /*drop_last=*/true);
    auto idx = s.indices(0);
    REQUIRE(idx.size() == 2);
    for (int64_t i : idx) REQUIRE(seen.insert(i).second);  // disjoint, no padding
  }
  REQUIRE(seen.size() == 8);
}

TEST_CASE("DistributedSampler: set_epoch reshuffles, identically on every rank", "[sampler]") {
  const int world = 3;
  const int64_t n = 30;
  std::vector<std::vector<int64_t>> epoch0, epoch1;
  for (int r = 0; r < world; ++r) {
    kiln::data::DistributedSampler s(n, r, world, true, /*seed=*/11);
    s.set_epoch(0);
    epoch0.push_back(s.indices(123));  // set_epoch wins over the loader's counter
    s.set_epoch(1);
    epoch1.push_back(s.indices(0));
    // the same (seed, epoch) on another sampler object gives the same shard
    kiln::data::DistributedSampler again(n, r, world, true, 11);
    again.set_epoch(1);
    REQUIRE(again.indices(0) == epoch1.back());
  }
  REQUIRE(epoch0 != epoch1);
  // each epoch's shards partition the data set (the ranks agree on the permutation)
  for (const auto* shards : {&epoch0, &epoch1}) {
    std::set<int64_t> all;
    for (const auto& s : *shards) all.insert(s.begin(), s.end());
    REQUIRE(all.size() == static_cast<size_t>(n));
  }
  // without set_epoch the sampler follows the loader's epoch
  kiln::data::DistributedSampler follow(n, 0, world, true, 11);
  REQUIRE(follow.indices(1) == epoch1[0]);
}

TEST_CASE("DDP: the model zoo's FashionCNN and a tiny GPT match one process, with no_sync accumulation", "[ddp]") {
  const int world = GENERATE(2, 3);
  for (const char* model : {"model=cnn", "model=gpt"}) {
    INFO("world size " << world << ", " << model);
    kiln_test::require_ranks_pass(world, {"ddp_zoo", model, "steps=3", "accum=2"});
  }
}
