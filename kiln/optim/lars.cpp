#include "kiln/optim/lars.h"

#include "kiln/core/error.h"
#include "kiln/optim/adam.h"  // detail::map_get

namespace kiln::optim {

void LARSOptions::validate() const {
  KILN_CHECK(lr_ >= 0.0, "LARS: invalid learning rate ", lr_, " (must be >= 0)");
  KILN_CHECK(momentum_ >= 0.0, "LARS: invalid momentum ", momentum_, " (must be >= 0)");
  KILN_CHECK(weight_decay_ >= 0.0, "LARS: invalid weight_decay ", weight_decay_, " (must be >= 0)");
  KILN_CHECK(trust_coefficient_ > 0.0, "LARS: invalid trust_coefficient ", trust_coefficient_,
             " (must be > 0)");
  KILN_CHECK(eps_ >= 0.0, "LARS: invalid eps ", eps_, " (must be >= 0)");
  KILN_CHECK(!nesterov_ || (momentum_ > 0.0 && dampening_ == 0.0),
             "LARS: nesterov momentum requires a momentum > 0 and zero dampening");
}

math::OptimHyper LARSOptions::hyper() const {
  math::OptimHyper h;
  h.algo = math::OptimAlgo::LARS;
  h.momentum = momentum_;
  h.dampening = dampening_;
  h.weight_decay = weight_decay_;
  h.trust_coefficient = trust_coefficient_;
  h.eps = eps_;
  h.nesterov = nesterov_;
  h.maximize = maximize_;
  return h;
}

std::map<std::string, double> LARSOptions::to_map() const {
  return {{"lr", lr_}, {"momentum", momentum_}, {"dampening", dampening_},
          {"weight_decay", weight_decay_}, {"trust_coefficient", trust_coefficient_},
          {"eps", eps_}, {"nesterov", nesterov_ ? 1.0 : 0.0}, {"maximize", maximize_ ? 1.0 : 0.0}};
}

void LARSOptions::from_map(const std::map<std::string, double>& m) {
  lr_ = detail::map_get("LARS", m, "lr");
  momentum_ = detail::map_get("LARS", m, "momentum");
  dampening_ = detail::map_get("LARS", m, "dampening");
  weight_decay_ = detail::map_get("LARS", m, "weight_decay");
  trust_coefficient_ = detail::map_get("LARS", m, "trust_coefficient");
  eps_ = detail::map_get("LARS", m, "eps");
  nesterov_ = detail::map_get("LARS", m, "nesterov") != 0.0;
  maximize_ = detail::map_get("LARS", m, "maximize") != 0.0;
}

LARS::LARS(std::vector<Tensor> params, const LARSOptions& options)
    : Optimizer({ParamGroup(std::move(params))}, options.clone()) {}
LARS::LARS(std::vector<ParamGroup> groups, const LARSOptions& options)
    : Optimizer(std::move(groups), options.clone()) {}

}  // namespace kiln::optim
