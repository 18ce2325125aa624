#pragma once
// kiln::optim::Optimizer: parameter groups, per-parameter state, and one fused multi-tensor step
// per group (kiln/kernels/multi_tensor.h). Follows libtorch's frontend:
//
//   kiln::optim::AdamW opt(net.parameters(), kiln::optim::AdamWOptions(3e-3).weight_decay(5e-4));
//   opt.add_param_group({head.parameters(), kiln::optim::AdamWOptions(1e-4)});  // its own options
//   loss.backward(); opt.step(); opt.zero_grad();       // zero_grad sets gradients to none
//   opt.param_groups()[0].set_lr(1e-3);                  // what LR schedules do
//
// The learning rate of a group is a host double (what schedules set and read) mirrored into a
// one-element f64 tensor on the parameters' device that the fused kernel reads, so a step never
// reads a device value back to the host. Each parameter's state (step count, the optimizer's
// buffers - Adam's moments, SGD's momentum buffer - and f32 master weights for f16/bf16
// parameters) is created on its first step with the parameter's device and layout.
//
// Each optimizer is a FusedOptimizer (kiln/optim/fused_optimizer.h) whose header holds its update
// rule, run by the generic multi-tensor launchers of kiln/kernels/multi_tensor.h and
// kernels/cuda/multi_tensor.cuh; this base class collects the group's tensors and hands them to
// the optimizer's step kernel.
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kiln/core/arg.h"
#include "kiln/core/tensor.h"

namespace kiln::kernels {
struct MultiTensorLists;
struct StepScalars;
}  // namespace kiln::kernels

namespace kiln::optim {

// (beta1, beta2) of the Adam family and LAMB; `.betas({0.9, 0.999})` works.
using Betas = std::tuple<double, double>;

// The options of one parameter group. Each optimizer has its own subclass (SGDOptions, ...).
class OptimizerOptions {
 public:
  virtual ~OptimizerOptions() = default;
  virtual std::unique_ptr<OptimizerOptions> clone() const = 0;
  virtual const char* optimizer_name() const = 0;  // "SGD", "AdamW", ...
  virtual double get_lr() const = 0;
  virtual void set_lr(double lr) = 0;
  // The momentum LR schedules cycle: SGD's and LARS's momentum, the Adam family's beta1.
  virtual double get_momentum() const = 0;
  virtual void set_momentum(double momentum) = 0;
  // Throws kiln::Error naming the bad option (negative lr, betas outside [0, 1), ...).
  virtual void validate() const = 0;
  // Every scalar option by name, for state_dict (booleans as 0/1).
  virtual std::map<std::string, double> to_map() const = 0;
  virtual void from_map(const std::map<std::string, double>& values) = 0;
};

namespace detail {
// One option in a state_dict map: doubles as they are, booleans as 0/1, betas as "beta1"/"beta2".
void put_option(std::map<std::string, double>& values, const char* key, double value);
void put_option(std::map<std::string, double>& values, const char* key, bool value);
void put_option(std::map<std::string, double>& values, const char* key, const Betas& value);
// The same read back; throws kiln::Error naming `optimizer` when the option is missing.
void get_option(const char* optimizer, const std::map<std::string, double>& values, const char* key, double& value);
void get_option(const char* optimizer, const std::map<std::string, double>& values, const char* key, bool& value);
void get_option(const char* optimizer, const std::map<std::string, double>& values, const char* key, Betas& value);
// The momentum LR schedules cycle: a plain momentum option, or beta1 of the betas.
inline double& momentum_in(double& momentum) { return momentum; }
inline double& momentum_in(Betas& betas) { return std::get<0>(betas); }
// zero_grad for one parameter (Optimizer's and ZeroRedundancyOptimizer's): its gradient dropped
// (set_to_none) or zeroed in place, first detached when it has a graph.
void zero_grad(Tensor& param, bool set_to_none);
}  // namespace detail

// What every optimizer's options implement the same way, from members of Derived:
//   kName                        the optimizer's name ("AdamW")
//   lr()                         the KILN_ARG learning rate
//   kMomentumOption              pointer to the field schedules cycle (momentum_ or betas_)
//   for_each_option(self, visit) calls visit(key, field) for each state_dict option of self
template <class Derived> class OptimizerOptionsBase : public OptimizerOptions {
 public:
  std::unique_ptr<OptimizerOptions> clone() const override { return std::make_unique<Derived>(self()); }
  const char* optimizer_name() const override { return Derived::kName; }
  double get_lr() const override { return self().lr(); }
  void set_lr(double lr) override { self().lr(lr); }
  double get_momentum() const override { return detail::momentum_in(self().*Derived::kMomentumOption); }
  void set_momentum(double m) override { detail::momentum_in(self().*Derived::kMomentumOption) = m; }
  std::map<std::string, double> to_map() const override {
    std::map<std::string, double> values;
    Derived::for_each_option(self(),
                             [&](const char* key, const auto& field) { detail::put_option(values, key, field); });
    return values;
  }
  void from_map(const std::map<std::string, double>& values) override {
    Derived::for_each_option(
        self(), [&](const char* key, auto& field) { detail::get_option(Derived::kName, values, key, field); });
  }

 private:
  // const_cast only to share momentum_in between the getter and the setter; nothing is written.
  Derived& self() const { return const_cast<Derived&>(static_cast<const Derived&>(*this)); }
};

// A list of parameters with their own options. Without options the optimizer's defaults apply.
class ParamGroup {
 public:
  ParamGroup(std::vector<Tensor> params);  // NOLINT: implicit, so a vector is a group
  ParamGroup(std::vector<Tensor> params, const OptimizerOptions& options);
  ParamGroup(const ParamGroup& other);
  ParamGroup& operator=(const ParamGroup& other);
  ParamGroup(ParamGroup&&) = default;
  ParamGroup& operator=(ParamGroup&&) = default;

