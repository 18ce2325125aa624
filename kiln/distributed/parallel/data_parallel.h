#pragma once
// DistributedDataParallel: data parallelism across processes (torch.nn.parallel.DDP's shape;
// docs/data_parallel.md).
// Every rank holds a full replica of the model and feeds it its own part of the batch; backward
// averages the gradients across ranks while it runs (kiln/distributed/parallel/reducer.h), so after
// loss.backward() every rank holds the same gradients and an ordinary optimizer keeps the
// replicas identical.
//
//   kiln::distributed::init_process_group();
//   auto model = std::make_shared<Net>();
//   kiln::distributed::DistributedDataParallel ddp(model);
//   kiln::optim::AdamW opt(ddp.parameters(), kiln::optim::AdamWOptions(3e-4));
//   for (...) {
//     auto loss = kiln::cross_entropy(ddp.forward(x), y);   // x, y: this rank's shard
//     opt.zero_grad();
//     loss.backward();          // all-reduces overlap backward; averaged when it returns
//     opt.step();
//   }
//
//   // gradient accumulation: no collectives for the first micro-batches
//   { auto guard = ddp.no_sync(); (loss_a / 2).backward(); }
//   (loss_b / 2).backward();   // reduces the accumulated gradients
//
// Construction checks that every rank has the same parameters (count, shapes, dtypes; an Error
// names the first that differs and the ranks) and copies rank 0's parameters and buffers to the
// others. With broadcast_buffers, each forward first copies rank 0's buffers (BatchNorm's
// running statistics) to every rank. The DDP object is a Module whose only child, "module", is
// the model, so parameters() and state_dict() ("module.fc.weight") reach the model.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/core/arg.h"
#include "kiln/core/tensor.h"
#include "kiln/distributed/distributed.h"
#include "kiln/distributed/parallel/reducer.h"
#include "kiln/nn/module.h"

namespace kiln::distributed {

struct DistributedDataParallelOptions {
  // Cap of each gradient bucket (one all-reduce each); the first bucket holds 1 MiB so the first
  // collective starts as early as possible in backward.
  KILN_ARG(double, bucket_cap_mb) = 25.0;
  KILN_ARG(double, first_bucket_mb) = 1.0;
  // Parameters may take no part in some backward passes (branches, frozen heads): the reducer
  // then contributes zeros for them at the end of backward and leaves the gradient of one no
  // rank used undefined. Off: such a parameter is an Error naming it (never a hang).
  KILN_ARG(bool, find_unused_parameters) = false;
  // Each .grad becomes a view into its bucket: no copy into the bucket and none back, and the
  // gradients take no memory of their own. zero_grad(set_to_none) is fine (the next backward
  // re-attaches the view).
  KILN_ARG(bool, gradient_as_bucket_view) = false;
  KILN_ARG(bool, broadcast_buffers) = true;
};

class DistributedDataParallel : public nn::Module {
 public:
  explicit DistributedDataParallel(std::shared_ptr<nn::Module> model,
                                   const DistributedDataParallelOptions& options = {}, Group group = nullptr);

  // The model's forward (after the buffer broadcast).
  Tensor forward(const Tensor& input) override;
  // For models whose forward takes other arguments: DDP's work before a forward, then fn(model):
  //   ddp.forward_with([&](nn::Module& m) { return static_cast<Net&>(m).forward(a, b); });
  template <class Fn> auto forward_with(Fn&& fn) {
    before_forward();
    return fn(*module_);
  }
  // What forward() does first: rethrows a failed reduction, broadcasts rank 0's buffers.
  void before_forward();
  nn::Module& module() { return *module_; }
  const std::shared_ptr<nn::Module>& module_ptr() const { return module_; }
  const Group& group() const { return group_; }
  const DistributedDataParallelOptions& options() const { return options_; }

  // RAII: while alive, backward accumulates gradients locally and issues no collective (and
  // forward broadcasts no buffers); the first backward after it reduces the sum.
  class [[nodiscard]] NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& ddp);
    ~NoSyncGuard();
    NoSyncGuard(NoSyncGuard&& other) noexcept;
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(NoSyncGuard&&) = delete;

   private:
    DistributedDataParallel* ddp_;
    bool previous_;
  };
  NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  // The gradient buckets as indices into named_parameters() of the model restricted to the
  // parameters that require grad (launch order), and whether they were rebuilt in the observed
  // order yet - for tests and logs.
  std::vector<std::vector<size_t>> bucket_indices() const { return reducer_->bucket_indices(); }
  bool buckets_rebuilt() const { return reducer_->buckets_rebuilt(); }

 private:
  void check_same_parameters_on_all_ranks();
  void broadcast_from_rank0(const std::vector<Tensor>& tensors);

  std::shared_ptr<nn::Module> module_;
  DistributedDataParallelOptions options_;
  Group group_;
  std::unique_ptr<Reducer> reducer_;
};

}  // namespace kiln::distributed
