#pragma once
// The gradient reducer behind DistributedDataParallel (docs/data_parallel.md, "DDP"): it
// averages the gradients of a model's parameters across the ranks of a group while backward
// still runs.
//
//   - Parameters that require grad are packed into buckets, in reverse registration order (the
//     order backward usually produces their gradients), one dtype and device per bucket, capped
//     by bytes. A bucket owns one flat contiguous buffer; each parameter has a slot in it.
//   - A post-accumulate-grad hook per parameter copies the gradient into its slot (or, with
//     gradient_as_bucket_view, makes .grad the slot itself) and marks it ready. A bucket whose
//     slots are all ready is all-reduced (Avg) asynchronously - strictly in bucket order, so all
//     ranks issue the same collectives in the same order whatever order their hooks ran in.
//   - Without gradient_as_bucket_view the averages go back into .grad: for CPU buckets on the
//     backend's thread as soon as the bucket's all-reduce ends (Work::then).
//   - The first hook of a backward queues a callback (autograd::queue_callback) that runs once
//     the backward finished: it launches what is left, waits, and copies back what is left.
//   - After the first reduced iteration the buckets are rebuilt once in the order the gradients
//     became ready on rank 0 (broadcast, so every rank agrees), as PyTorch does.
//
// Hooks cannot be removed from a tensor, so they hold the reducer's state weakly: once the
// Reducer is destroyed they do nothing.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/tensor.h"
#include "kiln/distributed/backends/process_group.h"

namespace kiln::distributed {

struct ReducerConfig {
  int64_t first_bucket_bytes = int64_t(1) << 20;
  int64_t bucket_bytes = int64_t(25) << 20;
  bool find_unused_parameters = false;
  bool gradient_as_bucket_view = false;
};

class Reducer {
 public:
  // `params`: every parameter that requires grad, with its name, in registration order.
  Reducer(std::vector<std::pair<std::string, Tensor>> params, std::shared_ptr<ProcessGroup> group,
          const ReducerConfig& config);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Called at each forward: rethrows the error of a previous backward that could not reduce
  // (a parameter without gradient and no find_unused_parameters), so training cannot go on
  // with gradients that differ across ranks.
  void prepare_for_forward();

  // false (inside DistributedDataParallel::no_sync()): backward accumulates locally, issues no
  // collective; the next backward with sync on reduces what was accumulated.
  void set_sync(bool sync);
  bool sync() const;

  // The buckets as indices into `params` (bucket order = launch order), for tests and logs.
  std::vector<std::vector<size_t>> bucket_indices() const;
  // Whether the one rebuild in observed gradient order has happened.
  bool buckets_rebuilt() const;

  struct State;  // shared with the hooks

 private:
  std::shared_ptr<State> state_;
};

}  // namespace kiln::distributed
