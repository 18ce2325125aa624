#include "kiln/optim/lamb.h"

#include "kiln/optim/fused_optimizer_impl.h"
#include "kiln/optim/lamb_rule.h"

namespace kiln::optim {

LAMBRule rule_of(const LAMBOptions& o) {
  return LAMBRule{std::get<0>(o.betas()), std::get<1>(o.betas()), o.eps(), o.weight_decay(),
                  o.bias_correction(), o.maximize()};
}
KILN_FUSED_OPTIMIZER_CPU(LAMBOptions, AdamParamState, LAMBRule, lamb_step);

}  // namespace kiln::optim
