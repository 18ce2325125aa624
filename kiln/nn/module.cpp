#include "kiln/nn/module.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>

#include "kiln/core/autograd.h"
#include "kiln/nn/container.h"

namespace kiln::nn {

// ---------------------------------------------------------------- StateDict

void StateDict::insert(const std::string& key, const Tensor& value) {
  for (auto& [k, v] : items_) {
    if (k == key) {
      v = value;
      return;
    }
  }
  items_.emplace_back(key, value);
}

const Tensor* StateDict::find(const std::string& key) const {
  for (const auto& [k, v] : items_)
    if (k == key) return &v;
  return nullptr;
}

const Tensor& StateDict::at(const std::string& key) const {
  const Tensor* t = find(key);
  KILN_CHECK(t != nullptr, "StateDict: no entry named '", key, "'");
  return *t;
}

std::vector<std::string> StateDict::keys() const {
  std::vector<std::string> k;
  for (const auto& item : items_) k.push_back(item.first);
  return k;
}

// ---------------------------------------------------------------- registration

Module::Module(std::string type_name) : type_name_(std::move(type_name)) {}

Tensor Module::forward(const Tensor&) {
  KILN_FAIL(type_name_, ": this module has no single-input forward(); call its own forward method");
}

void Module::check_name(const std::string& name, const char* what) const {
  KILN_CHECK(!name.empty() && name.find('.') == std::string::npos, type_name_, ": ", what, " name '", name,
             "' must be non-empty and contain no '.'");
  auto taken = [&](const auto& list) {
    return std::any_of(list.begin(), list.end(), [&](const auto& p) { return p.first == name; });
  };
  KILN_CHECK(!taken(params_) && !taken(buffers_) && !taken(children_), type_name_, ": the name '", name,
             "' is already registered");
}

Tensor Module::register_parameter(const std::string& name, Tensor tensor, bool requires_grad) {
  check_name(name, "parameter");
  KILN_CHECK(tensor.defined(), type_name_, ": parameter '", name, "' is undefined");
  KILN_CHECK(tensor.is_leaf(), type_name_, ": parameter '", name, "' must be a leaf tensor (detach() it first)");
  if (requires_grad) tensor.requires_grad_(true);
  params_.emplace_back(name, tensor);
  return tensor;
}

Tensor Module::register_buffer(const std::string& name, Tensor tensor) {
  check_name(name, "buffer");
  KILN_CHECK(tensor.defined(), type_name_, ": buffer '", name, "' is undefined");
  buffers_.emplace_back(name, tensor);
  return tensor;
}

void Module::add_child(const std::string& name, Module* child, std::shared_ptr<Module> owned) {
  check_name(name, "module");
  KILN_CHECK(child != nullptr && child != this, type_name_, ": invalid child module '", name, "'");
  children_.emplace_back(name, child);
  if (owned) owned_.push_back(std::move(owned));
}

Module* Module::child(const std::string& name) const {
  for (const auto& [n, m] : children_)
    if (n == name) return m;
  return nullptr;
}

size_t Module::declare_chain(const std::vector<Module*>& layers) {
  KILN_CHECK(!layers.empty(), type_name(), ".declare_chain: a chain needs at least one module");
  auto chain = std::make_shared<Sequential>();
  for (Module* m : layers) {
    const bool registered =
        std::any_of(children_.begin(), children_.end(), [m](const auto& c) { return c.second == m; });
    KILN_CHECK(m != nullptr && registered, type_name(),
               ".declare_chain: every module of a chain must be a registered child");
    chain->push_back(std::shared_ptr<Module>(std::shared_ptr<Module>(), m));  // non-owning: this module owns it
  }
  chains_.push_back(std::move(chain));
  return chains_.size() - 1;
}

Tensor Module::run_chain(size_t index, const Tensor& x) {
  KILN_CHECK(index < chains_.size(), type_name(), ".run_chain: no chain ", index, " (", chains_.size(), " declared)");
  return chains_[index]->forward(x);
}

// ---------------------------------------------------------------- traversal

void Module::collect(const std::string& prefix, bool recurse, bool params,
                     std::vector<std::pair<std::string, Tensor>>& out) const {
  for (const auto& [n, t] : params ? params_ : buffers_) out.emplace_back(prefix + n, t);
  if (!recurse) return;
  for (const auto& [n, m] : children_) m->collect(prefix + n + ".", true, params, out);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", recurse, true, out);
  // A tensor shared by two modules (tied weights) is listed once, under its first name.
  std::vector<std::pair<std::string, Tensor>> unique;
  for (auto& p : out) {
    bool seen = std::any_of(unique.begin(), unique.end(), [&](const auto& q) { return q.second.is_same(p.second); });
    if (!seen) unique.push_back(std::move(p));
  }
  return unique;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", recurse, false, out);
  return out;
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_buffers(recurse)) out.push_back(t);
  return out;
}

std::vector<Module*> Module::children() const {
  std::vector<Module*> out;
  for (const auto& [n, m] : children_) out.push_back(m);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_children() const { return children_; }

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out{{"", this}};
  for (const auto& [n, m] : children_) {
    for (auto& [sub, mod] : m->named_modules()) out.emplace_back(sub.empty() ? n : n + "." + sub, mod);
  }
  return out;
}

