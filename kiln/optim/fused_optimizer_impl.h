#pragma once
// The step members of FusedOptimizer (internal header, included by each optimizer's .cpp). They
// find the optimizer's pieces by argument-dependent lookup in kiln::optim:
//   Rule rule_of(const Options&)                                   the update rule of a group
//   const kernels::MultiTensorStep<Rule>& step_kernel_of(const Rule&)   its registered kernel
// The .cpp defines both, then instantiates `template class FusedOptimizer<Options, ParamState, Rule>;`.
#include "kiln/kernels/multi_tensor.h"
#include "kiln/optim/optimizer.h"

namespace kiln::optim {

template <class Options, class ParamState, class Rule>
int FusedOptimizer<Options, ParamState, Rule>::buffers_needed(const OptimizerOptions& options) const {
  return rule_of(static_cast<const Options&>(options)).num_buffers();
}

template <class Options, class ParamState, class Rule>
void FusedOptimizer<Options, ParamState, Rule>::run_step_kernel(const OptimizerOptions& options,
                                                                const kernels::MultiTensorLists& lists,
                                                                const kernels::StepScalars& scalars) const {
  const Rule rule = rule_of(static_cast<const Options&>(options));
  kernels::run_multi_tensor_step(step_kernel_of(rule), rule, lists, scalars);
}

}  // namespace kiln::optim
