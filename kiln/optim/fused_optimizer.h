#pragma once
// FusedOptimizer: what every kiln optimizer is, an Optimizer whose step runs one update rule over
// a whole parameter group in one multi-tensor call. An optimizer is three files:
//   <name>.h    its options, its per-parameter state, its update rule and its class
//   <name>.cpp  its option checks, and two lines: FusedOptimizer instantiated for it (the step
//               members, kiln/optim/fused_optimizer_impl.h) and the CPU launcher registered
//   <name>.cu   one line registering the CUDA launcher for its rule
// The rule is a host/device struct (contract in kiln/kernels/multi_tensor.h) built from a group's
// options; its step kernel is kernels::step_kernel<Rule>. See docs/architecture.md, "Optimizers".
#include <memory>
#include <utility>
#include <vector>

#include "kiln/core/macros.h"
#include "kiln/core/optimizer_rule.h"
#include "kiln/optim/optimizer.h"

namespace kiln::optim {

// An optimizer over options `Options`, per-parameter state `ParamState` and the update rule `Rule`:
// the constructors and state() of the libtorch frontend.
template <class Options, class ParamState, class Rule> class FusedOptimizer : public Optimizer {
 public:
  FusedOptimizer(std::vector<Tensor> params, const Options& options = {})
      : Optimizer({ParamGroup(std::move(params))}, options.clone()) {}
  FusedOptimizer(std::vector<ParamGroup> groups, const Options& options = {})
      : Optimizer(std::move(groups), options.clone()) {}
  // This optimizer's state of `param` (nullptr before its first step).
  const ParamState* state(const Tensor& param) const { return static_cast<const ParamState*>(Optimizer::state(param)); }

 protected:
  std::unique_ptr<OptimizerParamState> make_param_state() const override { return std::make_unique<ParamState>(); }
  // Defined in kiln/optim/fused_optimizer_impl.h (they reach the kernels, which public headers
  // must not), instantiated in the optimizer's .cpp.
  int buffers_needed(const OptimizerOptions& options) const override;
  void run_step_kernel(const OptimizerOptions& options, const kernels::MultiTensorLists& lists,
                       const kernels::StepScalars& scalars) const override;
};

}  // namespace kiln::optim
