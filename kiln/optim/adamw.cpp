#include "kiln/optim/adamw.h"

namespace kiln::optim {

void AdamWOptions::validate() const {
  detail::validate_adam_like("AdamW", lr_, betas_, eps_, weight_decay_);
}

math::OptimHyper AdamWOptions::hyper() const {
  math::OptimHyper h;
  h.algo = math::OptimAlgo::Adam;
  h.beta1 = std::get<0>(betas_);
  h.beta2 = std::get<1>(betas_);
  h.eps = eps_;
  h.weight_decay = weight_decay_;
  h.decoupled = true;
  h.maximize = maximize_;
  return h;
}

std::map<std::string, double> AdamWOptions::to_map() const {
  return detail::adam_like_map(lr_, betas_, eps_, weight_decay_, maximize_);
}
void AdamWOptions::from_map(const std::map<std::string, double>& m) {
  detail::adam_like_from_map("AdamW", m, lr_, betas_, eps_, weight_decay_, maximize_);
}

AdamW::AdamW(std::vector<Tensor> params, const AdamWOptions& options)
    : Optimizer({ParamGroup(std::move(params))}, options.clone()) {}
AdamW::AdamW(std::vector<ParamGroup> groups, const AdamWOptions& options)
    : Optimizer(std::move(groups), options.clone()) {}

}  // namespace kiln::optim
