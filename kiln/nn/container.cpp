#include "kiln/nn/container.h"

namespace kiln::nn {

void ModuleList::push_back(std::shared_ptr<Module> module) {
  KILN_CHECK(module != nullptr, type_name(), ".push_back: module is null");
  register_module(std::to_string(items_.size()), module);
  items_.push_back(std::move(module));
}

void ModuleList::push_back(const std::string& name, std::shared_ptr<Module> module) {
  KILN_CHECK(module != nullptr, type_name(), ".push_back: module '", name, "' is null");
  register_module(name, module);
  items_.push_back(std::move(module));
}

Module& ModuleList::operator[](size_t i) const {
  KILN_CHECK(i < items_.size(), type_name(), ": index ", i, " out of range for ", items_.size(), " modules");
  return *items_[i];
}

Tensor Sequential::forward(const Tensor& x) { return forward_range(0, items_.size(), x); }

Tensor Sequential::forward_range(size_t begin, size_t end, const Tensor& x) {
  KILN_CHECK(begin <= end && end <= items_.size(), type_name(), ".forward_range: [", begin, ", ", end,
             ") is not a range of its ", items_.size(), " modules");
  Tensor h = x;
  for (size_t i = begin; i < end;) {
    auto run = runs_.find(i);
    if (run != runs_.end() && i + run->second.count <= end) {
      h = run->second.module->forward(h);
      i += run->second.count;
    } else {
      h = items_[i++]->forward(h);
    }
  }
  return h;
}

void Sequential::fuse_run(size_t first, size_t count, std::shared_ptr<Module> fused) {
  KILN_CHECK(fused != nullptr, type_name(), ".fuse_run: the fused module is null");
  KILN_CHECK(count >= 1 && first + count <= items_.size(), type_name(), ".fuse_run: modules [", first, ", ",
             first + count, ") out of range for ", items_.size(), " modules");
  for (size_t i = first; i < first + count; ++i)
    KILN_CHECK(!is_fused(i), type_name(), ".fuse_run: module ", i, " already belongs to a fused run");
  runs_[first] = FusedRun{count, std::move(fused)};
}

bool Sequential::is_fused(size_t i) const {
  for (const auto& [first, run] : runs_)
    if (i >= first && i < first + run.count) return true;
  return false;
}

std::string Sequential::extra_repr() const {
  std::string s;
  for (const auto& [first, run] : runs_) {
    s += s.empty() ? "fused: " : ", ";
    s += run.module->type_name() + "[" + std::to_string(first) + ".." + std::to_string(first + run.count - 1) + "]";
  }
  return s;
}

void ModuleDict::insert(const std::string& key, std::shared_ptr<Module> module) {
  KILN_CHECK(module != nullptr, "ModuleDict.insert: module '", key, "' is null");
  register_module(key, module);
  items_.emplace_back(key, std::move(module));
}

Module& ModuleDict::operator[](const std::string& key) const {
  for (const auto& [k, m] : items_)
    if (k == key) return *m;
  KILN_FAIL("ModuleDict: no module named '", key, "'");
}

bool ModuleDict::contains(const std::string& key) const {
  for (const auto& [k, m] : items_)
    if (k == key) return true;
  return false;
}

std::vector<std::string> ModuleDict::keys() const {
  std::vector<std::string> out;
  for (const auto& [k, m] : items_) out.push_back(k);
  return out;
}

}  // namespace kiln::nn
