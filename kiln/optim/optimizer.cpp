#include "kiln/optim/optimizer.h"

#include <algorithm>
#include <numeric>
#include <unordered_set>

#include "kiln/core/autograd.h"
#include "kiln/core/error.h"
#include "kiln/kernels/multi_tensor.h"

namespace kiln::optim {

// ---------------------------------------------------------------- options in a state_dict

namespace detail {

void put_option(std::map<std::string, double>& values, const char* key, double value) { values[key] = value; }
void put_option(std::map<std::string, double>& values, const char* key, bool value) { values[key] = value ? 1.0 : 0.0; }
void put_option(std::map<std::string, double>& values, const char* /*key*/, const Betas& value) {
  values["beta1"] = std::get<0>(value);
  values["beta2"] = std::get<1>(value);
}

void get_option(const char* optimizer, const std::map<std::string, double>& values, const char* key, double& value) {
  auto it = values.find(key);
  KILN_CHECK(it != values.end(), optimizer, "::load_state_dict: parameter group option '", key, "' is missing");
  value = it->second;
}
void get_option(const char* optimizer, const std::map<std::string, double>& values, const char* key, bool& value) {
  double number = 0;
  get_option(optimizer, values, key, number);
  value = number != 0.0;
}
void get_option(const char* optimizer, const std::map<std::string, double>& values, const char* /*key*/, Betas& value) {
  get_option(optimizer, values, "beta1", std::get<0>(value));
  get_option(optimizer, values, "beta2", std::get<1>(value));
}

}  // namespace detail

// ---------------------------------------------------------------- ParamGroup

ParamGroup::ParamGroup(std::vector<Tensor> params) : params_(std::move(params)) {}
ParamGroup::ParamGroup(std::vector<Tensor> params, const OptimizerOptions& options)
    : params_(std::move(params)), options_(options.clone()) {}
ParamGroup::ParamGroup(const ParamGroup& o)
    : params_(o.params_), options_(o.options_ ? o.options_->clone() : nullptr) {}
ParamGroup& ParamGroup::operator=(const ParamGroup& o) {
  if (this != &o) {
    params_ = o.params_;
    options_ = o.options_ ? o.options_->clone() : nullptr;
    lr_tensor_ = Tensor();
  }
  return *this;
}

OptimizerOptions& ParamGroup::options() {
  KILN_CHECK(options_, "ParamGroup: this group has no options yet (add it to an optimizer first)");
  return *options_;
}
const OptimizerOptions& ParamGroup::options() const {
  KILN_CHECK(options_, "ParamGroup: this group has no options yet (add it to an optimizer first)");
  return *options_;
}

void ParamGroup::set_lr(double lr) {
  KILN_CHECK(lr >= 0.0, "ParamGroup::set_lr: invalid learning rate ", lr, " (must be >= 0)");
  options().set_lr(lr);
  // Refresh the device copy now, outside any captured step: a CUDA graph replays the step's
  // kernels, which read the lr from this tensor, but never re-runs lr_tensor()'s host-side check.
  if (lr_tensor_.defined() && lr_tensor_value_ != lr) {
    lr_tensor_.fill_(lr);
    lr_tensor_value_ = lr;
  }
}

void ParamGroup::set_momentum(double momentum) {
  options().set_momentum(momentum);
  options().validate();
}

const Tensor& ParamGroup::lr_tensor() {
  const double lr = options().get_lr();
  Device dev = params_.empty() ? Device::cpu() : params_.front().device();
  if (!lr_tensor_.defined() || lr_tensor_.device() != dev) {
    lr_tensor_ = full({}, lr, TensorOptions(DType::F64).device(dev));
    lr_tensor_value_ = lr;
  } else if (lr_tensor_value_ != lr) {
    lr_tensor_.fill_(lr);  // on a device: an asynchronous fill, no host sync
    lr_tensor_value_ = lr;
  }
  return lr_tensor_;
}

// ---------------------------------------------------------------- Optimizer

Optimizer::Optimizer(std::vector<ParamGroup> groups, std::unique_ptr<OptimizerOptions> defaults)
    : defaults_(std::move(defaults)) {
  KILN_CHECK(defaults_, "Optimizer: no default options");
  defaults_->validate();
  size_t total = 0;
  for (const ParamGroup& g : groups) total += g.params().size();
  KILN_CHECK(total > 0, defaults_->optimizer_name(), ": got an empty parameter list");
  for (const ParamGroup& g : groups) add_param_group(g);
}

void Optimizer::check_options_type(const OptimizerOptions& options) const {
  KILN_CHECK(std::string(options.optimizer_name()) == defaults_->optimizer_name(), defaults_->optimizer_name(),
             ": a parameter group has ", options.optimizer_name(), " options");
}

void Optimizer::add_param_group(const ParamGroup& group) {
  const char* name = defaults_->optimizer_name();
  ParamGroup g(group.params_, group.has_options() ? group.options() : *defaults_);
  check_options_type(g.options());
  g.options().validate();
  std::unordered_set<const TensorImpl*> seen;
  for (const ParamGroup& other : groups_)
    for (const Tensor& p : other.params()) seen.insert(p.impl());
  std::unordered_set<const TensorImpl*> mine;
  for (size_t i = 0; i < g.params().size(); ++i) {
    const Tensor& p = g.params()[i];
    KILN_CHECK(p.defined(), name, ": parameter ", i, " of the group is undefined");
    KILN_CHECK(p.is_floating_point(), name, ": can only optimize floating-point tensors, parameter ", i, " has dtype ",
               p.dtype());
    KILN_CHECK(p.is_leaf(), name, ": can't optimize a non-leaf tensor (parameter ", i, ", sizes ", p.sizes(),
               ", made by ", p.grad_fn() ? p.grad_fn()->name() : "?",
               "); optimize the leaf it was computed from, or detach() it");
    KILN_CHECK(!mine.count(p.impl()), name, ": parameter ", i, " appears twice in the parameter group");
    KILN_CHECK(!seen.count(p.impl()), name, ": parameter ", i, " (sizes ", p.sizes(),
               ") appears in more than one parameter group");
    KILN_CHECK(g.params().front().device() == p.device(), name,
               ": all parameters of a group must be on one device, got ", g.params().front().device(), " and ",
               p.device());
    mine.insert(p.impl());
  }
  groups_.push_back(std::move(g));
}

std::vector<Tensor> Optimizer::parameters() const {
  std::vector<Tensor> out;
  for (const ParamGroup& g : groups_) out.insert(out.end(), g.params().begin(), g.params().end());
  return out;
}

std::vector<std::pair<const char*, Tensor>> OptimizerParamState::buffers() const {
  std::vector<std::pair<const char*, Tensor>> out;
  // buffer_slots() hands out pointers to write through; here they are only read.
  for (const auto& [name, slot] : const_cast<OptimizerParamState*>(this)->buffer_slots()) out.emplace_back(name, *slot);
  return out;
}

const OptimizerParamState* Optimizer::state(const Tensor& param) const {
  auto it = state_.find(param.impl());
  return it == state_.end() ? nullptr : it->second.get();
}

namespace {
// A zero tensor of `dtype` with p's sizes and memory layout (the same strides when p is dense but
// permuted, e.g. channels_last), so the kernel walks both in the same flat order.
Tensor zeros_with_layout(const Tensor& p, DType dtype) {
  TensorOptions opts = TensorOptions(dtype).device(p.device());
  if (p.is_contiguous() || p.dim() < 2) return zeros(p.sizes(), opts);
  IntList order(p.dim());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p.stride(a) > p.stride(b); });
  IntList sizes(p.dim()), inverse(p.dim());
  for (int64_t i = 0; i < p.dim(); ++i) {
    sizes[i] = p.size(order[i]);
    inverse[order[i]] = i;
  }
  return zeros(sizes, opts).permute(inverse);
}

