#include "kiln/distributed/parallel/reducer.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <tuple>

#include "kiln/core/autograd.h"
#include "kiln/core/error.h"
#include "kiln/distributed/backends/work.h"

namespace kiln::distributed {

struct Reducer::State : std::enable_shared_from_this<Reducer::State> {
  struct Param {
    std::string name;
    Tensor tensor;
    size_t bucket = 0;
    Tensor slot;            // the parameter's gradient slot in its bucket, shaped as the parameter
    bool returned = false;  // this backward: the average was copied into .grad on completion
  };
  struct Bucket {
    Tensor flat;
    std::vector<size_t> params;
    size_t pending = 0;  // slots not ready in this backward
    std::shared_ptr<Work> work;
    std::vector<size_t> filled_from_grad;  // this backward: slots copied from a defined .grad
  };

  std::vector<Param> params;
  std::vector<Bucket> buckets;
  std::shared_ptr<ProcessGroup> group;
  ReducerConfig config;

  bool sync = true;
  bool callback_queued = false;  // a backward is running that has touched our parameters
  std::vector<char> ready;       // in this backward
  std::vector<char> used;        // since the last reduction (no_sync backwards included)
  size_t next_launch = 0;
  bool recording = true;  // the first backward records the order gradients arrive in
  std::vector<size_t> observed;
  bool rebuilt = false;
  std::string error;  // sticky: set when a backward could not be reduced

