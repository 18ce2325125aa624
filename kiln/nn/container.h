#pragma once
// Containers that own their children: Sequential (forward chains them), ModuleList (indexable,
// no forward), ModuleDict (by name, no forward). Children are named "0", "1", ... or by key, so
// checkpoint keys read "layers.0.weight".
#include <map>
#include <memory>

#include "kiln/nn/module.h"

namespace kiln::nn {

class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  template <class... M>
  explicit ModuleList(std::shared_ptr<M>... modules) : ModuleList() {
    (push_back(std::move(modules)), ...);
  }
  void push_back(std::shared_ptr<Module> module);
  template <class M, class... Args>
  M& emplace_back(Args&&... args) {
    auto m = std::make_shared<M>(std::forward<Args>(args)...);
    push_back(m);
    return *m;
  }
  Module& operator[](size_t i) const;
  template <class M>
  M& at(size_t i) const {
    auto* m = dynamic_cast<M*>(&(*this)[i]);
    KILN_CHECK(m != nullptr, type_name(), "[", i, "] is not of the requested type");
    return *m;
  }
  size_t size() const { return items_.size(); }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }

 protected:
  explicit ModuleList(const char* type_name) : Module(type_name) {}
  std::vector<std::shared_ptr<Module>> items_;
};

class Sequential : public ModuleList {
 public:
  Sequential() : ModuleList("Sequential") {}
  template <class... M>
  explicit Sequential(std::shared_ptr<M>... modules) : Sequential() {
    (push_back(std::move(modules)), ...);
  }
  Tensor forward(const Tensor& x) override;
};

class ModuleDict : public Module {
 public:
  ModuleDict() : Module("ModuleDict") {}
  void insert(const std::string& key, std::shared_ptr<Module> module);
  Module& operator[](const std::string& key) const;
  bool contains(const std::string& key) const;
  size_t size() const { return items_.size(); }
  std::vector<std::string> keys() const;

 private:
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> items_;
};

}  // namespace kiln::nn
