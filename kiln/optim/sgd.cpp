#include "kiln/optim/sgd.h"

#include "kiln/optim/fused_optimizer_impl.h"

#include "kiln/core/error.h"

namespace kiln::optim {

void SGDOptions::validate() const {
  KILN_CHECK(lr_ >= 0.0, "SGD: invalid learning rate ", lr_, " (must be >= 0)");
  KILN_CHECK(momentum_ >= 0.0, "SGD: invalid momentum ", momentum_, " (must be >= 0)");
  KILN_CHECK(weight_decay_ >= 0.0, "SGD: invalid weight_decay ", weight_decay_, " (must be >= 0)");
  KILN_CHECK(!nesterov_ || (momentum_ > 0.0 && dampening_ == 0.0),
             "SGD: nesterov momentum requires a momentum > 0 and zero dampening (got momentum ", momentum_,
             ", dampening ", dampening_, ")");
}

// SGD's step: FusedOptimizer's step members for it, and on the CPU the generic multi-tensor launcher
// run with SGDRule.
template class FusedOptimizer<SGDOptions, SGDParamState, SGDRule>;
KILN_REGISTER_KERNEL(kernels::step_kernel<SGDRule>, CPU, &kernels::cpu::multi_tensor_step<SGDRule>);

}  // namespace kiln::optim
