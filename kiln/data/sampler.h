#pragma once
// Samplers decide which samples an epoch visits and in what order; batch samplers group them
// into batches. Every order is a pure function of (seed, epoch), so all ranks of a distributed
// job and all worker counts agree.
//
//   SequentialSampler      0, 1, ..., n-1
//   RandomSampler          a seeded permutation, a new one each epoch
//   DistributedSampler     this rank's shard of a (shuffled) permutation; shards are disjoint,
//                          cover the data set, and have equal lengths (padding by repeating
//                          samples, or dropping the tail with drop_last)
//   FixedBatchSampler      consecutive groups of batch_size from a Sampler (drop_last optional)
//   BucketBatchSampler     length bucketing + token-budget batching for variable-length data:
//                          samples of similar length are batched together so that
//                          (batch rows x longest sample) <= max_tokens — batches of roughly
//                          constant work, little padding (the load balancing of
//                          docs/guide.md, speed-up 10)
#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/core/arg.h"
#include "kiln/core/error.h"

namespace kiln::data {

// A seeded permutation of 0..n-1 for (seed, epoch).
std::vector<int64_t> permutation(int64_t n, uint64_t seed, uint64_t epoch);

class Sampler {
 public:
  virtual ~Sampler() = default;
  // The sample indices of epoch `epoch`.
  virtual std::vector<int64_t> indices(int64_t epoch) const = 0;
  // Samples per epoch.
  virtual int64_t size() const = 0;
};

class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t n) : n_(n) {}
  std::vector<int64_t> indices(int64_t epoch) const override;
  int64_t size() const override { return n_; }

 private:
  int64_t n_;
};

class RandomSampler : public Sampler {
 public:
  RandomSampler(int64_t n, uint64_t seed) : n_(n), seed_(seed) {}
  std::vector<int64_t> indices(int64_t epoch) const override;
  int64_t size() const override { return n_; }

 private:
  int64_t n_;
  uint64_t seed_;
};

class DistributedSampler : public Sampler {
 public:
  DistributedSampler(int64_t n, int rank, int world_size, bool shuffle = true, uint64_t seed = 0,
                     bool drop_last = false);
  // As in PyTorch. When set, this epoch is used whatever the loader's epoch is; when never set,
  // the sampler follows the loader's epoch counter.
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  std::vector<int64_t> indices(int64_t epoch) const override;
  int64_t size() const override { return per_rank_; }
  int rank() const { return rank_; }
  int world_size() const { return world_; }

 private:
  int64_t n_;
  int rank_, world_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t per_rank_;
  int64_t epoch_ = -1;
};

class BatchSampler {
 public:
  virtual ~BatchSampler() = default;
  virtual std::vector<std::vector<int64_t>> batches(int64_t epoch) const = 0;
};

class FixedBatchSampler : public BatchSampler {
 public:
  FixedBatchSampler(std::shared_ptr<const Sampler> sampler, int64_t batch_size, bool drop_last);
  std::vector<std::vector<int64_t>> batches(int64_t epoch) const override;

 private:
  std::shared_ptr<const Sampler> sampler_;
  int64_t batch_size_;
  bool drop_last_;
};

struct BucketOptions {
  BucketOptions() = default;
  explicit BucketOptions(int64_t max_tokens) : max_tokens_(max_tokens) {}
  // Shards batches across ranks (equal counts per rank).
  BucketOptions& distributed(int rank, int world_size) {
    rank_ = rank;
    world_size_ = world_size;
    return *this;
  }

  // budget per batch: rows x longest row (padding counted)
  KILN_ARG(int64_t, max_tokens) = 4096;
  KILN_ARG(int64_t, max_batch_size) = 0;  // 0: no limit on rows
  KILN_ARG(bool, shuffle) = true;
  KILN_ARG(uint64_t, seed) = 0;
  // samples are sorted by length within pools of pool x (typical batch rows)
  KILN_ARG(int64_t, pool) = 64;
  KILN_ARG(int, rank) = 0;
  KILN_ARG(int, world_size) = 1;
};

class BucketBatchSampler : public BatchSampler {
 public:
  // lengths[i]: tokens in sample i (see lengths_of(dataset)). A sample longer than max_tokens is
  // an error (it could never fit a batch).
  BucketBatchSampler(std::vector<int64_t> lengths, BucketOptions options);
  std::vector<std::vector<int64_t>> batches(int64_t epoch) const override;
  // Tokens a batch costs once padded: rows x longest.
  int64_t padded_tokens(const std::vector<int64_t>& batch) const;

 private:
  std::vector<int64_t> lengths_;
  BucketOptions o_;
};

}  // namespace kiln::data
