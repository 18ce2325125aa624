#include "kiln/optim/sgd.h"

#include "kiln/core/error.h"
#include "kiln/optim/fused_optimizer_impl.h"
#include "kiln/optim/sgd_rule.h"

namespace kiln::optim {

void SGDOptions::validate() const {
  KILN_CHECK(lr_ >= 0.0, "SGD: invalid learning rate ", lr_, " (must be >= 0)");
  KILN_CHECK(momentum_ >= 0.0, "SGD: invalid momentum ", momentum_, " (must be >= 0)");
  KILN_CHECK(weight_decay_ >= 0.0, "SGD: invalid weight_decay ", weight_decay_, " (must be >= 0)");
  KILN_CHECK(!nesterov_ || (momentum_ > 0.0 && dampening_ == 0.0),
             "SGD: nesterov momentum requires a momentum > 0 and zero dampening (got momentum ",
             momentum_, ", dampening ", dampening_, ")");
}

SGDRule rule_of(const SGDOptions& o) {
  return SGDRule{{o.momentum(), o.dampening(), o.weight_decay(), o.nesterov(), o.maximize()}};
}
KILN_FUSED_OPTIMIZER_CPU(SGDOptions, SGDParamState, SGDRule, sgd_step);

}  // namespace kiln::optim
