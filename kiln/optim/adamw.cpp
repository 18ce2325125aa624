#include "kiln/optim/adamw.h"

#include "kiln/optim/adamw_rule.h"
#include "kiln/optim/fused_optimizer_impl.h"

namespace kiln::optim {

AdamWRule rule_of(const AdamWOptions& o) {
  return AdamWRule{std::get<0>(o.betas()), std::get<1>(o.betas()), o.eps(), o.weight_decay(), o.maximize()};
}
KILN_FUSED_OPTIMIZER_CPU(AdamWOptions, AdamParamState, AdamWRule, adamw_step);

}  // namespace kiln::optim