  std::vector<std::vector<size_t>> plan_buckets(const std::vector<size_t>& order) const;
  void build_buckets(const std::vector<std::vector<size_t>>& groups);
  void on_grad_ready(size_t i, Tensor& param);
  void fill_slot(size_t i, bool has_contribution);
  void launch_ready_buckets();
  void return_averages_on_completion(Bucket& b);
  void finalize();
  void rebuild_in_observed_order();
  void reset_iteration();
  Device meta_device() const;
};

namespace {

std::string device_key(const Tensor& t) { return t.device().str(); }

}  // namespace

// Small bookkeeping tensors (orders, used flags) must live where the backend moves bytes.
Device Reducer::State::meta_device() const {
  if (group->backend_name() == "nccl" && !params.empty()) return params.front().tensor.device();
  return Device::cpu();
}

std::vector<std::vector<size_t>> Reducer::State::plan_buckets(const std::vector<size_t>& order) const {
  // Greedy packing in `order`, one open bucket per (dtype, device); the first bucket of each
  // kind is small so that the first all-reduce starts early in backward.
  struct Open {
    std::vector<size_t> members;
    int64_t bytes = 0;
    int closed = 0;
  };
  std::map<std::pair<DType, std::string>, Open> open;
  std::vector<std::vector<size_t>> groups;
  for (size_t i : order) {
    const Tensor& p = params[i].tensor;
    Open& o = open[{p.dtype(), device_key(p)}];
    o.members.push_back(i);
    o.bytes += static_cast<int64_t>(p.nbytes());
    const int64_t limit = o.closed == 0 ? config.first_bucket_bytes : config.bucket_bytes;
    if (o.bytes >= limit) {
      groups.push_back(std::move(o.members));
      o.members.clear();
      o.bytes = 0;
      ++o.closed;
    }
  }
  for (auto& [key, o] : open) {
    if (!o.members.empty()) groups.push_back(std::move(o.members));
  }
  // Launch order follows the order the buckets' first gradients are expected in.
  std::vector<size_t> position(params.size());
  for (size_t k = 0; k < order.size(); ++k) position[order[k]] = k;
  std::stable_sort(groups.begin(), groups.end(),
                   [&](const auto& a, const auto& b) { return position[a.front()] < position[b.front()]; });
  return groups;
}

void Reducer::State::build_buckets(const std::vector<std::vector<size_t>>& groups) {
  NoGradGuard no_grad;
  std::vector<Bucket> fresh(groups.size());
  for (size_t b = 0; b < groups.size(); ++b) {
    int64_t total = 0;
    for (size_t i : groups[b]) total += params[i].tensor.numel();
    const Tensor& first = params[groups[b].front()].tensor;
    fresh[b].flat = zeros({total}, TensorOptions().dtype(first.dtype()).device(first.device()));
    fresh[b].params = groups[b];
    int64_t offset = 0;
    for (size_t i : groups[b]) {
      Param& p = params[i];
      Tensor slot = fresh[b].flat.narrow(0, offset, p.tensor.numel()).view(p.tensor.sizes());
      offset += p.tensor.numel();
      // A gradient that already lives in the old bucket moves to the new one with its value.
      if (config.gradient_as_bucket_view && p.tensor.grad().defined()) {
        slot.copy_(p.tensor.grad());
        p.tensor.set_grad(slot);
      }
      p.slot = slot;
      p.bucket = b;
    }
  }
  buckets = std::move(fresh);
  reset_iteration();
}

void Reducer::State::reset_iteration() {
  std::fill(ready.begin(), ready.end(), 0);
  for (Param& p : params) p.returned = false;
  for (Bucket& b : buckets) {
    b.pending = b.params.size();
    b.work.reset();
    b.filled_from_grad.clear();
  }
  next_launch = 0;
}

void Reducer::State::on_grad_ready(size_t i, Tensor& param) {
  NoGradGuard no_grad;
  if (recording && std::find(observed.begin(), observed.end(), i) == observed.end()) observed.push_back(i);
  used[i] = 1;
  if (!callback_queued) {
    callback_queued = true;
    std::weak_ptr<State> weak = weak_from_this();
    autograd::queue_callback([weak] {
      if (auto s = weak.lock()) s->finalize();
    });
  }
  Param& p = params[i];
  if (!sync) {
    // Local accumulation. With bucket views the gradient is kept in its slot, so the next
    // synchronised backward accumulates there too.
    if (config.gradient_as_bucket_view && !param.grad().is_same(p.slot)) {
      p.slot.copy_(param.grad());
      param.set_grad(p.slot);
    }
    return;
  }
  KILN_CHECK(!ready[i], "DistributedDataParallel: parameter '", p.name,
             "' received its gradient twice in one backward pass; a parameter can take part in "
             "one reduction per backward");
  fill_slot(i, true);
  launch_ready_buckets();
}

// Puts parameter i's contribution into its slot (its gradient, or zeros) and marks it ready.
void Reducer::State::fill_slot(size_t i, bool has_contribution) {
  Param& p = params[i];
  Tensor g = p.tensor.grad();
  if (has_contribution && g.defined()) {
    if (config.gradient_as_bucket_view) {
      if (!g.is_same(p.slot)) {
        p.slot.copy_(g);
        p.tensor.set_grad(p.slot);
      }
    } else {
      p.slot.copy_(g);
      buckets[p.bucket].filled_from_grad.push_back(i);
    }
  } else {
    p.slot.zero_();
  }
  ready[i] = 1;
  --buckets[p.bucket].pending;
}

// Without bucket views the averages must be copied back into .grad. On the CPU the backend's
// worker does it as soon as the bucket's all-reduce ends, while backward still runs, instead of
// the end-of-backward callback doing all of them at once (docs/data_parallel.md, "DDP"). The
// gradients it writes are final for this backward (their hooks ran) and nothing reads them
// before finalize() has waited on the work. CUDA buckets are copied in finalize() on the
// compute stream.
void Reducer::State::return_averages_on_completion(Bucket& b) {
  if (config.gradient_as_bucket_view || !b.flat.device().is_cpu() || b.filled_from_grad.empty()) return;
  std::vector<std::pair<Tensor, Tensor>> copies;  // (.grad, its slot)
  for (size_t i : b.filled_from_grad) {
    copies.emplace_back(params[i].tensor.grad(), params[i].slot);
    params[i].returned = true;
  }
  b.work->then([copies = std::move(copies)] {
    NoGradGuard no_grad;
    for (const auto& [grad, slot] : copies) {
      Tensor destination = grad;
      destination.copy_(slot);
    }
  });
}

void Reducer::State::launch_ready_buckets() {
  // Strictly in bucket order: a bucket that is complete waits for every earlier one.
  while (next_launch < buckets.size() && buckets[next_launch].pending == 0) {
    Bucket& b = buckets[next_launch];
    b.work = group->all_reduce({b.flat}, ReduceOp::Avg);
    return_averages_on_completion(b);
    ++next_launch;
  }
}

void Reducer::State::finalize() {
  NoGradGuard no_grad;
  callback_queued = false;
  recording = false;
  if (!sync) return;

  std::vector<size_t> missing;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!ready[i]) missing.push_back(i);
  }
  if (!missing.empty() && !config.find_unused_parameters) {
    std::ostringstream os;
    os << "DistributedDataParallel: " << missing.size() << " parameter" << (missing.size() == 1 ? "" : "s")
       << " received no gradient in this backward pass (";
    for (size_t k = 0; k < missing.size(); ++k) os << (k ? ", " : "") << "'" << params[missing[k]].name << "'";
    os << "), so the buckets holding them cannot be reduced. If some parameters take no part "
          "in the loss, pass DistributedDataParallelOptions().find_unused_parameters(true); "
          "otherwise make every parameter contribute to the loss on every rank";
    error = os.str();
    reset_iteration();
    KILN_FAIL(error);
  }
  // find_unused_parameters: what did not arrive contributes what it accumulated under no_sync,
  // or zeros; the remaining buckets go out in order.
  for (size_t i : missing) fill_slot(i, used[i] != 0);
  launch_ready_buckets();

  // Which parameters got a gradient on any rank: one that none used keeps no gradient, as in
  // a single process (an optimizer then skips it instead of decaying it).
  Tensor used_map;
  std::shared_ptr<Work> used_work;
  if (config.find_unused_parameters) {
    std::vector<float> flags(used.begin(), used.end());
    used_map = tensor(flags, TensorOptions().dtype(DType::F32).device(meta_device()));
    used_work = group->all_reduce({used_map}, ReduceOp::Sum);
  }
  for (size_t k = 0; k < buckets.size(); ++k) {
    try {
      buckets[k].work->wait();
    } catch (const std::exception& e) {
      // Sticky: the ranks' gradients now disagree, training must not go on.
      error = detail::concat("DistributedDataParallel: the all-reduce of gradient bucket ", k, " of ", buckets.size(),
                             " failed: ", e.what(),
                             ". If another rank stopped with an error about parameters that received no gradient, "
                             "pass find_unused_parameters(true)");
      reset_iteration();
      KILN_FAIL(error);
    }
  }
  std::vector<float> globally_used(params.size(), 1.0f);
  if (used_work) {
    used_work->wait();
    Tensor host = used_map.cpu();
    std::copy(host.data_ptr<float>(), host.data_ptr<float>() + host.numel(), globally_used.begin());
  }

  for (size_t i = 0; i < params.size(); ++i) {
    if (globally_used[i] == 0.0f || params[i].returned) continue;
    Param& p = params[i];
    const Tensor& g = p.tensor.grad();
    if (config.gradient_as_bucket_view) {
      if (!g.is_same(p.slot)) p.tensor.set_grad(p.slot);
    } else if (g.defined()) {
      p.tensor.mutable_grad().copy_(p.slot);
    } else {
      p.tensor.set_grad(p.slot.clone());
    }
  }
  std::fill(used.begin(), used.end(), 0);
  reset_iteration();
  if (!rebuilt) rebuild_in_observed_order();
}

