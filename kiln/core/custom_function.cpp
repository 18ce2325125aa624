#include "kiln/core/custom_function.h"

#include <cxxabi.h>

#include <cstdlib>

namespace kiln {
namespace autograd {

// ---------------------------------------------------------------- AutogradContext

void AutogradContext::save_for_backward(variable_list to_save) {
  KILN_CHECK(!saved_, name_, ": save_for_backward can only be called from forward");
  to_save_ = std::move(to_save);
}

variable_list AutogradContext::get_saved_variables() const {
  KILN_CHECK(!released_, name_,
             ": the saved tensors were freed after the first backward; pass "
             "retain_graph=true to the first backward() to keep them");
  KILN_CHECK(saved_, name_, ": get_saved_variables can only be called from backward");
  variable_list out;
  out.reserve(saved_variables_.size());
  for (const auto& s : saved_variables_) out.push_back(s.defined() ? s.get() : Tensor());
  return out;
}

void AutogradContext::mark_dirty(const variable_list& inputs) {
  for (const auto& t : inputs)
    if (t.defined()) dirty_.insert(t.impl_ptr().get());
}

void AutogradContext::mark_non_differentiable(const variable_list& outputs) {
  for (const auto& t : outputs)
    if (t.defined()) non_differentiable_.insert(t.impl_ptr().get());
}

bool AutogradContext::needs_input_grad(size_t index) const {
  KILN_CHECK(index < needs_input_grad_.size(), name_, ": needs_input_grad(", index, "): the function has ",
             needs_input_grad_.size(), " Tensor inputs");
  return needs_input_grad_[index];
}

void AutogradContext::Internal::prepare(AutogradContext& ctx, const variable_list& inputs, std::string name) {
  ctx.name_ = std::move(name);
  ctx.needs_input_grad_.clear();
  const bool grad = GradMode::is_enabled();
  for (const auto& t : inputs) ctx.needs_input_grad_.push_back(grad && t.defined() && t.requires_grad());
}

void AutogradContext::Internal::save(AutogradContext& ctx, const variable_list& outputs) {
  ctx.saved_variables_.clear();
  for (const auto& t : ctx.to_save_) {
    if (!t.defined()) {
      ctx.saved_variables_.emplace_back();
      continue;
    }
    size_t k = 0;
    while (k < outputs.size() && !outputs[k].is_same(t)) ++k;
    // An output is saved weakly (SavedTensor::output): holding it would make a cycle
    // output -> node -> context -> output.
    ctx.saved_variables_.push_back(k < outputs.size()
                                       ? SavedTensor::output(outputs[k], ctx.name_.c_str(), static_cast<uint32_t>(k))
                                       : SavedTensor(t, ctx.name_.c_str()));
  }
  ctx.to_save_.clear();
  ctx.saved_ = true;
}

void AutogradContext::Internal::release(AutogradContext& c) {
  c.saved_variables_.clear();
  c.saved_data.clear();
  c.released_ = true;
}

namespace detail {

std::string function_name(const std::type_info& t) {
  int status = 0;
  char* d = abi::__cxa_demangle(t.name(), nullptr, nullptr, &status);
  std::string s = (status == 0 && d) ? d : t.name();
  std::free(d);
  return s;
}

// ---------------------------------------------------------------- the node

CustomFunctionNode::CustomFunctionNode(std::string name, Backward backward, std::vector<IntList> input_sizes,
                                       std::shared_ptr<AutogradContext> ctx)
    : Node(std::move(name)), backward_(backward), input_sizes_(std::move(input_sizes)), ctx_(std::move(ctx)) {}

TensorList CustomFunctionNode::apply(TensorList&& grad_outputs) {
  KILN_CHECK(!released(), "backward through ", name(),
             " a second time: its saved tensors were "
             "freed after the first backward; pass retain_graph=true to the first backward() to "
             "keep them");
  variable_list grads = backward_(ctx_.get(), std::move(grad_outputs));
  const size_t n = input_sizes_.size();
  if (grads.size() > n) {
    // Trailing undefined gradients stand for arguments that are not tensors.
    bool extras_undefined = true;
    for (size_t i = n; i < grads.size(); ++i) extras_undefined = extras_undefined && !grads[i].defined();
    if (extras_undefined) grads.resize(n);
  }
  KILN_CHECK(grads.size() == n, name(), ": backward returned ", grads.size(), " gradients, expected ", n,
             " (one per Tensor input, undefined where there is none)");
  const auto& edges = next_edges();
  for (size_t i = 0; i < n; ++i) {
    if (!grads[i].defined()) continue;
    KILN_CHECK(grads[i].sizes() == input_sizes_[i], name(), ": backward returned a gradient of sizes ",
               grads[i].sizes(), " for input ", i, ", which has sizes ", input_sizes_[i]);
    if (!edges[i].valid()) grads[i] = Tensor();  // that input needs no gradient
  }
  return grads;
}

void CustomFunctionNode::release() { AutogradContext::Internal::release(*ctx_); }
bool CustomFunctionNode::released() const { return AutogradContext::Internal::released(*ctx_); }

void finish_apply(const std::string& name, CustomFunctionNode::Backward backward,
                  const std::shared_ptr<AutogradContext>& ctx, const variable_list& inputs, variable_list& outputs,
                  bool record_node) {
  const auto& dirty = AutogradContext::Internal::dirty(*ctx);
  for (const TensorImpl* d : dirty) {
    bool is_input = false, returned = false;
    for (const auto& t : inputs) is_input = is_input || (t.defined() && t.impl_ptr().get() == d);
    for (const auto& t : outputs) returned = returned || (t.defined() && t.impl_ptr().get() == d);
    KILN_CHECK(is_input, name, ": mark_dirty was given a tensor that is not an input");
    KILN_CHECK(returned, name,
               ": an input marked dirty (modified in place) must be returned as "
               "an output");
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    Tensor& out = outputs[i];
    KILN_CHECK(out.defined(), name, ": forward returned an undefined tensor as output ", i);
    const TensorImpl* impl = out.impl_ptr().get();
    bool seen_before = false;
    for (size_t j = 0; j < i; ++j) seen_before = seen_before || outputs[j].impl_ptr().get() == impl;
    bool is_input = false;
    for (const auto& t : inputs) is_input = is_input || (t.defined() && t.impl_ptr().get() == impl);
    if (dirty.count(impl) && !seen_before) {
      KILN_CHECK(!(record_node && out.is_leaf() && out.requires_grad()), name,
                 ": a leaf tensor that requires grad was modified in place (mark_dirty); modify a "
                 "copy, or do it under NoGradGuard");
    } else if (is_input || seen_before) {
      out = out.detach();  // an input returned as is: a new tensor on the same data
    }
  }
  if (!record_node) return;
  std::vector<IntList> sizes;
  std::vector<const Tensor*> in_ptrs;
  for (const auto& t : inputs) {
    sizes.push_back(t.defined() ? t.sizes() : IntList());
    in_ptrs.push_back(&t);
  }
  auto node = std::make_shared<CustomFunctionNode>(name + "Backward", backward, std::move(sizes), ctx);
  std::vector<Tensor*> out_ptrs;
  for (auto& t : outputs) out_ptrs.push_back(&t);
  record(node, in_ptrs, out_ptrs);
  const auto& non_diff = AutogradContext::Internal::non_differentiable(*ctx);
  for (auto& t : outputs) {
    if (!non_diff.count(t.impl_ptr().get()) || !t.impl()->autograd) continue;
    t.impl()->autograd->requires_grad = false;
    t.impl()->autograd->grad_fn.reset();
  }
  AutogradContext::Internal::save(*ctx, outputs);
}

}  // namespace detail
}  // namespace autograd
}  // namespace kiln