int64_t Module::parameter_count(bool trainable_only) const {
  int64_t n = 0;
  for (const Tensor& p : parameters())
    if (!trainable_only || p.requires_grad()) n += p.numel();
  return n;
}

// ---------------------------------------------------------------- mode, placement, grads

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, m] : children_) m->train(on);
}

template <class F> void Module::for_each_tensor(F&& f) {
  for (auto& [n, t] : params_) f(t, true);
  for (auto& [n, t] : buffers_) f(t, false);
  for (auto& [n, m] : children_) m->for_each_tensor(f);
}

namespace {
// Moves `t` (every handle to it) to new data; its gradient follows.
void move_tensor(Tensor& t, const std::function<Tensor(const Tensor&)>& convert) {
  NoGradGuard ng;
  Tensor moved = convert(t.detach());
  if (moved.impl() == t.impl() || moved.storage() == t.storage()) return;
  t.set_data(moved);
  if (t.grad().defined()) t.mutable_grad().set_data(convert(t.grad()));
}

Tensor to_memory_format(const Tensor& t, MemoryFormat f) {
  if (t.dim() != 4) return t;
  if (f == MemoryFormat::Contiguous) return t.contiguous();
  // NHWC strides: logical [N, C, H, W] stored as [N, H, W, C]
  Tensor nhwc = t.permute({0, 2, 3, 1}).contiguous();
  return nhwc.permute({0, 3, 1, 2});
}
}  // namespace

void Module::to(Device device, bool non_blocking) {
  std::vector<Tensor*> seen;
  for_each_tensor(
      [&](Tensor& t, bool) { move_tensor(t, [&](const Tensor& x) { return x.to(device, non_blocking); }); });
}

void Module::to(DType dtype) {
  KILN_CHECK(is_floating(dtype), type_name_, ".to: modules convert to floating dtypes only, got ", dtype);
  for_each_tensor([&](Tensor& t, bool) {
    if (is_floating(t.dtype())) move_tensor(t, [&](const Tensor& x) { return x.to(dtype); });
  });
}

void Module::to(Device device, DType dtype, bool non_blocking) {
  to(device, non_blocking);
  to(dtype);
}

void Module::to(MemoryFormat format) {
  for_each_tensor(
      [&](Tensor& t, bool) { move_tensor(t, [&](const Tensor& x) { return to_memory_format(x, format); }); });
}

void Module::zero_grad(bool set_to_none) {
  NoGradGuard ng;
  for (Tensor& p : parameters()) {
    if (!p.grad().defined()) continue;
    if (set_to_none) p.set_grad(Tensor());
    else p.mutable_grad().zero_();
  }
}

void Module::apply(const std::function<void(Module&)>& fn) {
  for (auto& [n, m] : children_) m->apply(fn);
  fn(*this);
}

// ---------------------------------------------------------------- checkpoints

StateDict Module::state_dict() const {
  StateDict d;
  std::vector<std::pair<std::string, Tensor>> all;
  collect("", true, true, all);
  for (auto& [k, v] : all) d.insert(k, v.detach());
  all.clear();
  collect("", true, false, all);
  for (auto& [k, v] : all) d.insert(k, v.detach());
  return d;
}

void Module::load_state_dict(const StateDict& dict, bool strict) {
  StateDict own = state_dict();
  std::vector<std::string> missing, unexpected;
  for (const auto& [k, v] : own)
    if (!dict.contains(k)) missing.push_back(k);
  for (const auto& [k, v] : dict)
    if (!own.contains(k)) unexpected.push_back(k);
  if (strict && (!missing.empty() || !unexpected.empty())) {
    KILN_FAIL(type_name_, ".load_state_dict: keys do not match; missing: ", missing, "; unexpected: ", unexpected);
  }
  NoGradGuard ng;
  for (const auto& [k, target] : own) {
    const Tensor* src = dict.find(k);
    if (!src) continue;
    KILN_CHECK(src->sizes() == target.sizes(), type_name_, ".load_state_dict: '", k, "' has sizes ", src->sizes(),
               " in the checkpoint but ", target.sizes(), " in the model");
    Tensor dst = target;  // same storage as the module's tensor
    dst.copy_(*src);
  }
}

// ---------------------------------------------------------------- printing

void Module::print(std::ostream& os, int indent) const {
  os << type_name_ << '(' << extra_repr();
  if (!children_.empty()) {
    os << '\n';
    for (const auto& [n, m] : children_) {
      os << std::string(indent + 2, ' ') << '(' << n << "): ";
      m->print(os, indent + 2);
      os << '\n';
    }
    os << std::string(indent, ' ');
  }
  os << ')';
}

std::string Module::str() const {
  std::ostringstream os;
  print(os, 0);
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Module& m) { return os << m.str() << '\n'; }

std::string float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[48];
  int digits = 1;  // the fewest significant digits that read back as v
  for (; digits < 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*e", digits - 1, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::snprintf(buf, sizeof buf, "%.*e", digits - 1, v);
  const int exp10 = std::atoi(std::strchr(buf, 'e') + 1);
  if (exp10 < -4 || exp10 >= 16) return buf;  // Python's switch to scientific notation: 1e-05
  std::snprintf(buf, sizeof buf, "%.*f", std::max(digits - 1 - exp10, 0), v);
  std::string s = buf;
  if (s.find('.') == std::string::npos) s += ".0";
  return s;
}

}  // namespace kiln::nn
