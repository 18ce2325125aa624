#pragma once
// Custom autograd functions written as in libtorch (torch/csrc/api/include/torch/autograd.h):
//
//   struct MulExp : kiln::autograd::Function<MulExp> {
//     static Tensor forward(AutogradContext* ctx, Tensor x, double scale) {
//       ctx->saved_data["scale"] = scale;
//       auto y = x * x.exp() * scale;
//       ctx->save_for_backward({x});
//       return y;
//     }
//     static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
//       auto x = ctx->get_saved_variables()[0];
//       double scale = ctx->saved_data["scale"].toDouble();
//       return {grad_outputs[0] * (x + 1.0) * x.exp() * scale};
//     }
//   };
//   auto y = MulExp::apply(x, 2.0);
//
// T::apply(args...) runs T::forward under NoGradGuard, then (grad mode on, a Tensor argument
// requires grad) records one node whose backward calls T::backward. Tensor arguments (a Tensor
// or a std::vector<Tensor>, flattened in order) are the node's inputs; backward returns one
// gradient per such input, undefined where there is none (extra trailing undefined entries are
// allowed, for arguments that are not tensors). forward returns a Tensor or a variable_list.
// The engine hands backward one gradient per output, zeros for an output that received none.
//
// saved_data holds anything (an IValue wraps a std::any; numbers, bools, strings, IntLists and
// Tensors have libtorch's accessors toInt/toDouble/...). Keep tensors for backward with
// save_for_backward instead: those are version-checked, and saving an output does not make a
// reference cycle. See docs/guide.md ("Custom autograd functions").
#include <any>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "kiln/core/autograd.h"
#include "kiln/core/error.h"
#include "kiln/core/tensor.h"

namespace kiln {
namespace autograd {

using variable_list = std::vector<Tensor>;

// A value kept in AutogradContext::saved_data: libtorch's IValue, reduced to a std::any with
// its usual accessors. Integers are stored as int64_t, floating values as double, string
// literals as std::string; anything else as given (read it back with to<T>()).
class IValue {
 public:
  IValue() = default;
  template <class T, class D = std::decay_t<T>, class = std::enable_if_t<!std::is_same<D, IValue>::value>>
  IValue(T&& v) {  // NOLINT: implicit, as libtorch's
    if constexpr (std::is_same<D, bool>::value) {
      v_ = static_cast<bool>(v);
    } else if constexpr (std::is_integral<D>::value) {
      v_ = static_cast<int64_t>(v);
    } else if constexpr (std::is_floating_point<D>::value) {
      v_ = static_cast<double>(v);
    } else if constexpr (std::is_same<D, const char*>::value || std::is_same<D, char*>::value) {
      v_ = std::string(v);
    } else if constexpr (std::is_same<D, std::vector<int64_t>>::value) {
      v_ = IntList(v);
    } else {
      v_ = D(std::forward<T>(v));
    }
  }

  bool isNone() const { return !v_.has_value(); }
  bool isInt() const { return is<int64_t>(); }
  bool isDouble() const { return is<double>(); }
  bool isBool() const { return is<bool>(); }
  bool isString() const { return is<std::string>(); }
  bool isTensor() const { return is<Tensor>(); }
  bool isIntList() const { return is<IntList>(); }

  int64_t toInt() const { return get<int64_t>("int"); }
  // An int reads back as a double too.
  double toDouble() const { return isInt() ? static_cast<double>(toInt()) : get<double>("double"); }
  bool toBool() const { return get<bool>("bool"); }
  const std::string& toStringRef() const { return get_ref<std::string>("string"); }
  std::string toString() const { return toStringRef(); }
  Tensor toTensor() const { return get<Tensor>("Tensor"); }
  IntList toIntList() const { return get<IntList>("IntList"); }
  std::vector<int64_t> toIntVector() const { return get<IntList>("IntList"); }
  std::vector<double> toDoubleVector() const { return get<std::vector<double>>("vector<double>"); }
  template <class T> T to() const { return get<T>(typeid(T).name()); }

  const std::any& any() const { return v_; }

 private:
  template <class T> bool is() const { return v_.type() == typeid(T); }
  template <class T> const T& get_ref(const char* want) const {
    const T* p = std::any_cast<T>(&v_);
    KILN_CHECK(p != nullptr, "AutogradContext::saved_data: expected a value of type ", want, ", got ",
               v_.has_value() ? "another type" : "none");
    return *p;
  }
  template <class T> T get(const char* want) const { return get_ref<T>(want); }

  std::any v_;
};

class AutogradContext {
 public:
  AutogradContext() = default;
  AutogradContext(const AutogradContext&) = delete;
  AutogradContext& operator=(const AutogradContext&) = delete;

