#pragma once
// The autograd engine, small enough to read in one sitting:
//   - every differentiable op that ran with grad mode on creates a Node holding a backward
//     closure and one Edge per input (where that input's gradient must go);
//   - leaves get an AccumulateGrad node that adds into tensor.grad();
//   - backward() counts dependencies from the roots, then runs nodes in topological order
//     (ties broken by creation order, newest first), summing gradients that fan in;
//   - after a node has run, its closure (and with it every saved tensor) is released unless
//     retain_graph is set.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/core/tensor.h"

namespace kiln {

// ---- grad mode (thread-local)
struct GradMode {
  static bool is_enabled();
  static void set_enabled(bool enabled);
};

// RAII: sets the grad mode while it lives, then restores the previous one.
class GradModeGuard {
 public:
  explicit GradModeGuard(bool enabled) : prev_(GradMode::is_enabled()) { GradMode::set_enabled(enabled); }
  ~GradModeGuard() { GradMode::set_enabled(prev_); }
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool prev_;
};

// RAII: no graph is recorded inside (validation, optimizer updates).
class NoGradGuard : public GradModeGuard {
 public:
  NoGradGuard() : GradModeGuard(false) {}
};

class EnableGradGuard : public GradModeGuard {
 public:
  EnableGradGuard() : GradModeGuard(true) {}
};

namespace autograd {

using TensorList = std::vector<Tensor>;
using TensorHook = std::function<Tensor(const Tensor&)>;

struct Edge {
  std::shared_ptr<Node> fn;  // null: this input needs no gradient
  uint32_t input_nr = 0;     // which of fn's gradient slots receives it
  bool valid() const { return fn != nullptr; }
};

// What backward needs to materialise a zero gradient for an output that received none.
struct OutputMeta {
  IntList sizes;
  DType dtype = DType::F32;
  Device device;
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  explicit Node(std::string name);
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  const std::string& name() const { return name_; }
  uint64_t sequence_nr() const { return seq_; }
  std::vector<Edge>& next_edges() { return next_; }
  const std::vector<Edge>& next_edges() const { return next_; }
  std::vector<OutputMeta>& output_meta() { return outputs_; }
  size_t num_outputs() const { return outputs_.size(); }

  // Hooks on the gradient of forward output `slot` (tensor.register_hook on a non-leaf).
  size_t add_pre_hook(uint32_t slot, TensorHook hook);
  void remove_pre_hook(size_t handle);
  Tensor run_pre_hooks(uint32_t slot, Tensor grad) const;

  // Gradients w.r.t. the forward outputs in, gradients w.r.t. the forward inputs out
  // (one per next edge; undefined where an input needs none).
  virtual TensorList apply(TensorList&& grad_outputs) = 0;
  // Drops saved state after backward (retain_graph=false).
  virtual void release() {}
  virtual bool released() const { return false; }

 private:
  std::string name_;
  uint64_t seq_;
  std::vector<Edge> next_;
  std::vector<OutputMeta> outputs_;
  struct PreHook {
    size_t handle;
    uint32_t slot;
    TensorHook fn;
  };
  std::vector<PreHook> pre_hooks_;
};

// The node most ops create: a closure computing input gradients from output gradients.
class FunctionNode final : public Node {
 public:
  using Backward = std::function<TensorList(const TensorList& grad_outputs)>;
  FunctionNode(std::string name, Backward fn) : Node(std::move(name)), fn_(std::move(fn)) {}
  TensorList apply(TensorList&& grad_outputs) override;
  void release() override { fn_ = nullptr; }
  bool released() const override { return !fn_; }

 private:
  Backward fn_;
};

// Sink for a leaf's gradient: runs the leaf's hooks, accumulates into grad(), then runs the
// post-accumulate hooks.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::weak_ptr<TensorImpl> leaf);
  TensorList apply(TensorList&& grad_outputs) override;
  std::shared_ptr<TensorImpl> leaf() const { return leaf_.lock(); }