void Reducer::State::rebuild_in_observed_order() {
  rebuilt = true;
  // Rank 0's order for everyone; parameters never seen follow in reverse registration order.
  std::vector<int64_t> order;
  std::vector<char> seen(params.size(), 0);
  for (size_t i : observed) {
    order.push_back(static_cast<int64_t>(i));
    seen[i] = 1;
  }
  for (size_t k = params.size(); k-- > 0;) {
    if (!seen[k]) order.push_back(static_cast<int64_t>(k));
  }
  Tensor t = tensor(order, TensorOptions().dtype(DType::I64).device(meta_device()));
  group->broadcast({t}, 0)->wait();
  Tensor host = t.cpu();
  std::vector<size_t> chosen(params.size());
  for (size_t k = 0; k < params.size(); ++k) chosen[k] = static_cast<size_t>(host.data_ptr<int64_t>()[k]);

  std::vector<std::vector<size_t>> groups = plan_buckets(chosen);
  std::vector<std::vector<size_t>> current;
  for (const Bucket& b : buckets) current.push_back(b.params);
  if (groups != current) build_buckets(groups);
}

// ---------------------------------------------------------------- Reducer

Reducer::Reducer(std::vector<std::pair<std::string, Tensor>> params, std::shared_ptr<ProcessGroup> group,
                 const ReducerConfig& config)
    : state_(std::make_shared<State>()) {
  KILN_CHECK(group != nullptr, "Reducer: no process group");
  KILN_CHECK(config.bucket_bytes > 0 && config.first_bucket_bytes > 0,
             "DistributedDataParallel: bucket sizes must be positive, got first bucket ", config.first_bucket_bytes,
             " bytes, bucket cap ", config.bucket_bytes, " bytes");
  State& s = *state_;
  s.group = std::move(group);
  s.config = config;
  for (auto& [name, t] : params) {
    KILN_CHECK(t.requires_grad() && t.is_leaf(), "DistributedDataParallel: parameter '", name,
               "' must be a leaf that requires grad");
    State::Param p;
    p.name = name;
    p.tensor = t;
    s.params.push_back(std::move(p));
  }
  s.ready.assign(s.params.size(), 0);
  s.used.assign(s.params.size(), 0);
  std::vector<size_t> reverse;
  for (size_t k = s.params.size(); k-- > 0;) reverse.push_back(k);
  s.build_buckets(s.plan_buckets(reverse));

  std::weak_ptr<State> weak = state_;
  for (size_t i = 0; i < s.params.size(); ++i) {
    s.params[i].tensor.register_post_accumulate_grad_hook([weak, i](Tensor& param) {
      if (auto st = weak.lock()) st->on_grad_ready(i, param);
    });
  }
}

Reducer::~Reducer() = default;

void Reducer::prepare_for_forward() {
  State& s = *state_;
  if (!s.error.empty()) KILN_FAIL(s.error);
  if (s.callback_queued) {
    // The previous backward stopped before its end (it threw): its reduction never finished.
    s.error =
        "DistributedDataParallel: the previous backward pass did not finish, so its "
        "gradient reduction is incomplete and the ranks may disagree; this model cannot "
        "train on";
    KILN_FAIL(s.error);
  }
}

void Reducer::set_sync(bool sync) { state_->sync = sync; }
bool Reducer::sync() const { return state_->sync; }

std::vector<std::vector<size_t>> Reducer::bucket_indices() const {
  std::vector<std::vector<size_t>> out;
  for (const auto& b : state_->buckets) out.push_back(b.params);
  return out;
}

bool Reducer::buckets_rebuilt() const { return state_->rebuilt; }

}  // namespace kiln::distributed