  // Anything backward needs that is not a tensor to save (sizes, flags, scalars).
  std::unordered_map<std::string, IValue> saved_data;

  // Call from forward: the tensors backward reads back with get_saved_variables(). They are
  // saved once forward has returned, as SavedTensors: an in-place change after that makes
  // get_saved_variables() throw. Inputs, outputs and intermediates may all be saved.
  void save_for_backward(variable_list to_save);
  // Call from backward.
  variable_list get_saved_variables() const;

  // Inputs forward modified in place; each must also be returned as an output, and it then
  // gets this node as its grad_fn (a leaf that requires grad cannot be modified in place).
  void mark_dirty(const variable_list& inputs);
  // Outputs that get no gradient (indices, masks): they do not require grad.
  void mark_non_differentiable(const variable_list& outputs);
  // Whether the i-th Tensor input (counting the tensors inside vector arguments) needs a
  // gradient; backward may skip computing the others. Valid in forward and backward.
  bool needs_input_grad(size_t index) const;

  // The implementation's side (Function<T>::apply and its node).
  struct Internal;

 private:
  friend struct Internal;
  variable_list to_save_;
  bool saved_ = false;
  std::vector<SavedTensor> saved_variables_;
  std::vector<bool> needs_input_grad_;
  std::unordered_set<const TensorImpl*> dirty_;
  std::unordered_set<const TensorImpl*> non_differentiable_;
  std::string name_;
  bool released_ = false;
};

struct AutogradContext::Internal {
  static void prepare(AutogradContext& ctx, const variable_list& inputs, std::string name);
  static void save(AutogradContext& ctx, const variable_list& outputs);
  static const std::unordered_set<const TensorImpl*>& dirty(const AutogradContext& c) { return c.dirty_; }
  static const std::unordered_set<const TensorImpl*>& non_differentiable(const AutogradContext& c) {
    return c.non_differentiable_;
  }
  static void release(AutogradContext& c);
  static bool released(const AutogradContext& c) { return c.released_; }
};

namespace detail {

// Demangled type name of a custom Function, for node names and errors.
std::string function_name(const std::type_info& t);

inline void collect_tensors(variable_list&) {}
template <class A, class... Rest> void collect_tensors(variable_list& out, const A& a, const Rest&... rest) {
  using D = std::decay_t<A>;
  if constexpr (std::is_same<D, Tensor>::value) {
    out.push_back(a);
  } else if constexpr (std::is_same<D, std::vector<Tensor>>::value) {
    out.insert(out.end(), a.begin(), a.end());
  }
  collect_tensors(out, rest...);
}

// The node a custom function records: backward is T::backward, validated.
class CustomFunctionNode final : public Node {
 public:
  using Backward = variable_list (*)(AutogradContext*, variable_list);
  CustomFunctionNode(std::string name, Backward backward, std::vector<IntList> input_sizes,
                     std::shared_ptr<AutogradContext> ctx);
  TensorList apply(TensorList&& grad_outputs) override;
  void release() override;
  bool released() const override;

 private:
  Backward backward_;
  std::vector<IntList> input_sizes_;  // empty IntList + undefined marker: see input_defined_
  std::vector<bool> input_defined_;
  std::shared_ptr<AutogradContext> ctx_;
};

// After forward: checks dirty/aliasing outputs, records the node, saves the tensors.
void finish_apply(const std::string& name, CustomFunctionNode::Backward backward,
                  const std::shared_ptr<AutogradContext>& ctx, const variable_list& inputs, variable_list& outputs,
                  bool record_node);

}  // namespace detail

template <class T> struct Function {
  template <class... Args> static auto apply(Args&&... args) {
    variable_list inputs;
    detail::collect_tensors(inputs, args...);
    auto ctx = std::make_shared<AutogradContext>();
    const bool record_node = any_requires_grad(inputs);
    AutogradContext::Internal::prepare(*ctx, inputs, detail::function_name(typeid(T)));
    using Out = decltype(T::forward(ctx.get(), std::forward<Args>(args)...));
    static_assert(std::is_same<Out, Tensor>::value || std::is_same<Out, variable_list>::value,
                  "a custom Function's forward must return a Tensor or a variable_list");
    variable_list outputs;
    {
      NoGradGuard no_grad;
      if constexpr (std::is_same<Out, Tensor>::value) {
        outputs.push_back(T::forward(ctx.get(), std::forward<Args>(args)...));
      } else {
        outputs = T::forward(ctx.get(), std::forward<Args>(args)...);
      }
    }
    detail::finish_apply(detail::function_name(typeid(T)), &T::backward, ctx, inputs, outputs, record_node);
    if constexpr (std::is_same<Out, Tensor>::value) {
      return outputs[0];
    } else {
      return outputs;
    }
  }
};

}  // namespace autograd
}  // namespace kiln
