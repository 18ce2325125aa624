#include "kiln/core/autograd.h"

#include "kiln/core/autocast.h"
#include "kiln/core/profiler.h"

#include <algorithm>
#include <atomic>
#include <queue>
#include <unordered_map>

namespace kiln {

namespace {
thread_local bool t_grad_enabled = true;
std::atomic<bool> g_anomaly{false};
std::atomic<uint64_t> g_next_seq{0};
std::atomic<size_t> g_next_hook{1};
}  // namespace

bool GradMode::is_enabled() { return t_grad_enabled; }
void GradMode::set_enabled(bool enabled) { t_grad_enabled = enabled; }

namespace autograd {

void set_detect_anomaly(bool enabled) { g_anomaly = enabled; }
bool is_anomaly_enabled() { return g_anomaly; }

// ---------------------------------------------------------------- nodes

Node::Node(std::string name) : name_(std::move(name)), seq_(g_next_seq++) {}

size_t Node::add_pre_hook(uint32_t slot, TensorHook hook) {
  size_t h = g_next_hook++;
  pre_hooks_.push_back({h, slot, std::move(hook)});
  return h;
}

void Node::remove_pre_hook(size_t handle) {
  pre_hooks_.erase(
      std::remove_if(pre_hooks_.begin(), pre_hooks_.end(), [&](const PreHook& h) { return h.handle == handle; }),
      pre_hooks_.end());
}

Tensor Node::run_pre_hooks(uint32_t slot, Tensor grad) const {
  for (const auto& h : pre_hooks_) {
    if (h.slot != slot) continue;
    Tensor r = h.fn(grad);
    if (r.defined()) grad = r;
  }
  return grad;
}

TensorList FunctionNode::apply(TensorList&& grad_outputs) {
  KILN_CHECK(fn_ != nullptr, "backward through ", name(),
             " a second time: its saved tensors were freed after the first backward; "
             "pass retain_graph=true to the first backward() to keep them");
  return fn_(grad_outputs);
}

AccumulateGrad::AccumulateGrad(std::weak_ptr<TensorImpl> leaf) : Node("AccumulateGrad"), leaf_(std::move(leaf)) {}

TensorList AccumulateGrad::apply(TensorList&& grads) {
  auto impl = leaf_.lock();
  if (!impl || !grads[0].defined()) return {};
  Tensor leaf(impl);
  AutogradMeta& m = *impl->autograd;
  Tensor g = grads[0];
  for (const auto& h : m.hooks) {
    Tensor r = h.fn(g);
    if (r.defined()) g = r;
  }
  KILN_CHECK(g.sizes() == leaf.sizes(), "AccumulateGrad: gradient of sizes ", g.sizes(),
             " does not match the leaf's sizes ", leaf.sizes());
  if (!m.grad.defined()) {
    // Steal the incoming buffer when nobody else can see it (grads set to none: no memset,
    // no add); otherwise copy so later in-place accumulation cannot alias another tensor.
    if (GradMode::is_enabled()) {
      m.grad = g;
    } else if (g.impl_ptr().use_count() <= 2 && g.storage().use_count() == 1 && g.is_contiguous() &&
               g.dtype() == leaf.dtype()) {
      m.grad = g.detach();
    } else {
      m.grad = g.to(leaf.dtype()).contiguous();
      if (m.grad.is_same(g)) m.grad = g.clone().detach();
    }
  } else if (GradMode::is_enabled() || !m.grad.is_contiguous()) {
    m.grad = m.grad + g;  // create_graph keeps the sum differentiable; views are not written into
  } else {
    m.grad.add_(g);
  }
  for (auto& h : m.post_accumulate_hooks) h(leaf);
  return {};
}

AutogradMeta& meta(const Tensor& t) {
  KILN_CHECK(t.defined(), "autograd: tensor is undefined");
  auto& p = t.impl()->autograd;
  if (!p) p = std::make_unique<AutogradMeta>();
  return *p;
}

// ---------------------------------------------------------------- saved tensors

SavedTensor::SavedTensor(const Tensor& t, const char* op) : tensor_(t), op_(op) {
  if (t.defined()) version_ = t.version();
}

namespace {
thread_local Node* t_running_node = nullptr;  // the node whose apply() is on this thread's stack
}

SavedTensor SavedTensor::output(const Tensor& out, const char* op, uint32_t output_nr) {
  SavedTensor s;
  s.op_ = op;
  if (!out.defined()) return s;
  s.tensor_ = out.detach();
  s.output_ = out.impl_ptr();
  s.is_output_ = true;
  s.output_nr_ = output_nr;
  s.version_ = out.version();
  return s;
}

Tensor SavedTensor::get() const {
  if (tensor_.defined()) {
    KILN_CHECK(tensor_.version() == version_, op_, ": a tensor saved for backward (sizes ", tensor_.sizes(), ", ",
               tensor_.dtype(), ") was modified in place after it was saved (version ", version_, " -> ",
               tensor_.version(), "); backward would use the wrong values");
  }
  if (!is_output_) return tensor_;
  if (auto impl = output_.lock()) return Tensor(impl);
  if (!GradMode::is_enabled() || t_running_node == nullptr) return tensor_;
  // create_graph and the output is gone: rebuild it as an output of the running node.
  Tensor t = tensor_.detach();
  AutogradMeta& m = meta(t);
  m.requires_grad = true;
  m.grad_fn = t_running_node->shared_from_this();
  m.output_nr = output_nr_;
  return t;
}

// ---------------------------------------------------------------- recording

namespace {
std::shared_ptr<Node> grad_accumulator(const Tensor& leaf) {
  AutogradMeta& m = meta(leaf);
  auto acc = m.grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(leaf.impl_ptr());
    acc->output_meta().push_back({leaf.sizes(), leaf.dtype(), leaf.device()});
    m.grad_accumulator = acc;
  }
  return acc;
}
}  // namespace

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  AutogradMeta& m = meta(t);
  if (m.grad_fn) return {m.grad_fn, m.output_nr};
  return {grad_accumulator(t), 0};
}