Tensor copy_with_layout(const Tensor& src, const Tensor& like, DType dtype) {
  Tensor out = zeros_with_layout(like, dtype);
  out.copy_(src);
  return out;
}
}  // namespace

OptimizerParamState& Optimizer::state_for(const Tensor& p, const OptimizerOptions& options, bool& fresh) {
  std::unique_ptr<OptimizerParamState>& slot = state_[p.impl()];
  if (!slot) slot = make_param_state();
  OptimizerParamState& s = *slot;
  const DType buffer_dtype = p.dtype() == DType::F64 ? DType::F64 : DType::F32;
  const bool half = p.dtype() == DType::F16 || p.dtype() == DType::BF16;
  if (!s.step.defined()) s.step = zeros({}, TensorOptions(DType::F64).device(p.device()));
  const OptimizerParamState::BufferSlots buffers = s.buffer_slots();
  const int needed = buffers_needed(options);
  fresh = false;
  for (int k = 0; k < needed; ++k) {
    Tensor& buffer = *buffers[k].second;
    if (buffer.defined()) continue;
    buffer = zeros_with_layout(p, buffer_dtype);
    fresh = true;
  }
  if (half && !s.master.defined()) s.master = copy_with_layout(p, p, DType::F32);
  return s;
}

void Optimizer::step_group(ParamGroup& group, const StepFlags& flags) {
  NoGradGuard no_grad;
  const OptimizerOptions& options = group.options();
  const int needed = buffers_needed(options);
  kernels::MultiTensorLists lists;
  for (const Tensor& p : group.params()) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    bool fresh = false;
    OptimizerParamState& s = state_for(p, options, fresh);
    // A gradient whose layout differs from the parameter's (e.g. contiguous for a channels_last
    // weight) is copied once into the parameter's layout; the usual case costs nothing.
    bool same = g.sizes() == p.sizes() && g.dtype() == p.dtype();
    for (int64_t d = 0; same && d < p.dim(); ++d) same = p.size(d) == 1 || g.stride(d) == p.stride(d);
    if (!same) g = copy_with_layout(g, p, p.dtype());
    lists.params.push_back(p);
    lists.grads.push_back(g);
    lists.masters.push_back(s.master);
    lists.steps.push_back(s.step);
    const OptimizerParamState::BufferSlots buffers = s.buffer_slots();
    for (int k = 0; k < needed; ++k) lists.buffers[k].push_back(*buffers[k].second);
    lists.fresh_buffers.push_back(fresh ? 1 : 0);
  }
  if (lists.params.empty()) return;
  const kernels::StepScalars scalars{group.lr_tensor(), flags.found_inf, flags.grad_scale};
  if (fused_) {
    run_step_kernel(options, lists, scalars);
    return;
  }
  for (size_t i = 0; i < lists.params.size(); ++i) {
    kernels::MultiTensorLists one;
    one.params = {lists.params[i]};
    one.grads = {lists.grads[i]};
    one.masters = {lists.masters[i]};
    one.steps = {lists.steps[i]};
    for (int k = 0; k < needed; ++k) one.buffers[k] = {lists.buffers[k][i]};
    one.fresh_buffers = {lists.fresh_buffers[i]};
    run_step_kernel(options, one, scalars);
  }
}

