#include "kiln/optim/lamb.h"

namespace kiln::optim {

void LAMBOptions::validate() const {
  detail::validate_adam_like("LAMB", lr_, betas_, eps_, weight_decay_);
}

math::OptimHyper LAMBOptions::hyper() const {
  math::OptimHyper h;
  h.algo = math::OptimAlgo::LAMB;
  h.beta1 = std::get<0>(betas_);
  h.beta2 = std::get<1>(betas_);
  h.eps = eps_;
  h.weight_decay = weight_decay_;
  h.bias_correction = bias_correction_;
  h.maximize = maximize_;
  return h;
}

std::map<std::string, double> LAMBOptions::to_map() const {
  auto m = detail::adam_like_map(lr_, betas_, eps_, weight_decay_, maximize_);
  m["bias_correction"] = bias_correction_ ? 1.0 : 0.0;
  return m;
}
void LAMBOptions::from_map(const std::map<std::string, double>& m) {
  detail::adam_like_from_map("LAMB", m, lr_, betas_, eps_, weight_decay_, maximize_);
  bias_correction_ = detail::map_get("LAMB", m, "bias_correction") != 0.0;
}

LAMB::LAMB(std::vector<Tensor> params, const LAMBOptions& options)
    : Optimizer({ParamGroup(std::move(params))}, options.clone()) {}
LAMB::LAMB(std::vector<ParamGroup> groups, const LAMBOptions& options)
    : Optimizer(std::move(groups), options.clone()) {}

}  // namespace kiln::optim
