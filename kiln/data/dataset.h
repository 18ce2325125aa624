#pragma once
// Dataset: the interface every kiln dataset implements, and Example, one sample of it.
//
// A dataset is a random-access collection: size() samples, get(i) returns sample i. get() is
// called concurrently from the DataLoader's worker threads, so it must be thread-safe (the
// readers in kiln/data load their files once and hand out views, which is). Samples are
// usually zero-copy views of the dataset's memory: collation copies them into the batch.
#include <cstdint>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/core/tensor.h"

namespace kiln::data {

// One sample: an input and a target (the target may be undefined for unsupervised data).
struct Example {
  Tensor input;
  Tensor target;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // Sample `index` (0 <= index < size()). Must be safe to call from several threads at once.
  virtual Example get(int64_t index) const = 0;
  // The length of sample `index` in tokens (what length bucketing and token-budget batching
  // sort and count by). The default is the input's first dimension.
  virtual int64_t length(int64_t index) const { return get(index).input.size(0); }
};

// Lengths of every sample of `ds` (for BucketBatchSampler).
inline std::vector<int64_t> lengths_of(const Dataset& ds) {
  std::vector<int64_t> out(static_cast<size_t>(ds.size()));
  for (int64_t i = 0; i < ds.size(); ++i) out[static_cast<size_t>(i)] = ds.length(i);
  return out;
}

// Which half of a dataset a reader loads.
enum class Split { Train, Test };

inline const char* split_name(Split s) { return s == Split::Train ? "train" : "test"; }

}  // namespace kiln::data