bool any_requires_grad(std::initializer_list<const Tensor*> inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor* t : inputs)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

bool any_requires_grad(const std::vector<Tensor>& inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

void record(const std::shared_ptr<Node>& node, const std::vector<const Tensor*>& inputs,
            const std::vector<Tensor*>& outputs) {
  auto& edges = node->next_edges();
  edges.reserve(inputs.size());
  for (const Tensor* t : inputs) edges.push_back(gradient_edge(*t));
  auto& om = node->output_meta();
  for (uint32_t i = 0; i < outputs.size(); ++i) {
    Tensor& out = *outputs[i];
    om.push_back({out.sizes(), out.dtype(), out.device()});
    if (!is_floating(out.dtype())) continue;  // integer outputs (indices) carry no gradient
    AutogradMeta& m = meta(out);
    m.requires_grad = true;
    m.grad_fn = node;
    m.output_nr = i;
  }
}

// ---------------------------------------------------------------- the engine

namespace {

struct ReadyOrder {  // newest node first: follows the forward pass in reverse
  bool operator()(const Node* a, const Node* b) const { return a->sequence_nr() < b->sequence_nr(); }
};

// True when no other tensor can observe writes to t's memory.
bool exclusively_owned(const Tensor& t, long impl_refs = 1) {
  return t.impl_ptr().use_count() <= impl_refs && t.storage().use_count() == 1;
}

void accumulate_into(Tensor& slot, Tensor g) {
  if (!slot.defined()) {
    slot = std::move(g);
  } else if (GradMode::is_enabled()) {
    slot = slot + g;
  } else if (exclusively_owned(slot) && slot.is_contiguous() && slot.sizes() == g.sizes() &&
             slot.dtype() == g.dtype()) {
    // (contiguous: an expand()ed gradient aliases one element many times; adding into it in
    // place would add into every alias)
    slot.add_(g);  // we own this buffer: accumulate in place
  } else {
    slot = slot + g;
  }
}

void check_anomaly(const Node& node, const TensorList& grads) {
  NoGradGuard ng;
  for (size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = grads[i];
    if (!g.defined() || !g.is_floating_point() || g.numel() == 0) continue;
    double bad = logical_not(isfinite(g)).to(DType::F32).sum().item<double>();
    KILN_CHECK(bad == 0, "anomaly detected: ", node.name(), " returned NaN or Inf in its gradient ", "for input ", i,
               " (", static_cast<int64_t>(bad), " of ", g.numel(), " elements, sizes ", g.sizes(), ")");
  }
}

// Graph traversal state for one backward call.
struct GraphTask {
  std::unordered_map<Node*, int> dependencies;
  std::unordered_map<Node*, TensorList> buffers;  // incoming gradients per node, one per slot
  // autograd::grad: which (node, slot) pairs to capture, and where.
  std::unordered_map<Node*, std::vector<std::pair<uint32_t, size_t>>> captures;
  TensorList captured;
  std::vector<std::function<void()>> final_callbacks;  // queue_callback, run after the graph
};

// The graph task this thread is running backward for (queue_callback adds to it).
thread_local GraphTask* t_current_task = nullptr;

void compute_dependencies(GraphTask& task, const std::vector<Node*>& roots) {
  std::vector<Node*> stack;
  std::unordered_map<Node*, bool> seen;
  for (Node* r : roots) {
    if (!seen[r]) {
      seen[r] = true;
      stack.push_back(r);
    }
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges()) {
      if (!e.valid()) continue;
      Node* next = e.fn.get();
      ++task.dependencies[next];
      if (!seen[next]) {
        seen[next] = true;
        stack.push_back(next);
      }
    }
  }
}

}  // namespace

