#pragma once
// Containers that own their children: Sequential (forward chains them), ModuleList (indexable,
// no forward), ModuleDict (by name, no forward). Children are named "0", "1", ... or by the name
// given to push_back / the key, so checkpoint keys read "layers.0.weight" or "conv1.weight".
#include <map>
#include <memory>
#include <string>

#include "kiln/nn/module.h"

namespace kiln::nn {

class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  template <class... M>
  explicit ModuleList(std::shared_ptr<M>... modules) : ModuleList("ModuleList", std::move(modules)...) {}
  void push_back(std::shared_ptr<Module> module);  // named by its index
  void push_back(const std::string& name, std::shared_ptr<Module> module);
  template <class M, class... Args> M& emplace_back(Args&&... args) {
    auto m = std::make_shared<M>(std::forward<Args>(args)...);
    push_back(m);
    return *m;
  }
  Module& operator[](size_t i) const;
  template <class M> M& at(size_t i) const {
    auto* m = dynamic_cast<M*>(&(*this)[i]);
    KILN_CHECK(m != nullptr, type_name(), "[", i, "] is not of the requested type");
    return *m;
  }
  size_t size() const { return items_.size(); }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }

 protected:
  // For subclasses: their type name, then their first modules.
  template <class... M> explicit ModuleList(const char* type_name, std::shared_ptr<M>... modules) : Module(type_name) {
    (push_back(std::move(modules)), ...);
  }
  std::vector<std::shared_ptr<Module>> items_;
};

class Sequential : public ModuleList {
 public:
  Sequential() : ModuleList("Sequential") {}
  template <class... M>
  explicit Sequential(std::shared_ptr<M>... modules) : ModuleList("Sequential", std::move(modules)...) {}
  Tensor forward(const Tensor& x) override;  // the modules in order (fused runs as one)
  // Modules [begin, end) in order; a fused run entirely inside the range runs fused.
  Tensor forward_range(size_t begin, size_t end, const Tensor& x);

  // Fusion (nn::fuse): from now on forward() runs `fused` in place of the `count` modules that
  // start at `first`; it must compute their composition with their own parameters and buffers
  // (it holds those modules). They stay registered, indexable and in the state_dict, so
  // parameters(), train()/eval(), to() and checkpoints see exactly the unfused model. Runs may
  // not overlap.
  void fuse_run(size_t first, size_t count, std::shared_ptr<Module> fused);
  bool is_fused(size_t i) const;  // module i belongs to a fused run
  size_t fused_run_count() const { return runs_.size(); }
  void unfuse() { runs_.clear(); }          // forward() runs every module again
  std::string extra_repr() const override;  // lists the fused runs

 protected:
  explicit Sequential(const char* type_name) : ModuleList(type_name) {}

 private:
  struct FusedRun {
    size_t count;
    std::shared_ptr<Module> module;
  };
  std::map<size_t, FusedRun> runs_;  // by the index of the run's first module
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
