#include "kiln/nn/container.h"

namespace kiln::nn {

void ModuleList::push_back(std::shared_ptr<Module> module) {
  KILN_CHECK(module != nullptr, type_name(), ".push_back: module is null");
  register_module(std::to_string(items_.size()), module);
  items_.push_back(std::move(module));
}

Module& ModuleList::operator[](size_t i) const {
  KILN_CHECK(i < items_.size(), type_name(), ": index ", i, " out of range for ", items_.size(), " modules");
  return *items_[i];
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  for (auto& m : items_) h = m->forward(h);
  return h;
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
