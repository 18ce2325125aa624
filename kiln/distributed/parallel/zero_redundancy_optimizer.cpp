#include "kiln/distributed/parallel/zero_redundancy_optimizer.h"

#include <algorithm>
#include <unordered_set>

#include "kiln/core/autograd.h"
#include "kiln/core/error.h"

namespace kiln::distributed {

// The parameters of one dtype and device, flattened in order and padded to world_size slices.
struct ZeroRedundancyOptimizer::FlatGroup {
  std::vector<size_t> members;   // indices into params_
  std::vector<int64_t> offsets;  // of each member in the flat buffers
  int64_t numel = 0;             // without padding
  int64_t shard_numel = 0;       // padded numel / world_size
  int64_t begin = 0;             // this rank's first element
  Tensor flat_param, flat_grad;  // padded, full size
  Tensor shard;                  // this rank's elements: the local optimizer's parameter
  Tensor shard_grad;
};

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<Tensor> params, LocalOptimizerFactory make_local_optimizer,
                                                 Group group)
    : group_(group ? std::move(group) : default_group()) {
  KILN_CHECK(make_local_optimizer != nullptr, "ZeroRedundancyOptimizer: no local optimizer factory");
  // Frozen parameters stay out of the flat buffers: a missing gradient there would count as
  // zeros and weight decay would still move them.
  for (Tensor& p : params) {
    if (p.defined() && p.requires_grad()) params_.push_back(std::move(p));
  }
  KILN_CHECK(!params_.empty(), "ZeroRedundancyOptimizer: no parameters that require grad");
  std::unordered_set<const TensorImpl*> seen;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    KILN_CHECK(p.defined() && p.is_floating_point(), "ZeroRedundancyOptimizer: parameter ", i,
               " is not a floating-point tensor");
    KILN_CHECK(seen.insert(p.impl()).second, "ZeroRedundancyOptimizer: parameter ", i, " appears twice in the list");
  }
  const int world = group_->size();
  const int rank = group_->rank();
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    FlatGroup* fg = nullptr;
    for (auto& f : flats_) {
      const Tensor& first = params_[f->members.front()];
      if (first.dtype() == p.dtype() && first.device() == p.device()) fg = f.get();
    }
    if (!fg) {
      flats_.push_back(std::make_unique<FlatGroup>());
      fg = flats_.back().get();
    }
    fg->members.push_back(i);
    fg->offsets.push_back(fg->numel);
    fg->numel += p.numel();
  }
  std::vector<Tensor> shards;
  for (auto& fg : flats_) {
    const Tensor& first = params_[fg->members.front()];
    const TensorOptions opts = TensorOptions().dtype(first.dtype()).device(first.device());
    fg->shard_numel = (fg->numel + world - 1) / world;
    fg->begin = rank * fg->shard_numel;
    fg->flat_param = zeros({fg->shard_numel * world}, opts);
    fg->flat_grad = zeros({fg->shard_numel * world}, opts);
    fg->shard = zeros({fg->shard_numel}, opts);
    fg->shard.requires_grad_(true);
    fg->shard_grad = zeros({fg->shard_numel}, opts);
    shards.push_back(fg->shard);
  }
  local_ = make_local_optimizer(shards);
  KILN_CHECK(local_ != nullptr, "ZeroRedundancyOptimizer: the factory returned no optimizer");
}

ZeroRedundancyOptimizer::~ZeroRedundancyOptimizer() = default;

void ZeroRedundancyOptimizer::step() {
  NoGradGuard no_grad;
  // 1-2. Pack the gradients and average each slice onto its owner.
  std::vector<std::shared_ptr<Work>> works;
  for (auto& fg : flats_) {
    for (size_t k = 0; k < fg->members.size(); ++k) {
      const Tensor& p = params_[fg->members[k]];
      Tensor dst = fg->flat_grad.narrow(0, fg->offsets[k], p.numel());
      const Tensor& g = p.grad();
      if (g.defined()) {
        dst.view(p.sizes()).copy_(g);
      } else {
        dst.zero_();
      }
    }
    works.push_back(group_->reduce_scatter_tensor(fg->shard_grad, fg->flat_grad, ReduceOp::Avg));
  }
  // 3. Meanwhile read the owned elements from the parameters (they may have been loaded or
  // changed since the last step), then update them.
  for (auto& fg : flats_) {
    const int64_t lo = fg->begin, hi = fg->begin + fg->shard_numel;
    for (size_t k = 0; k < fg->members.size(); ++k) {
      const Tensor& p = params_[fg->members[k]];
      const int64_t off = fg->offsets[k];
      const int64_t a = std::max(lo, off), b = std::min(hi, off + p.numel());
      if (a >= b) continue;
      fg->shard.narrow(0, a - lo, b - a).copy_(p.reshape({-1}).narrow(0, a - off, b - a));
    }
  }
  for (auto& w : works) w->wait();
  works.clear();
  for (auto& fg : flats_) fg->shard.set_grad(fg->shard_grad);
  local_->step();

  // 4. Every rank gets every slice back, and the parameters are copied from the full buffer.
  for (auto& fg : flats_) works.push_back(group_->all_gather_into_tensor(fg->flat_param, fg->shard));
  for (size_t f = 0; f < flats_.size(); ++f) {
    works[f]->wait();
    FlatGroup& fg = *flats_[f];
    for (size_t k = 0; k < fg.members.size(); ++k) {
      Tensor p = params_[fg.members[k]];
      p.copy_(fg.flat_param.narrow(0, fg.offsets[k], p.numel()).view(p.sizes()));
    }
  }
}

void ZeroRedundancyOptimizer::zero_grad(bool set_to_none) {
  NoGradGuard no_grad;
  for (Tensor& p : params_) optim::detail::zero_grad(p, set_to_none);
}

void ZeroRedundancyOptimizer::set_lr(double lr) {
  for (auto& g : local_->param_groups()) g.set_lr(lr);
}

std::vector<Tensor> ZeroRedundancyOptimizer::shards() const {
  std::vector<Tensor> out;
  for (const auto& fg : flats_) out.push_back(fg->shard);
  return out;
}

int64_t ZeroRedundancyOptimizer::owned_numel() const {
  int64_t n = 0;
  for (const auto& fg : flats_) n += fg->shard_numel;
  return n;
}

int64_t ZeroRedundancyOptimizer::total_numel() const {
  int64_t n = 0;
  for (const auto& fg : flats_) n += fg->numel;
  return n;
}

ZeroStateDict ZeroRedundancyOptimizer::state_dict() const {
  ZeroStateDict d;
  d.rank = group_->rank();
  d.world_size = group_->size();
  for (const auto& fg : flats_) d.shard_numels.push_back(fg->shard_numel);
  d.local = local_->state_dict();
  return d;
}

void ZeroRedundancyOptimizer::load_state_dict(const ZeroStateDict& dict) {
  std::vector<int64_t> mine;
  for (const auto& fg : flats_) mine.push_back(fg->shard_numel);
  KILN_CHECK(dict.rank == group_->rank() && dict.world_size == group_->size(),
             "ZeroRedundancyOptimizer::load_state_dict: the state was saved by rank ", dict.rank, " of ",
             dict.world_size, ", but this is rank ", group_->rank(), " of ", group_->size(),
             "; the state is per rank, load each rank's own file in a job of the same size");
  KILN_CHECK(dict.shard_numels == mine,
             "ZeroRedundancyOptimizer::load_state_dict: the saved "
             "slices have ",
             dict.shard_numels, " elements, this optimizer's have ", mine, " (different parameters)");
  local_->load_state_dict(dict.local);
}

}  // namespace kiln::distributed
