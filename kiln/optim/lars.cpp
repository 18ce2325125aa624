#include "kiln/optim/lars.h"

#include "kiln/optim/fused_optimizer_impl.h"

#include "kiln/core/error.h"

namespace kiln::optim {

void LARSOptions::validate() const {
  KILN_CHECK(lr_ >= 0.0, "LARS: invalid learning rate ", lr_, " (must be >= 0)");
  KILN_CHECK(momentum_ >= 0.0, "LARS: invalid momentum ", momentum_, " (must be >= 0)");
  KILN_CHECK(weight_decay_ >= 0.0, "LARS: invalid weight_decay ", weight_decay_, " (must be >= 0)");
  KILN_CHECK(trust_coefficient_ > 0.0, "LARS: invalid trust_coefficient ", trust_coefficient_, " (must be > 0)");
  KILN_CHECK(eps_ >= 0.0, "LARS: invalid eps ", eps_, " (must be >= 0)");
  KILN_CHECK(!nesterov_ || (momentum_ > 0.0 && dampening_ == 0.0),
             "LARS: nesterov momentum requires a momentum > 0 and zero dampening");
}

// LARS's step: FusedOptimizer's step members for it, and on the CPU the generic multi-tensor launcher
// run with LARSRule.
template class FusedOptimizer<LARSOptions, SGDParamState, LARSRule>;
KILN_REGISTER_KERNEL(kernels::step_kernel<LARSRule>, CPU, &kernels::cpu::multi_tensor_step<LARSRule>);

}  // namespace kiln::optim