void Optimizer::step(const StepFlags& flags) {
  for (ParamGroup& g : groups_) {
    g.options().validate();
    step_group(g, flags);
  }
}

Tensor Optimizer::step(const std::function<Tensor()>& closure) {
  Tensor loss;
  {
    EnableGradGuard enable;
    loss = closure();
  }
  step();
  return loss;
}

void detail::zero_grad(Tensor& param, bool set_to_none) {
  if (!param.grad().defined()) return;
  if (set_to_none) {
    param.set_grad(Tensor());
  } else {
    Tensor& g = param.mutable_grad();
    if (g.grad_fn()) g = g.detach();
    g.zero_();
  }
}

void Optimizer::zero_grad(bool set_to_none) {
  for (ParamGroup& g : groups_) {
    for (Tensor& p : g.params()) detail::zero_grad(p, set_to_none);
  }
}

// ---------------------------------------------------------------- state_dict

OptimizerStateDict Optimizer::state_dict() const {
  OptimizerStateDict d;
  d.optimizer = defaults_->optimizer_name();
  int64_t index = 0;
  for (const ParamGroup& g : groups_) {
    OptimizerStateDict::Group dg;
    dg.options = g.options().to_map();
    for (const Tensor& p : g.params()) {
      dg.params.push_back(index);
      if (const OptimizerParamState* s = state(p)) {
        auto& e = d.state[index];
        e["step"] = s->step.clone();
        for (const auto& [buffer_name, buffer] : s->buffers())
          if (buffer.defined()) e[buffer_name] = buffer.clone();
        if (s->master.defined()) e["master"] = s->master.clone();
      }
      ++index;
    }
    d.param_groups.push_back(std::move(dg));
  }
  return d;
}

