#pragma once
// Collation: a list of samples -> one batch, written into staging-pool buffers.
//
// * Inputs (and targets) of equal shape are stacked: [B, ...]. Scalar targets become [B].
// * Inputs of different lengths (dim 0) are padded to the longest with pad_value, and a bool mask
//   [B, L] (true at real positions) is returned; targets likewise, with target_pad_value
//   (-100, cross_entropy's ignore_index, for integer targets).
// * With an active Conversion (the fused ToFloat / Normalize / ChannelsLast tail of a Compose)
//   image inputs are converted while they are copied: out = x * a[c] + b[c] in the conversion's
//   dtype, NCHW or NHWC.
// * Channels-last samples (ChannelsLast run unfused) give a channels-last batch.
#include <vector>

#include "kiln/core/arg.h"
#include "kiln/data/dataset.h"
#include "kiln/data/transforms.h"

namespace kiln::data {

class StagingPool;

struct Batch {
  Tensor input;                  // [B, ...]
  Tensor target;                 // [B] or [B, ...]; undefined when the samples have no target
  Tensor mask;                   // [B, L] bool for padded variable-length inputs; undefined otherwise
  std::vector<int64_t> indices;  // the dataset indices of the rows
  int64_t index = 0;             // position of this batch in its epoch
  int64_t epoch = 0;
  int64_t size() const { return static_cast<int64_t>(indices.size()); }
};

struct CollateOptions {
  KILN_ARG(double, pad_value) = 0.0;
  KILN_ARG(double, target_pad_value) = -100.0;
  // a mask for every batch, also when no row needed padding
  KILN_ARG(bool, always_mask) = false;
  // the dtype conversion and normalization fused into collation (Compose::split_fused)
  KILN_ARG(Conversion, conversion);
};

// Collates `samples` into buffers from `pool` (plain heap tensors when pool is null).
Batch collate(const std::vector<Example>& samples, const CollateOptions& options, StagingPool* pool);

}  // namespace kiln::data
