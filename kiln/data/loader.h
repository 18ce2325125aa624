#pragma once
// DataLoader: batches from a Dataset, built ahead of time by worker threads.
//
//   kiln::data::FashionMNIST train;   // /usr/share/datasets/fashion-mnist
//   kiln::data::DataLoader loader(train, kiln::data::LoaderOptions().batch_size(256).shuffle(true)
//       .workers(4).pin_memory(true).device(dev)
//       .transform(kiln::data::Compose(kiln::data::ToFloat(), kiln::data::Normalize({0.286}, {0.353}))));
//   for (auto& batch : loader) { ... batch.input, batch.target ... }
//
// How it works (docs/guide.md, speed-up 2):
// * N worker threads each build whole batches — sampler indices, Dataset::get, transforms,
//   collation — into a queue at most `prefetch` batches deep. Batches are delivered in sampler
//   order whatever finishes first, so for a given seed the batches are identical for any worker
//   count. workers(0) builds each batch on the calling thread when it is asked for: the slow
//   baseline.
// * Batches are collated straight into buffers of a StagingPool (pinned with pin_memory): no
//   allocation per batch once the pool holds prefetch + 2 blocks. With a CUDA device and
//   pin_memory, the consumer thread issues each batch's host->device copy on a copy stream as soon
//   as the previous batch is handed out; an event makes the current (compute) stream wait for it,
//   so the copy of batch i+1 overlaps the compute of batch i, and the pinned block returns to the
//   pool only after its copy has completed.
// * Randomness (shuffles, crops, flips) is a function of (seed, epoch, sample index); every
//   begin() starts the next epoch (set_epoch overrides), which reshuffles.
// * A worker's exception is rethrown by the consumer when it reaches that batch, as a
//   LoaderError naming the sample index; with timeout(ms) a batch that takes longer raises a
//   kiln::Error instead of hanging; destroying the loader mid-epoch stops and joins the workers.
// * stats(): time the consumer spent waiting for batches in the epoch — if it is a noticeable
//   fraction of the step time, loading is the bottleneck.
#include <memory>
#include <optional>
#include <vector>

#include "kiln/core/arg.h"
#include "kiln/data/collate.h"
#include "kiln/data/dataset.h"
#include "kiln/data/sampler.h"
#include "kiln/data/transforms.h"

namespace kiln::data {

// A worker's failure, rethrown on the consumer thread.
class LoaderError : public Error {
 public:
  LoaderError(const std::string& msg, int64_t sample_index, int64_t batch_index)
      : Error(msg), sample_(sample_index), batch_(batch_index) {}
  int64_t sample_index() const { return sample_; }  // -1 when the failure was in collation
  int64_t batch_index() const { return batch_; }

 private:
  int64_t sample_, batch_;
};

struct LoaderOptions {
  LoaderOptions() = default;

  KILN_ARG(int64_t, batch_size) = 1;
  KILN_ARG(bool, shuffle) = false;
  KILN_ARG(bool, drop_last) = false;
  KILN_ARG(int, workers) = 0;
  KILN_ARG(int, prefetch) = 0;  // batches in flight; 0: 2 x workers
  KILN_ARG(bool, pin_memory) = false;
  KILN_ARG(Device, device) = Device::cpu();
  // unset: the CPU generator's seed (kiln::manual_seed)
  KILN_ARG(std::optional<uint64_t>, seed);
  KILN_ARG(int64_t, timeout) = 0;  // milliseconds a batch may take; 0: wait forever
  KILN_ARG(Compose, transform);
  // Replaces shuffle: the sample order (e.g. a DistributedSampler); batch_size/drop_last apply.
  KILN_ARG(std::shared_ptr<const Sampler>, sampler);
  // Replaces sampler, shuffle, batch_size and drop_last (e.g. a BucketBatchSampler).
  KILN_ARG(std::shared_ptr<const BatchSampler>, batch_sampler);
  KILN_ARG(double, pad_value) = 0.0;
  KILN_ARG(double, target_pad_value) = -100.0;
  // Every batch gets a mask, also when no row needed padding (otherwise only padded batches do).
  KILN_ARG(bool, padding_mask) = false;
};

struct LoaderStats {
  int64_t epoch = -1;
  int64_t batches = 0;  // delivered so far in this epoch
  int64_t samples = 0;
  double wait_seconds = 0;          // consumer time spent inside the loader (waiting or loading)
  double epoch_seconds = 0;         // from begin() to the last batch delivered
  int64_t staging_allocations = 0;  // staging blocks allocated since the loader was built
  int64_t staging_blocks = 0;
  double wait_fraction() const { return epoch_seconds > 0 ? wait_seconds / epoch_seconds : 0.0; }
};

class DataLoader {
 public:
  // The loader keeps a reference: `dataset` must outlive it.
  DataLoader(const Dataset& dataset, LoaderOptions options = LoaderOptions());
  DataLoader(std::shared_ptr<const Dataset> dataset, LoaderOptions options = LoaderOptions());
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    using pointer = Batch*;
    using reference = Batch&;
    Batch& operator*() { return batch_; }
    Batch* operator->() { return &batch_; }
    Iterator& operator++();
    bool operator!=(const Iterator& o) const { return done_ != o.done_; }
    bool operator==(const Iterator& o) const { return done_ == o.done_; }

   private:
    friend class DataLoader;
    Iterator(DataLoader* l, bool done) : loader_(l), done_(done) {}
    DataLoader* loader_;
    bool done_;
    Batch batch_;
  };

  // Starts the next epoch (abandoning one in progress) and returns its first batch.
  Iterator begin();
  Iterator end() { return Iterator(this, true); }
  // Explicit form: starts an epoch; next() then returns batches until it returns false.
  void start_epoch();
  bool next(Batch* out);

  // Batches per epoch (of the epoch in progress, or the next one).
  int64_t size() const;
  // The epoch the next begin() runs (the counter otherwise increments by one per begin()).
  void set_epoch(int64_t epoch);
  int64_t epoch() const;                            // the current (or last) epoch; -1 before the first
  const LoaderStats& stats() const;                 // the current (or last) epoch
  const std::vector<LoaderStats>& history() const;  // finished epochs
  const LoaderOptions& options() const;
  const Dataset& dataset() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::data