  std::vector<Tensor>& params() { return params_; }
  const std::vector<Tensor>& params() const { return params_; }
  bool has_options() const { return options_ != nullptr; }
  OptimizerOptions& options();
  const OptimizerOptions& options() const;

  double lr() const { return options().get_lr(); }
  void set_lr(double lr);
  double momentum() const { return options().get_momentum(); }  // beta1 for the Adam family
  void set_momentum(double momentum);

  // The one-element f64 tensor (on the parameters' device) the fused kernel reads the lr from;
  // refreshed from lr() when they differ.
  const Tensor& lr_tensor();

 private:
  friend class Optimizer;
  std::vector<Tensor> params_;
  std::unique_ptr<OptimizerOptions> options_;
  Tensor lr_tensor_;
  double lr_tensor_value_ = 0;
};

// The state of one parameter: what every optimizer keeps, and through buffer_slots() the
// per-element buffers of its subclass (AdamParamState: exp_avg, exp_avg_sq; SGDParamState:
// momentum_buffer). Buffers are f32 (f64 for f64 parameters), with the parameter's sizes and
// strides, and undefined until the options need them (SGD without momentum has none).
class OptimizerParamState {
 public:
  virtual ~OptimizerParamState() = default;
  Tensor step;    // one-element f64 tensor on the parameter's device
  Tensor master;  // f32 master weights of an f16/bf16 parameter; undefined otherwise

