#pragma once
// kiln::nn::Module: the base of every layer and model, following libtorch's frontend.
//
//   struct Net : kiln::nn::Module {
//     kiln::nn::Linear fc{784, 10};
//     Net() { register_module("fc", fc); }
//     kiln::Tensor forward(const kiln::Tensor& x) override { return fc(x); }
//   };
//
// Layers are plain members; register_module records a (non-owning) pointer to them, so a
// Module is neither copyable nor movable. Parameters and buffers are Tensor handles shared with
// the layer's own members: moving a module with to() swaps the data inside those handles
// (Tensor::set_data), so members, optimizers and hooks keep seeing the same tensors.
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/memory_format.h"
#include "kiln/core/tensor.h"

namespace kiln {

namespace nn {

class Sequential;  // kiln/nn/container.h

// Name -> tensor in registration order (parameters and buffers), as checkpoints store them.
class StateDict {
 public:
  void insert(const std::string& key, const Tensor& value);
  const Tensor* find(const std::string& key) const;
  const Tensor& at(const std::string& key) const;  // throws naming the key
  bool contains(const std::string& key) const { return find(key) != nullptr; }
  size_t size() const { return items_.size(); }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }
  std::vector<std::string> keys() const;

 private:
  std::vector<std::pair<std::string, Tensor>> items_;
};

class Module {
 public:
  explicit Module(std::string type_name = "Module");
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Single-input forward: layers and models override it; operator() calls it.
  virtual Tensor forward(const Tensor& input);
  Tensor operator()(const Tensor& input) { return forward(input); }

  // ---- registration (names must be unique per module and contain no '.')
  Tensor register_parameter(const std::string& name, Tensor tensor, bool requires_grad = true);
  Tensor register_buffer(const std::string& name, Tensor tensor);
  template <class M> M& register_module(const std::string& name, M& module) {
    add_child(name, &module, nullptr);
    return module;
  }
  template <class M> std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module.get(), module);
    return module;
  }

  // ---- traversal (recursive unless recurse = false; dotted names like "layer1.0.conv1.weight")
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  std::vector<Module*> children() const;
  std::vector<std::pair<std::string, Module*>> named_children() const;
  std::vector<std::pair<std::string, Module*>> named_modules();  // self first, as ""
  int64_t parameter_count(bool trainable_only = false) const;

  // ---- mode, placement, gradients
  virtual void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  void to(Device device, bool non_blocking = false);
  void to(DType dtype);  // floating parameters and buffers only
  void to(Device device, DType dtype, bool non_blocking = false);
  void to(MemoryFormat format);  // 4-D parameters and buffers to NHWC strides, or back
  void zero_grad(bool set_to_none = true);
  void apply(const std::function<void(Module&)>& fn);  // every module, children first

  // ---- checkpoints
  StateDict state_dict() const;
  // Copies values into the existing tensors (keeping their device and dtype). strict: the keys
  // must match exactly; the error lists the missing and the unexpected keys. Shapes must match.
  void load_state_dict(const StateDict& dict, bool strict = true);

  // ---- printing
  const std::string& type_name() const { return type_name_; }
  virtual std::string extra_repr() const { return ""; }
  std::string str() const;  // the tree, as print(module) in PyTorch (parameter_count() for the sizes)

  // ---- chains: runs of children that forward() applies one after the other (conv1 -> bn1 ->
  // relu), each one's output the next one's input. nn::fuse treats each like a Sequential and may
  // run a fusable stretch of it as one fused module; until then, and for every other stretch,
  // run_chain runs the children in order. Each chain is a Sequential over the children (not
  // registered: parameters(), state_dict() and str() are unchanged).
  const std::vector<std::shared_ptr<Sequential>>& chains() const { return chains_; }

 protected:
  void add_child(const std::string& name, Module* child, std::shared_ptr<Module> owned);
  Module* child(const std::string& name) const;
  // Declares a chain of registered children, in the order forward() applies them; returns its
  // index for run_chain.
  size_t declare_chain(const std::vector<Module*>& layers);
  Tensor run_chain(size_t index, const Tensor& x);

 private:
  void check_name(const std::string& name, const char* what) const;
  void collect(const std::string& prefix, bool recurse, bool params,
               std::vector<std::pair<std::string, Tensor>>& out) const;
  void print(std::ostream& os, int indent) const;
  template <class F> void for_each_tensor(F&& f);  // parameters and buffers of this module and all children

  std::string type_name_;
  bool training_ = true;
  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, Module*>> children_;
  std::vector<std::shared_ptr<Module>> owned_;
  std::vector<std::shared_ptr<Sequential>> chains_;
};

// str() and a newline, as print(module) in Python.
std::ostream& operator<<(std::ostream& os, const Module& m);

// A double as Python's repr writes it: the shortest form that reads back to the same value
// (0.1, 1e-05, 0.3333333333333333), with ".0" on integral values (1.0). For extra_repr, so
// Dropout prints "p=0.1" as PyTorch does, not std::to_string's "0.100000".
std::string float_repr(double v);

// "No bias before BatchNorm": warnings for each conv/linear with a bias that
// feeds a normalisation layer directly inside a Sequential, or is followed by one in
// registration order. Returns the warning lines (also printed to stderr when print = true).
std::vector<std::string> lint(Module& module, bool print = true);

}  // namespace nn
}  // namespace kiln