void Optimizer::load_state_dict(const OptimizerStateDict& d) {
  const char* name = defaults_->optimizer_name();
  KILN_CHECK(d.optimizer.empty() || d.optimizer == name, name, "::load_state_dict: the state dict is from a ",
             d.optimizer, " optimizer");
  KILN_CHECK(d.param_groups.size() == groups_.size(), name, "::load_state_dict: the state dict has ",
             d.param_groups.size(), " parameter groups, the optimizer ", groups_.size());
  for (size_t gi = 0; gi < groups_.size(); ++gi)
    KILN_CHECK(d.param_groups[gi].params.size() == groups_[gi].params().size(), name, "::load_state_dict: group ", gi,
               " has ", d.param_groups[gi].params.size(), " parameters in the state dict, ",
               groups_[gi].params().size(), " in the optimizer");
  // Validate everything before changing anything.
  std::vector<std::unique_ptr<OptimizerOptions>> opts;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    auto o = groups_[gi].options().clone();
    o->from_map(d.param_groups[gi].options);
    o->validate();
    opts.push_back(std::move(o));
  }
  std::unordered_map<const TensorImpl*, std::unique_ptr<OptimizerParamState>> fresh;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const auto& ids = d.param_groups[gi].params;
    for (size_t k = 0; k < ids.size(); ++k) {
      auto it = d.state.find(ids[k]);
      if (it == d.state.end()) continue;
      const Tensor& p = groups_[gi].params()[k];
      const DType sdt = p.dtype() == DType::F64 ? DType::F64 : DType::F32;
      std::unique_ptr<OptimizerParamState> loaded = make_param_state();
      OptimizerParamState& s = *loaded;
      const OptimizerParamState::BufferSlots buffers = s.buffer_slots();
      for (const auto& [key, t] : it->second) {
        KILN_CHECK(t.defined(), name, "::load_state_dict: state ", ids[k], ".", key, " is undefined");
        if (key == "step") {
          KILN_CHECK(t.numel() == 1, name, "::load_state_dict: state ", ids[k], ".step must have one element");
          s.step = full({}, t.item<double>(), TensorOptions(DType::F64).device(p.device()));
          continue;
        }
        KILN_CHECK(t.sizes() == p.sizes(), name, "::load_state_dict: state ", ids[k], ".", key, " has sizes ",
                   t.sizes(), ", the parameter ", p.sizes());
        Tensor c = copy_with_layout(t.to(p.device()), p, key == "master" ? DType::F32 : sdt);
        if (key == "master") {
          s.master = c;
          continue;
        }
        auto slot =
            std::find_if(buffers.begin(), buffers.end(), [&key = key](const auto& b) { return key == b.first; });
        KILN_CHECK(slot != buffers.end(), name, "::load_state_dict: unknown state entry '", key, "' for parameter ",
                   ids[k]);
        *slot->second = c;
      }
      KILN_CHECK(s.step.defined(), name, "::load_state_dict: state ", ids[k], " has no step");
      fresh[p.impl()] = std::move(loaded);
    }
  }
  for (size_t gi = 0; gi < groups_.size(); ++gi) groups_[gi].options_ = std::move(opts[gi]);
  state_ = std::move(fresh);
}

// ---------------------------------------------------------------- flat form

std::vector<std::pair<std::string, Tensor>> OptimizerStateDict::flatten() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t g = 0; g < param_groups.size(); ++g) {
    const std::string pre = "param_groups." + std::to_string(g) + ".";
    for (const auto& [k, v] : param_groups[g].options) out.emplace_back(pre + k, scalar_tensor(v, DType::F64));
    std::vector<int64_t> ids = param_groups[g].params;
    out.emplace_back(pre + "params", tensor(ids));
  }
  for (const auto& [i, entries] : state)
    for (const auto& [k, t] : entries) out.emplace_back("state." + std::to_string(i) + "." + k, t);
  return out;
}

OptimizerStateDict OptimizerStateDict::unflatten(const std::string& optimizer,
                                                 const std::vector<std::pair<std::string, Tensor>>& items) {
  OptimizerStateDict d;
  d.optimizer = optimizer;
  for (const auto& [key, t] : items) {
    auto dot1 = key.find('.');
    auto dot2 = dot1 == std::string::npos ? std::string::npos : key.find('.', dot1 + 1);
    KILN_CHECK(dot2 != std::string::npos, "OptimizerStateDict::unflatten: bad key '", key, "'");
    const std::string head = key.substr(0, dot1), rest = key.substr(dot2 + 1);
    int64_t idx = 0;
    try {
      idx = std::stoll(key.substr(dot1 + 1, dot2 - dot1 - 1));
    } catch (...) {
      KILN_FAIL("OptimizerStateDict::unflatten: bad index in key '", key, "'");
    }
    if (head == "param_groups") {
      KILN_CHECK(idx >= 0 && idx < 100000, "OptimizerStateDict::unflatten: bad group in '", key, "'");
      if (d.param_groups.size() <= static_cast<size_t>(idx)) d.param_groups.resize(idx + 1);
      auto& g = d.param_groups[idx];
      if (rest == "params") {
        Tensor ids = t.to(DType::I64).contiguous();
        const int64_t* p = ids.data_ptr<int64_t>();
        g.params.assign(p, p + ids.numel());
      } else {
        g.options[rest] = t.item<double>();
      }
    } else if (head == "state") {
      d.state[idx][rest] = t;
    } else {
      KILN_FAIL("OptimizerStateDict::unflatten: unknown key '", key, "'");
    }
  }
  return d;
}

}  // namespace kiln::optim