TensorList run_backward(const TensorList& roots, const TensorList& grad_roots, bool retain_graph, bool create_graph,
                        const TensorList& inputs, bool allow_unused) {
  KILN_CHECK(roots.size() == grad_roots.size() || grad_roots.empty(), "backward: got ", roots.size(), " outputs but ",
             grad_roots.size(), " gradients");
  GraphTask task;
  std::vector<Node*> root_nodes;
  std::vector<std::shared_ptr<Node>> keep_alive;  // roots' nodes outlive their tensors here

  // Seed the roots' gradients.
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    KILN_CHECK(r.defined(), "backward: output ", i, " is undefined");
    KILN_CHECK(r.requires_grad(), "backward: output ", i, " (sizes ", r.sizes(),
               ") does not require grad and has no grad_fn; did you run the forward pass under "
               "NoGradGuard or forget requires_grad(true) on the inputs?");
    Tensor g;
    if (grad_roots.empty() || !grad_roots[i].defined()) {
      KILN_CHECK(r.numel() == 1,
                 "backward: grad can be implicitly created only for scalar "
                 "outputs; output ",
                 i, " has sizes ", r.sizes(), ", pass a gradient");
      g = ones_like(r);
    } else {
      g = grad_roots[i];
      KILN_CHECK(g.sizes() == r.sizes(), "backward: gradient sizes ", g.sizes(), " do not match output sizes ",
                 r.sizes());
    }
    Edge e = gradient_edge(r);
    keep_alive.push_back(e.fn);
    Node* n = e.fn.get();
    auto& buf = task.buffers[n];
    buf.resize(std::max<size_t>(buf.size(), n->num_outputs()));
    accumulate_into(buf[e.input_nr], g);
    root_nodes.push_back(n);
  }

  // autograd::grad: capture gradients arriving at the inputs' edges instead of accumulating.
  const bool capture_mode = !inputs.empty();
  task.captured.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    KILN_CHECK(inputs[i].defined() && inputs[i].requires_grad(), "autograd::grad: input ", i, " does not require grad");
    Edge e = gradient_edge(inputs[i]);
    keep_alive.push_back(e.fn);
    task.captures[e.fn.get()].push_back({e.input_nr, i});
  }

  compute_dependencies(task, root_nodes);

  struct RestoreCurrentTask {
    GraphTask* prev;
    ~RestoreCurrentTask() { t_current_task = prev; }
  } restore_task{t_current_task};
  t_current_task = &task;

  struct RestoreGradMode {
    bool prev;
    ~RestoreGradMode() { GradMode::set_enabled(prev); }
  } restore{GradMode::is_enabled()};
  amp::NoAutocastGuard no_autocast;  // backward runs in the dtypes the forward chose
  GradMode::set_enabled(create_graph);

  std::priority_queue<Node*, std::vector<Node*>, ReadyOrder> ready;
  for (Node* r : root_nodes) {
    if (task.dependencies[r] == 0) {
      task.dependencies[r] = -1;  // queued
      ready.push(r);
    }
  }

  const bool anomaly = is_anomaly_enabled();
  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    TensorList grads = std::move(task.buffers[node]);
    task.buffers.erase(node);
    grads.resize(node->num_outputs());
    // Tensor hooks on non-leaf outputs, then capture for autograd::grad.
    for (uint32_t s = 0; s < grads.size(); ++s) {
      if (grads[s].defined()) grads[s] = node->run_pre_hooks(s, grads[s]);
    }
    auto cap = task.captures.find(node);
    if (cap != task.captures.end()) {
      for (auto [slot, idx] : cap->second) {
        if (slot < grads.size() && grads[slot].defined()) accumulate_into(task.captured[idx], grads[slot]);
      }
    }
    bool is_leaf_sink = dynamic_cast<AccumulateGrad*>(node) != nullptr;
    TensorList out;
    if (!(is_leaf_sink && capture_mode)) {
      bool any = false;
      for (auto& g : grads) any = any || g.defined();
      if (any || is_leaf_sink) {
        if (!is_leaf_sink) {
          // Outputs that received nothing get zeros, so closures see every gradient.
          const auto& om = node->output_meta();
          for (size_t s = 0; s < grads.size(); ++s) {
            if (!grads[s].defined() && is_floating(om[s].dtype))
              grads[s] = zeros(om[s].sizes, TensorOptions().dtype(om[s].dtype).device(om[s].device));
          }
        }
        Node* const outer = t_running_node;
        t_running_node = node;
        try {
          profiler::detail::NodeScope profiled(node->name());
          out = node->apply(std::move(grads));
        } catch (...) {
          t_running_node = outer;
          throw;
        }
        t_running_node = outer;
        if (anomaly) check_anomaly(*node, out);
      }
      if (!retain_graph) node->release();
    }
    const auto& edges = node->next_edges();
    for (size_t i = 0; i < edges.size(); ++i) {
      const Edge& e = edges[i];
      if (!e.valid()) continue;
      Node* next = e.fn.get();
      if (i < out.size() && out[i].defined()) {
        auto& buf = task.buffers[next];
        if (buf.size() < next->num_outputs()) buf.resize(next->num_outputs());
        // A gradient takes the dtype of the tensor it flows into, as in PyTorch: at an autocast
        // boundary (a bf16 result added to an f32 residual) the sum's backward hands back f32
        // for the bf16 operand, and that operand's own backward expects bf16.
        const auto& meta = next->output_meta();
        if (e.input_nr < meta.size() && out[i].dtype() != meta[e.input_nr].dtype && is_floating(meta[e.input_nr].dtype))
          out[i] = out[i].to(meta[e.input_nr].dtype);
        accumulate_into(buf[e.input_nr], std::move(out[i]));
      }
      if (--task.dependencies[next] == 0) {
        task.dependencies[next] = -1;
        ready.push(next);
      }
    }
  }

  // Callbacks may queue more callbacks; run until none is left.
  for (size_t i = 0; i < task.final_callbacks.size(); ++i) {
    auto callback = std::move(task.final_callbacks[i]);
    callback();
  }

  if (capture_mode) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      KILN_CHECK(task.captured[i].defined() || allow_unused, "autograd::grad: input ", i, " (sizes ", inputs[i].sizes(),
                 ") was not used to compute the outputs; pass "
                 "allow_unused=true to get an undefined gradient for it");
    }
  }
  return task.captured;
}

