// Samplers: permutations, DistributedSampler shards, length bucketing / token budgets.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <set>

#include "data_test_util.h"

namespace D = kiln::data;

TEST_CASE("permutation is a seeded permutation that changes with the epoch", "[data][sampler]") {
  auto p0 = D::permutation(1000, 42, 0);
  auto p1 = D::permutation(1000, 42, 1);
  auto q0 = D::permutation(1000, 42, 0);
  auto r0 = D::permutation(1000, 43, 0);
  REQUIRE(p0 == q0);
  REQUIRE(p0 != p1);
  REQUIRE(p0 != r0);
  auto s = p0;
  std::sort(s.begin(), s.end());
  for (int64_t i = 0; i < 1000; ++i) REQUIRE(s[static_cast<size_t>(i)] == i);
  REQUIRE(D::SequentialSampler(3).indices(5) == std::vector<int64_t>{0, 1, 2});
  REQUIRE(D::RandomSampler(1000, 42).indices(1) == p1);
}

TEST_CASE("DistributedSampler shards are disjoint, cover the data and have equal lengths", "[data][sampler]") {
  for (int64_t n : {10, 12, 1, 7}) {
    for (bool shuffle : {false, true}) {
      const int world = 3;
      std::map<int64_t, int> count;
      int64_t len = -1;
      for (int r = 0; r < world; ++r) {
        D::DistributedSampler s(n, r, world, shuffle, /*seed=*/9);
        s.set_epoch(2);
        auto idx = s.indices(0);
        REQUIRE(static_cast<int64_t>(idx.size()) == s.size());
        if (len < 0) len = s.size();
        REQUIRE(s.size() == len);
        for (int64_t i : idx) count[i] += 1;
      }
      REQUIRE(static_cast<int64_t>(count.size()) == n);  // covering
      int64_t padded = len * world - n;
      int64_t dups = 0;
      for (auto& [i, c] : count) dups += c - 1;
      REQUIRE(dups == padded);  // disjoint apart from the padding
    }
  }
  // drop_last: strictly disjoint, not necessarily covering.
  std::set<int64_t> seen;
  for (int r = 0; r < 4; ++r) {
    D::DistributedSampler s(10, r, 4, true, 1, /*drop_last=*/true);
    REQUIRE(s.size() == 2);
    for (int64_t i : s.indices(0)) REQUIRE(seen.insert(i).second);
  }
  // set_epoch reshuffles; without it the loader's epoch is followed.
  D::DistributedSampler a(100, 0, 2, true, 5);
  auto e0 = a.indices(0), e1 = a.indices(1);
  REQUIRE(e0 != e1);
  a.set_epoch(1);
  REQUIRE(a.indices(0) == e1);
  REQUIRE_THROWS_AS(D::DistributedSampler(10, 3, 3), kiln::Error);
}

TEST_CASE("DistributedSampler drives a loader", "[data][sampler][loader]") {
  kiln_test::IndexDataset ds(21);
  std::set<int64_t> all;
  for (int r = 0; r < 2; ++r) {
    auto s = std::make_shared<D::DistributedSampler>(ds.size(), r, 2, true, 3);
    D::DataLoader loader(ds, D::LoaderOptions().batch_size(4).sampler(s).workers(1));
    REQUIRE(loader.size() == 3);  // 11 samples per rank
    for (auto& b : loader)
      for (int64_t i : b.indices) all.insert(i);
  }
  REQUIRE(all.size() == 21);
}

TEST_CASE("bucketed batches stay within the token budget", "[data][sampler]") {
  std::vector<int64_t> lengths;
  for (int64_t i = 0; i < 500; ++i) lengths.push_back(1 + (i * 37 + (i * i) % 11) % 60);
  for (bool shuffle : {true, false}) {
    D::BucketBatchSampler s(lengths, D::BucketOptions(256).shuffle(shuffle).seed(2).pool(8));
    auto batches = s.batches(0);
    std::vector<int> seen(500, 0);
    int64_t padded = 0, real = 0;
    for (auto& b : batches) {
      REQUIRE(!b.empty());
      REQUIRE(s.padded_tokens(b) <= 256);
      padded += s.padded_tokens(b);
      for (int64_t i : b) {
        seen[static_cast<size_t>(i)] += 1;
        real += lengths[static_cast<size_t>(i)];
      }
    }
    for (int c : seen) REQUIRE(c == 1);
    // Bucketing keeps padding small: most of each batch is real tokens.
    REQUIRE(double(real) / double(padded) > 0.8);
    if (shuffle) {
      REQUIRE(s.batches(0) == batches);
      REQUIRE(s.batches(1) != batches);
    }
  }
  // max_batch_size caps the rows.
  D::BucketBatchSampler capped(std::vector<int64_t>(100, 1), D::BucketOptions(1000).max_batch_size(16));
  for (auto& b : capped.batches(0)) REQUIRE(b.size() <= 16);
  // Distributed: equal batch counts, disjoint.
  std::set<int64_t> all;
  size_t count = 0;
  for (int r = 0; r < 3; ++r) {
    D::BucketBatchSampler s(lengths, D::BucketOptions(256).seed(4).distributed(r, 3));
    auto b = s.batches(0);
    if (r == 0) count = b.size();
    REQUIRE(b.size() == count);
    for (auto& bb : b)
      for (int64_t i : bb) REQUIRE(all.insert(i).second);
  }
  REQUIRE_THROWS_WITH(D::BucketBatchSampler({5, 300}, D::BucketOptions(256)),
                      Catch::Contains("sample 1 has length 300"));
}

TEST_CASE("DataRng depends only on (seed, epoch, index, stream)", "[data][sampler]") {
  D::DataRng a(1, 2, 3, D::RngStream::Transform), b(1, 2, 3, D::RngStream::Transform);
  D::DataRng c(1, 2, 4, D::RngStream::Transform), d(1, 3, 3, D::RngStream::Transform);
  uint32_t x = a.next_u32();
  REQUIRE(x == b.next_u32());
  REQUIRE(x != c.next_u32());
  REQUIRE(x != d.next_u32());
  int hits[5] = {};
  for (int i = 0; i < 5000; ++i) hits[a.randint(5)] += 1;
  for (int h : hits) REQUIRE(h > 850);
}