 private:
  std::weak_ptr<TensorImpl> leaf_;
};

struct AutogradMeta {
  bool requires_grad = false;
  bool retains_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;  // null for leaves
  uint32_t output_nr = 0;
  std::weak_ptr<Node> grad_accumulator;  // leaves: shared by all graphs that use this leaf
  struct Hook {
    size_t handle;
    TensorHook fn;
  };
  std::vector<Hook> hooks;  // leaves' tensor hooks (non-leaves keep theirs on grad_fn)
  std::vector<std::function<void(Tensor&)>> post_accumulate_hooks;
};

AutogradMeta& meta(const Tensor& t);  // creates it on first use

// A tensor kept for backward, with the version it had when saved. get() refuses to return it
// if it was modified in place since (the value backward would use is gone).
//
// An op that saves its own *output* must say so (SavedTensor::output): holding the output
// strongly would make a cycle (output -> grad_fn -> saved output) that leaks every graph that is
// built but never backpropagated. An output is kept as its data plus a weak reference; get()
// returns the original tensor while it lives, and otherwise rebuilds it on the data with the
// node being run as its grad_fn (so create_graph still differentiates through it).
class SavedTensor {
 public:
  SavedTensor() = default;
  SavedTensor(const Tensor& t, const char* op);
  static SavedTensor output(const Tensor& out, const char* op, uint32_t output_nr = 0);
  Tensor get() const;
  bool defined() const { return tensor_.defined(); }

 private:
  Tensor tensor_;  // for an output: a detached view of its data
  std::weak_ptr<TensorImpl> output_;
  bool is_output_ = false;
  uint32_t output_nr_ = 0;
  uint64_t version_ = 0;
  const char* op_ = "";
};

// Where the gradient of `t` must be sent: its grad_fn slot, or its leaf accumulator.
Edge gradient_edge(const Tensor& t);

// True when an op on these inputs must record a node (grad mode on, an input requires grad).
bool any_requires_grad(std::initializer_list<const Tensor*> inputs);
bool any_requires_grad(const std::vector<Tensor>& inputs);

// Connects `node` to `inputs` (one edge each) and makes it the grad_fn of `outputs`.
void record(const std::shared_ptr<Node>& node, const std::vector<const Tensor*>& inputs,
            const std::vector<Tensor*>& outputs);

// Convenience for ops: record a FunctionNode named `name` if needed.
template <class F>
void record_function(const char* name, const std::vector<const Tensor*>& inputs, const std::vector<Tensor*>& outputs,
                     F&& backward) {
  auto node = std::make_shared<FunctionNode>(name, std::forward<F>(backward));
  record(node, inputs, outputs);
}

// An op's backward in its two forms (docs/architecture.md, "Autograd"): `fused` computes the
// gradients with the op's backward kernels, for a plain backward; `composite` computes the same
// gradients as differentiable ops, and runs instead when a graph of the backward itself is being
// recorded (create_graph), so second derivatives work.
template <class Fused, class Composite> struct TwoFormBackward {
  Fused fused;
  Composite composite;
  TensorList operator()(const TensorList& grads) const {
    return GradMode::is_enabled() ? composite(grads) : fused(grads);
  }
};
template <class Fused, class Composite>
TwoFormBackward<Fused, Composite> fused_or_composite(Fused fused, Composite composite) {
  return {std::move(fused), std::move(composite)};
}

// Runs backward from `roots`. With `inputs` non-empty, returns their gradients instead of
// accumulating into any leaf's grad() (like torch.autograd.grad).
TensorList run_backward(const TensorList& roots, const TensorList& grad_roots, bool retain_graph, bool create_graph,
                        const TensorList& inputs = {}, bool allow_unused = false);

// Runs `callback` once the backward pass that is running on this thread has finished every node
// (torch's Variable._execution_engine.queue_callback): what DDP uses to finish its gradient
// reduction after the last hook. Throws kiln::Error outside a backward pass. Callbacks run in the
// order queued; a callback may queue another. When backward throws, queued callbacks are dropped.
void queue_callback(std::function<void()> callback);

// torch.autograd.grad: d(sum outputs·grad_outputs)/d(inputs).
TensorList grad(const TensorList& outputs, const TensorList& inputs, const TensorList& grad_outputs = {},
                bool retain_graph = false, bool create_graph = false, bool allow_unused = false);

// Anomaly mode: after each node's backward, check its gradients for NaN/Inf and throw an Error
// naming the node. Off by default (it costs a pass over every gradient).
void set_detect_anomaly(bool enabled);
bool is_anomaly_enabled();
class DetectAnomalyGuard {
 public:
  DetectAnomalyGuard() : prev_(is_anomaly_enabled()) { set_detect_anomaly(true); }
  ~DetectAnomalyGuard() { set_detect_anomaly(prev_); }

 private:
  bool prev_;
};

}  // namespace autograd
}  // namespace kiln
