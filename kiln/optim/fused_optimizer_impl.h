#pragma once
// The step members of FusedOptimizer (internal header, included by each optimizer's .cpp). They
// find the optimizer's pieces by argument-dependent lookup in kiln::optim:
//   Rule rule_of(const Options&)                                   the update rule of a group
//   const kernels::MultiTensorStep<Rule>& step_kernel_of(const Rule&)   its registered kernel
// The .cpp defines rule_of, then KILN_FUSED_OPTIMIZER_CPU(...) for the rest.
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

// The part of an optimizer's .cpp that is the same for every optimizer (inside kiln::optim):
// step_kernel_of returns the rule's MultiTensorStep `step`, whose CPU kernel is registered here,
// and FusedOptimizer is instantiated.
#define KILN_FUSED_OPTIMIZER_CPU(Options, ParamState, Rule, step)                     \
  const kernels::MultiTensorStep<Rule>& step_kernel_of(const Rule&) { return step; }  \
  template class FusedOptimizer<Options, ParamState, Rule>;                           \
  KILN_REGISTER_KERNEL(step, CPU, &kernels::cpu::multi_tensor_step<Rule>)
