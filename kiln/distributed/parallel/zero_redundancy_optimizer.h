#pragma once
// ZeroRedundancyOptimizer: ZeRO stage 1 (docs/data_parallel.md, "ZeRO-1"). Each rank keeps
// the optimizer state of one slice of the parameters only, so Adam's two moments (and f32
// master weights) take 1/world_size of the memory per rank.
//
//   kiln::optim::ZeroRedundancyOptimizer zero(
//       model->parameters(),
//       kiln::distributed::local_optimizer<kiln::optim::AdamW>(kiln::optim::AdamWOptions(3e-4)));
//   loss.backward();   // on this rank's shard of the batch, no DDP needed
//   zero.step();       // reduce-scatter gradients, update the owned slice, all-gather parameters
//   zero.zero_grad();
//   kiln::optim::StepLR sched(zero.local_optimizer(), ...);   // schedules drive the local one
//
// Layout: the parameters of each dtype and device are flattened, in order, into one buffer
// padded to a multiple of world_size; rank r owns the r-th of world_size equal slices.
// Parameters that do not require grad are left out. step():
//   1. the gradients are packed into the flat gradient buffer (a missing gradient counts as
//      zeros: the optimizer sees a contiguous slice, not parameters, so weight decay still
//      applies to a parameter that got no gradient this step);
//   2. reduce_scatter_tensor(Avg): each rank gets the averaged gradient of its slice;
//   3. the wrapped optimizer updates the slice, a separate tensor holding this rank's elements
//      (read again from the parameters each step, so a model.load_state_dict is seen);
//   4. all_gather_into_tensor rebuilds the full flat buffer; the parameters are copied from it.
// Every rank calls step() together (it issues collectives). Memory per rank: the optimizer state
// of its slice, plus one padded flat copy of the parameters and one of the gradients (the
// collectives' buffers).
//
// state_dict() is per rank: the local optimizer's state for this rank's slice, with the layout
// it belongs to. Save one file per rank and load each on the same rank of a job with the same
// world size and parameters; load_state_dict checks both.
#include <functional>
#include <memory>
#include <vector>

#include "kiln/core/tensor.h"
#include "kiln/distributed/distributed.h"
#include "kiln/optim/optimizer.h"

namespace kiln::distributed {

// Makes the optimizer that updates this rank's slices (one tensor per dtype/device group).
using LocalOptimizerFactory = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor> shard_params)>;

// The factory for optimizer type Opt with `options`: local_optimizer<AdamW>(AdamWOptions(1e-3)).
template <class Opt, class Options> LocalOptimizerFactory local_optimizer(const Options& options) {
  return [options](std::vector<Tensor> shard) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<Opt>(std::move(shard), options);
  };
}

struct ZeroStateDict {
  int rank = 0;
  int world_size = 1;
  std::vector<int64_t> shard_numels;  // per flat group, what this rank owns
  optim::OptimizerStateDict local;    // the wrapped optimizer's state_dict
};

class ZeroRedundancyOptimizer {
 public:
  ZeroRedundancyOptimizer(std::vector<Tensor> params, LocalOptimizerFactory make_local_optimizer,
                          Group group = nullptr);
  ~ZeroRedundancyOptimizer();
  ZeroRedundancyOptimizer(const ZeroRedundancyOptimizer&) = delete;
  ZeroRedundancyOptimizer& operator=(const ZeroRedundancyOptimizer&) = delete;

  // Collective: every rank of the group calls it.
  void step();
  // The full parameters' gradients (not only the owned slice).
  void zero_grad(bool set_to_none = true);

  // The optimizer over this rank's slices: its param_groups carry lr and momentum (set_lr,
  // schedules); its state is this rank's share.
  optim::Optimizer& local_optimizer() { return *local_; }
  const optim::Optimizer& local_optimizer() const { return *local_; }
  std::vector<optim::ParamGroup>& param_groups() { return local_->param_groups(); }
  void set_lr(double lr);

  const std::vector<Tensor>& parameters() const { return params_; }
  // This rank's slice of each flat group (the local optimizer's parameters).
  std::vector<Tensor> shards() const;
  int64_t owned_numel() const;  // elements this rank updates (padding included)
  int64_t total_numel() const;  // elements of all parameters (no padding)
  const Group& group() const { return group_; }

  // Per rank (see above).
  ZeroStateDict state_dict() const;
  void load_state_dict(const ZeroStateDict& dict);

 private:
  struct FlatGroup;
  std::vector<Tensor> params_;
  Group group_;
  std::vector<std::unique_ptr<FlatGroup>> flats_;
  std::unique_ptr<optim::Optimizer> local_;
};

}  // namespace kiln::distributed

namespace kiln::optim {
using distributed::ZeroRedundancyOptimizer;
}  // namespace kiln::optim