  // The buffers with their state_dict names, in the order the optimizer's update rule takes them.
  using BufferSlots = std::vector<std::pair<const char*, Tensor*>>;
  virtual BufferSlots buffer_slots() = 0;
  // The same, read-only (tensor handles share the buffers' storage).
  std::vector<std::pair<const char*, Tensor>> buffers() const;
};

// What state_dict() returns and load_state_dict() takes: PyTorch's layout.
//   optimizer           the optimizer's name ("AdamW", ...); load checks it matches
//   param_groups[g]     options: every scalar option by name ("lr", "beta1", "beta2", "eps",
//                       "weight_decay", "momentum", "dampening", "nesterov", ...);
//                       params: the global indices of the group's parameters (numbered across
//                       groups in order)
//   state[i]            per-parameter tensors by name: "step" (one-element f64), the buffers by
//                       their names ("exp_avg" and "exp_avg_sq" for Adam, AdamW and LAMB,
//                       "momentum_buffer" for SGD and LARS),
//                       "master" (f32 master weights of an f16/bf16 parameter); absent before the
//                       parameter's first step
// Tensors are deep copies in both directions, so a saved dict is not changed by later steps.
// flatten()/unflatten() give a flat name -> tensor form ("param_groups.0.lr" as a 0-dim f64 tensor,
// "param_groups.0.params" as an i64 tensor, "state.3.exp_avg") for checkpoint files.
struct OptimizerStateDict {
  struct Group {
    std::map<std::string, double> options;
    std::vector<int64_t> params;
  };
  std::string optimizer;
  std::vector<Group> param_groups;
  std::map<int64_t, std::map<std::string, Tensor>> state;

  std::vector<std::pair<std::string, Tensor>> flatten() const;
  static OptimizerStateDict unflatten(const std::string& optimizer,
                                      const std::vector<std::pair<std::string, Tensor>>& items);
};

// Scalars for one step that a loss scaler hands over (both optional, one-element tensors on the
// parameters' device): skip the whole step when found_inf is nonzero; divide gradients by
// grad_scale inside the fused update.
struct StepFlags {
  Tensor found_inf;
  Tensor grad_scale;
};

class Optimizer {
 public:
  Optimizer(std::vector<ParamGroup> groups, std::unique_ptr<OptimizerOptions> defaults);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Appends a group; its parameters must not already be optimized. A group without options gets
  // a copy of the defaults; options of another optimizer's type are refused.
  void add_param_group(const ParamGroup& group);

  // One update of every parameter that has a gradient: one fused multi-tensor call per group.
  void step() { step(StepFlags{}); }
  void step(const StepFlags& flags);
  // Re-evaluates the loss (grad mode on) before stepping; returns it.
  Tensor step(const std::function<Tensor()>& closure);

  // Gradients to none (default: no memset, backward assigns) or to zero.
  void zero_grad(bool set_to_none = true);

  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  const OptimizerOptions& defaults() const { return *defaults_; }
  std::vector<Tensor> parameters() const;  // every group's, in order
  // The state of a parameter (nullptr before its first step or for unknown tensors). Each
  // optimizer also has a state() returning its own state type.
  const OptimizerParamState* state(const Tensor& param) const;

  // false: one kernel call per parameter instead of one per group (the per-parameter loop the
  // fused path is tested and benchmarked against; results are bitwise identical).
  void set_fused(bool fused) { fused_ = fused; }
  bool fused() const { return fused_; }

  OptimizerStateDict state_dict() const;
  // Restores options, step counts and state. The groups must have the same sizes as when saved.
  void load_state_dict(const OptimizerStateDict& dict);

 protected:
  void check_options_type(const OptimizerOptions& options) const;

  // What each optimizer adds: a fresh state of its type, how many of its buffers (in
  // buffer_slots() order) a group with `options` uses, and its step kernel over one group's lists.
  virtual std::unique_ptr<OptimizerParamState> make_param_state() const = 0;
  virtual int buffers_needed(const OptimizerOptions& options) const = 0;
  virtual void run_step_kernel(const OptimizerOptions& options, const kernels::MultiTensorLists& lists,
                               const kernels::StepScalars& scalars) const = 0;

 private:
  void step_group(ParamGroup& group, const StepFlags& flags);
  // The state of p, created with the buffers `options` needs; sets fresh when it created any.
  OptimizerParamState& state_for(const Tensor& p, const OptimizerOptions& options, bool& fresh);

  std::vector<ParamGroup> groups_;
  std::unique_ptr<OptimizerOptions> defaults_;
  std::unordered_map<const TensorImpl*, std::unique_ptr<OptimizerParamState>> state_;
  bool fused_ = true;
};

}  // namespace kiln::optim