void queue_callback(std::function<void()> callback) {
  KILN_CHECK(t_current_task != nullptr,
             "autograd::queue_callback: can only be called while "
             "backward runs (from a hook or a node's backward)");
  t_current_task->final_callbacks.push_back(std::move(callback));
}

TensorList grad(const TensorList& outputs, const TensorList& inputs, const TensorList& grad_outputs, bool retain_graph,
                bool create_graph, bool allow_unused) {
  KILN_CHECK(!inputs.empty(), "autograd::grad: no inputs given");
  return run_backward(outputs, grad_outputs, retain_graph || create_graph, create_graph, inputs, allow_unused);
}

}  // namespace autograd

// ---------------------------------------------------------------- Tensor's autograd methods

bool Tensor::requires_grad() const { return defined() && impl_->autograd && impl_->autograd->requires_grad; }

Tensor& Tensor::requires_grad_(bool r) {
  KILN_CHECK(!r || is_floating(dtype()),
             "requires_grad_: only floating-point tensors can require "
             "gradients, got dtype ",
             dtype());
  auto& m = autograd::meta(*this);
  KILN_CHECK(r || !m.grad_fn, "requires_grad_(false): can only be called on leaves; use detach()");
  m.requires_grad = r;
  return *this;
}

const Tensor& Tensor::grad() const {
  static const Tensor undefined;
  if (!defined() || !impl_->autograd) return undefined;
  return impl_->autograd->grad;
}

