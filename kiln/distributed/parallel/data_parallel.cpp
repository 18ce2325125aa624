#include "kiln/distributed/parallel/data_parallel.h"

#include <algorithm>
#include <sstream>

#include "kiln/core/autograd.h"
#include "kiln/core/error.h"

namespace kiln::distributed {

namespace {

// Small bookkeeping tensors must live where the backend moves bytes.
Device meta_device(const ProcessGroup& group, const std::vector<Tensor>& tensors) {
  if (group.backend_name() == "nccl" && !tensors.empty()) return tensors.front().device();
  return Device::cpu();
}

std::string describe_row(const int64_t* row) {
  std::ostringstream os;
  os << dtype_name(static_cast<DType>(row[0])) << " [";
  for (int64_t d = 0; d < row[2]; ++d) os << (d ? ", " : "") << row[3 + d];
  os << "]" << (row[1] == 1 ? " requires_grad" : "");
  return os.str();
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> model,
                                                 const DistributedDataParallelOptions& options, Group group)
    : nn::Module("DistributedDataParallel"),
      module_(std::move(model)),
      options_(options),
      group_(group ? std::move(group) : default_group()) {
  KILN_CHECK(module_ != nullptr, "DistributedDataParallel: the model is null");
  KILN_CHECK(options_.bucket_cap_mb() > 0 && options_.first_bucket_mb() > 0,
             "DistributedDataParallel: bucket_cap_mb and first_bucket_mb must be positive, got ",
             options_.bucket_cap_mb(), " and ", options_.first_bucket_mb());
  register_module("module", module_);

  check_same_parameters_on_all_ranks();
  {
    std::vector<Tensor> all = module_->parameters();
    for (const Tensor& b : module_->buffers()) all.push_back(b);
    broadcast_from_rank0(all);
  }

  std::vector<std::pair<std::string, Tensor>> trainable;
  for (auto& [name, p] : module_->named_parameters()) {
    if (p.requires_grad()) trainable.emplace_back(name, p);
  }
  ReducerConfig config;
  config.bucket_bytes = static_cast<int64_t>(options_.bucket_cap_mb() * 1024 * 1024);
  config.first_bucket_bytes = static_cast<int64_t>(options_.first_bucket_mb() * 1024 * 1024);
  config.bucket_bytes = std::max<int64_t>(config.bucket_bytes, 1);
  config.first_bucket_bytes = std::max<int64_t>(config.first_bucket_bytes, 1);
  config.find_unused_parameters = options_.find_unused_parameters();
  config.gradient_as_bucket_view = options_.gradient_as_bucket_view();
  reducer_ = std::make_unique<Reducer>(std::move(trainable), group_, config);
}

// Every rank all-gathers a fingerprint of its parameters and buffers (count, then dtype,
// requires_grad and sizes of each), so a rank built with another model fails here with a
// readable Error instead of all-reducing mismatched buckets later.
void DistributedDataParallel::check_same_parameters_on_all_ranks() {
  const auto named_params = module_->named_parameters();
  const auto named_buffers = module_->named_buffers();
  std::vector<std::pair<std::string, Tensor>> items = named_params;
  items.insert(items.end(), named_buffers.begin(), named_buffers.end());
  const int world = group_->size();
  const int me = group_->rank();
  std::vector<Tensor> tensors;
  for (auto& it : items) tensors.push_back(it.second);
  const Device dev = meta_device(*group_, tensors);
  const TensorOptions i64 = TensorOptions().dtype(DType::I64).device(dev);

  int64_t max_dim = 0;
  for (const Tensor& t : tensors) max_dim = std::max(max_dim, t.dim());
  std::vector<int64_t> counts = {static_cast<int64_t>(named_params.size()), static_cast<int64_t>(named_buffers.size()),
                                 max_dim};
  Tensor mine = tensor(counts, i64);
  Tensor gathered = zeros({3 * world}, i64);
  group_->all_gather_into_tensor(gathered, mine)->wait();
  Tensor host = gathered.cpu();
  const int64_t* c = host.data_ptr<int64_t>();
  for (int r = 1; r < world; ++r) {
    if (c[3 * r] != c[0] || c[3 * r + 1] != c[1]) {
      std::ostringstream os;
      os << "DistributedDataParallel: the ranks' models differ: ";
      for (int q = 0; q < world; ++q)
        os << (q ? ", " : "") << "rank " << q << " has " << c[3 * q] << " parameters and " << c[3 * q + 1]
           << " buffers";
      KILN_FAIL(os.str());
    }
    max_dim = std::max(max_dim, c[3 * r + 2]);
  }

  const int64_t width = 3 + max_dim;
  const int64_t rows = static_cast<int64_t>(items.size());
  std::vector<int64_t> desc(static_cast<size_t>(rows * width), -1);
  for (int64_t i = 0; i < rows; ++i) {
    const Tensor& t = tensors[static_cast<size_t>(i)];
    int64_t* row = desc.data() + i * width;
    row[0] = static_cast<int64_t>(t.dtype());
    row[1] = i < static_cast<int64_t>(named_params.size()) ? (t.requires_grad() ? 1 : 0) : 2;
    row[2] = t.dim();
    for (int64_t d = 0; d < t.dim(); ++d) row[3 + d] = t.size(d);
  }
  if (rows == 0) return;
  Tensor all = zeros({world * rows * width}, i64);
  group_->all_gather_into_tensor(all, tensor(desc, i64))->wait();
  Tensor all_host = all.cpu();
  const int64_t* a = all_host.data_ptr<int64_t>();
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t* ref = a + i * width;
    std::vector<int> differing;
    for (int r = 1; r < world; ++r) {
      const int64_t* row = a + (r * rows + i) * width;
      if (!std::equal(row, row + width, ref)) differing.push_back(r);
    }
    if (differing.empty()) continue;
    const bool is_param = i < static_cast<int64_t>(named_params.size());
    std::ostringstream os;
    os << "DistributedDataParallel: " << (is_param ? "parameter " : "buffer ")
       << (is_param ? i : i - static_cast<int64_t>(named_params.size())) << " ('" << items[static_cast<size_t>(i)].first
       << "' on rank " << me << ") differs across ranks: rank 0 has " << describe_row(ref);
    for (int r : differing) os << ", rank " << r << " has " << describe_row(a + (r * rows + i) * width);
    os << "; every rank must build the same model";
    KILN_FAIL(os.str());
  }
}

void DistributedDataParallel::broadcast_from_rank0(const std::vector<Tensor>& tensors) {
  if (tensors.empty() || group_->size() == 1) return;
  NoGradGuard no_grad;
  std::vector<Tensor> dense;
  for (const Tensor& t : tensors) dense.push_back(t.is_contiguous() ? t : t.contiguous());
  // One coalesced broadcast per dtype (a list must share one), in first-appearance order so
  // every rank issues the same calls.
  std::vector<std::vector<Tensor>> by_dtype;
  for (const Tensor& t : dense) {
    auto same = std::find_if(by_dtype.begin(), by_dtype.end(), [&](const std::vector<Tensor>& g) {
      return g.front().dtype() == t.dtype() && g.front().device() == t.device();
    });
    if (same == by_dtype.end()) {
      by_dtype.push_back({t});
    } else {
      same->push_back(t);
    }
  }
  std::vector<std::shared_ptr<Work>> works;
  for (auto& g : by_dtype) works.push_back(group_->broadcast(g, 0));
  for (auto& w : works) w->wait();
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!dense[i].is_same(tensors[i])) {
      Tensor t = tensors[i];
      t.copy_(dense[i]);
    }
  }
}

void DistributedDataParallel::before_forward() {
  reducer_->prepare_for_forward();
  // Only forwards that will be reduced broadcast: a rank may evaluate alone under NoGradGuard.
  if (options_.broadcast_buffers() && reducer_->sync() && GradMode::is_enabled())
    broadcast_from_rank0(module_->buffers());
}

Tensor DistributedDataParallel::forward(const Tensor& input) {
  before_forward();
  return module_->forward(input);
}

DistributedDataParallel::NoSyncGuard::NoSyncGuard(DistributedDataParallel& ddp)
    : ddp_(&ddp), previous_(ddp.reducer_->sync()) {
  ddp.reducer_->set_sync(false);
}

DistributedDataParallel::NoSyncGuard::~NoSyncGuard() {
  if (ddp_) ddp_->reducer_->set_sync(previous_);
}

DistributedDataParallel::NoSyncGuard::NoSyncGuard(NoSyncGuard&& other) noexcept
    : ddp_(other.ddp_), previous_(other.previous_) {
  other.ddp_ = nullptr;
}

}  // namespace kiln::distributed
