#include "kiln/optim/adam.h"

#include "kiln/optim/fused_optimizer_impl.h"

#include "kiln/core/error.h"

namespace kiln::optim {

namespace detail {

void validate_adam_like(const char* name, double lr, const Betas& betas, double eps, double weight_decay) {
  KILN_CHECK(lr >= 0.0, name, ": invalid learning rate ", lr, " (must be >= 0)");
  KILN_CHECK(eps >= 0.0, name, ": invalid eps ", eps, " (must be >= 0)");
  const double b1 = std::get<0>(betas), b2 = std::get<1>(betas);
  KILN_CHECK(b1 >= 0.0 && b1 < 1.0, name, ": invalid beta1 ", b1, " (must be in [0, 1))");
  KILN_CHECK(b2 >= 0.0 && b2 < 1.0, name, ": invalid beta2 ", b2, " (must be in [0, 1))");
  KILN_CHECK(weight_decay >= 0.0, name, ": invalid weight_decay ", weight_decay, " (must be >= 0)");
}

}  // namespace detail

// Adam's step: FusedOptimizer's step members for it, and on the CPU the generic multi-tensor launcher
// run with AdamRule.
template class FusedOptimizer<AdamOptions, AdamParamState, AdamRule>;
KILN_REGISTER_KERNEL(kernels::step_kernel<AdamRule>, CPU, &kernels::cpu::multi_tensor_step<AdamRule>);

}  // namespace kiln::optim