Tensor& Tensor::mutable_grad() { return autograd::meta(*this).grad; }

void Tensor::set_grad(const Tensor& g) {
  KILN_CHECK(!g.defined() || g.sizes() == sizes(), "set_grad: gradient sizes ", g.sizes(),
             " do not match tensor sizes ", sizes());
  autograd::meta(*this).grad = g;
}

const std::shared_ptr<autograd::Node>& Tensor::grad_fn() const {
  static const std::shared_ptr<autograd::Node> none;
  if (!defined() || !impl_->autograd) return none;
  return impl_->autograd->grad_fn;
}

bool Tensor::is_leaf() const { return grad_fn() == nullptr; }
uint32_t Tensor::output_nr() const { return impl_ && impl_->autograd ? impl_->autograd->output_nr : 0; }

void Tensor::backward(const Tensor& gradient, bool retain_graph, bool create_graph) const {
  autograd::run_backward({*this}, {gradient}, retain_graph || create_graph, create_graph);
}

Tensor Tensor::detach() const {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = storage();
  impl->sizes = sizes();
  impl->strides = strides();
  impl->offset = storage_offset();
  impl->dtype = dtype();
  return Tensor(std::move(impl));
}

Tensor& Tensor::detach_() {
  if (impl_->autograd) {
    impl_->autograd->grad_fn.reset();
    impl_->autograd->requires_grad = false;
    impl_->autograd->output_nr = 0;
  }
  return *this;
}

void Tensor::retain_grad() const {
  KILN_CHECK(requires_grad(), "retain_grad: the tensor does not require grad");
  if (is_leaf()) return;  // leaves keep their grad anyway
  auto& m = autograd::meta(*this);
  if (m.retains_grad) return;
  m.retains_grad = true;
  std::weak_ptr<TensorImpl> weak = impl_;
  grad_fn()->add_pre_hook(output_nr(), [weak](const Tensor& g) {
    if (auto impl = weak.lock()) {
      Tensor self(impl);
      Tensor& slot = self.mutable_grad();
      NoGradGuard ng;
      slot = slot.defined() ? slot + g : g.clone();
    }
    return Tensor();
  });
}

size_t Tensor::register_hook(std::function<Tensor(const Tensor&)> hook) const {
  KILN_CHECK(requires_grad(),
             "register_hook: cannot register a hook on a tensor that does not "
             "require gradient");
  if (!is_leaf()) return grad_fn()->add_pre_hook(output_nr(), std::move(hook));
  static std::atomic<size_t> next{1u << 30};
  size_t h = next++;
  autograd::meta(*this).hooks.push_back({h, std::move(hook)});
  return h;
}

void Tensor::remove_hook(size_t handle) const {
  if (!is_leaf()) {
    grad_fn()->remove_pre_hook(handle);
    return;
  }
  auto& hooks = autograd::meta(*this).hooks;
  hooks.erase(std::remove_if(hooks.begin(), hooks.end(),
                             [&](const autograd::AutogradMeta::Hook& h) { return h.handle == handle; }),
              hooks.end());
}

void Tensor::register_post_accumulate_grad_hook(std::function<void(Tensor&)> hook) const {
  KILN_CHECK(requires_grad() && is_leaf(),
             "register_post_accumulate_grad_hook: only leaves that "
             "require grad accumulate gradients");
  autograd::meta(*this).post_accumulate_hooks.push_back(std::move(hook));
}

}  // namespace kiln
