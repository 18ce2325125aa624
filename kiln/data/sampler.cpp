#include "kiln/data/sampler.h"

#include <algorithm>
#include <numeric>

#include "kiln/data/rng.h"

namespace kiln::data {

std::vector<int64_t> permutation(int64_t n, uint64_t seed, uint64_t epoch) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), int64_t(0));
  for (int64_t i = n - 1; i > 0; --i) {
    int64_t j = randint_at(seed, epoch, RngStream::Shuffle, static_cast<uint64_t>(i), i + 1);
    std::swap(p[static_cast<size_t>(i)], p[static_cast<size_t>(j)]);
  }
  return p;
}

std::vector<int64_t> SequentialSampler::indices(int64_t) const {
  std::vector<int64_t> p(static_cast<size_t>(n_));
  std::iota(p.begin(), p.end(), int64_t(0));
  return p;
}

std::vector<int64_t> RandomSampler::indices(int64_t epoch) const {
  return permutation(n_, seed_, static_cast<uint64_t>(epoch));
}

DistributedSampler::DistributedSampler(int64_t n, int rank, int world_size, bool shuffle, uint64_t seed, bool drop_last)
    : n_(n), rank_(rank), world_(world_size), shuffle_(shuffle), seed_(seed), drop_last_(drop_last) {
  KILN_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "DistributedSampler: rank ", rank,
             " is not in [0, world_size = ", world_size, ")");
  KILN_CHECK(n >= 0, "DistributedSampler: negative data set size ", n);
  per_rank_ = drop_last ? n / world_size : (n + world_size - 1) / world_size;
}

std::vector<int64_t> DistributedSampler::indices(int64_t loader_epoch) const {
  int64_t epoch = epoch_ >= 0 ? epoch_ : loader_epoch;
  std::vector<int64_t> all;
  if (shuffle_) {
    all = permutation(n_, seed_, static_cast<uint64_t>(epoch));
  } else {
    all.resize(static_cast<size_t>(n_));
    std::iota(all.begin(), all.end(), int64_t(0));
  }
  int64_t total = per_rank_ * world_;
  if (total > n_) {  // pad by repeating from the start (as PyTorch does)
    for (int64_t k = 0; static_cast<int64_t>(all.size()) < total; ++k)
      all.push_back(all[static_cast<size_t>(k % std::max<int64_t>(n_, 1))]);
  } else {
    all.resize(static_cast<size_t>(total));
  }
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(per_rank_));
  for (int64_t i = rank_; i < total; i += world_) mine.push_back(all[static_cast<size_t>(i)]);
  return mine;
}

FixedBatchSampler::FixedBatchSampler(std::shared_ptr<const Sampler> sampler, int64_t batch_size, bool drop_last)
    : sampler_(std::move(sampler)), batch_size_(batch_size), drop_last_(drop_last) {
  KILN_CHECK(sampler_ != nullptr, "FixedBatchSampler: no sampler");
  KILN_CHECK(batch_size >= 1, "FixedBatchSampler: batch_size must be >= 1, got ", batch_size);
}

std::vector<std::vector<int64_t>> FixedBatchSampler::batches(int64_t epoch) const {
  std::vector<int64_t> idx = sampler_->indices(epoch);
  std::vector<std::vector<int64_t>> out;
  for (size_t s = 0; s < idx.size(); s += static_cast<size_t>(batch_size_)) {
    size_t e = std::min(idx.size(), s + static_cast<size_t>(batch_size_));
    if (drop_last_ && static_cast<int64_t>(e - s) < batch_size_) break;
    out.emplace_back(idx.begin() + static_cast<std::ptrdiff_t>(s), idx.begin() + static_cast<std::ptrdiff_t>(e));
  }
  return out;
}

