#pragma once
// FusedOptimizer's step members (internal header: each optimizer's .cpp includes it and
// instantiates FusedOptimizer for its options, state and rule). They build the group's rule from
// its options and run the rule's step kernel, kernels::step_kernel<Rule>, on the device of the
// group's tensors.
#include "kiln/kernels/multi_tensor.h"
#include "kiln/optim/fused_optimizer.h"

namespace kiln::optim {

template <class Options, class ParamState, class Rule>
int FusedOptimizer<Options, ParamState, Rule>::buffers_needed(const OptimizerOptions& options) const {
  return Rule(static_cast<const Options&>(options)).num_buffers();
}

template <class Options, class ParamState, class Rule>
void FusedOptimizer<Options, ParamState, Rule>::run_step_kernel(const OptimizerOptions& options,
                                                                const kernels::MultiTensorLists& lists,
                                                                const kernels::StepScalars& scalars) const {
  const Rule rule(static_cast<const Options&>(options));
  kernels::run_multi_tensor_step(kernels::step_kernel<Rule>, rule, lists, scalars);
}

}  // namespace kiln::optim