BucketBatchSampler::BucketBatchSampler(std::vector<int64_t> lengths, BucketOptions options)
    : lengths_(std::move(lengths)), o_(options) {
  KILN_CHECK(o_.max_tokens() >= 1, "BucketBatchSampler: max_tokens must be >= 1");
  KILN_CHECK(o_.world_size() >= 1 && o_.rank() >= 0 && o_.rank() < o_.world_size(), "BucketBatchSampler: rank ",
             o_.rank(), " not in [0, ", o_.world_size(), ")");
  for (size_t i = 0; i < lengths_.size(); ++i)
    KILN_CHECK(lengths_[i] >= 1 && lengths_[i] <= o_.max_tokens(), "BucketBatchSampler: sample ", i, " has length ",
               lengths_[i], ", outside [1, max_tokens = ", o_.max_tokens(), "]: it can never fit a batch");
}

int64_t BucketBatchSampler::padded_tokens(const std::vector<int64_t>& batch) const {
  int64_t longest = 0;
  for (int64_t i : batch) longest = std::max(longest, lengths_[static_cast<size_t>(i)]);
  return longest * static_cast<int64_t>(batch.size());
}

std::vector<std::vector<int64_t>> BucketBatchSampler::batches(int64_t epoch) const {
  const int64_t n = static_cast<int64_t>(lengths_.size());
  std::vector<int64_t> order;
  if (o_.shuffle()) {
    order = permutation(n, o_.seed(), static_cast<uint64_t>(epoch));
  } else {
    order.resize(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), int64_t(0));
  }
  // Pool size: pool x the rows a batch of average-length samples holds.
  double mean_len = n ? std::accumulate(lengths_.begin(), lengths_.end(), 0.0) / n : 1.0;
  int64_t rows = std::max<int64_t>(1, static_cast<int64_t>(o_.max_tokens() / std::max(mean_len, 1.0)));
  int64_t pool = o_.shuffle() ? std::max<int64_t>(1, o_.pool() * rows) : std::max<int64_t>(n, 1);
  std::vector<std::vector<int64_t>> out;
  for (int64_t s = 0; s < n; s += pool) {
    auto b = order.begin() + s, e = order.begin() + std::min(n, s + pool);
    std::stable_sort(b, e, [&](int64_t x, int64_t y) {
      return lengths_[static_cast<size_t>(x)] < lengths_[static_cast<size_t>(y)];
    });
    std::vector<int64_t> cur;
    int64_t longest = 0;
    for (auto it = b; it != e; ++it) {
      int64_t len = lengths_[static_cast<size_t>(*it)];
      int64_t new_longest = std::max(longest, len);
      bool full = (static_cast<int64_t>(cur.size()) + 1) * new_longest > o_.max_tokens() ||
                  (o_.max_batch_size() > 0 && static_cast<int64_t>(cur.size()) >= o_.max_batch_size());
      if (!cur.empty() && full) {
        out.push_back(std::move(cur));
        cur.clear();
        new_longest = len;
      }
      cur.push_back(*it);
      longest = new_longest;
    }
    if (!cur.empty()) out.push_back(std::move(cur));
  }
  if (o_.shuffle()) {  // batch order shuffled too, so lengths do not trend within an epoch
    std::vector<int64_t> perm =
        permutation(static_cast<int64_t>(out.size()), o_.seed() ^ 0x9E3779B97F4A7C15ull, static_cast<uint64_t>(epoch));
    std::vector<std::vector<int64_t>> shuffled;
    shuffled.reserve(out.size());
    for (int64_t p : perm) shuffled.push_back(std::move(out[static_cast<size_t>(p)]));
    out = std::move(shuffled);
  }
  if (o_.world_size() > 1) {  // equal batch counts per rank: drop the tail
    std::vector<std::vector<int64_t>> mine;
    int64_t per = static_cast<int64_t>(out.size()) / o_.world_size();
    for (int64_t k = 0; k < per; ++k)
      mine.push_back(std::move(out[static_cast<size_t>(k * o_.world_size() + o_.rank())]));
    out = std::move(mine);
  }
  return out;
}

}  // namespace kiln::data
