#pragma once
// LARS (You et al. 2017, "Large Batch Training of Convolutional Networks"; momentum as in
// torchlars / NVIDIA's LARS). Per parameter tensor:
//   trust = trust_coefficient * ||p|| / (||g|| + weight_decay * ||p|| + eps)  (1 if a norm is 0)
//   d = trust * (g + weight_decay * p)
//   buf = d (first step) | momentum * buf + (1 - dampening) * d;  d = nesterov ? d + momentum * buf : buf
//   p -= lr * d
// Every tensor of a LARS optimizer is adapted (excluding biases / norm weights is not supported yet).
#include "kiln/optim/sgd.h"  // SGDParamState

namespace kiln::optim {

// lr, momentum (0.9), dampening (0), weight_decay (0), nesterov and maximize (false) as
// detail::SGDLikeOptions, and:
class LARSOptions : public detail::SGDLikeOptions<LARSOptions> {
 public:
  static constexpr const char* kName = "LARS";
  LARSOptions(double lr = 1e-3) : SGDLikeOptions(lr, /*momentum=*/0.9) {}  // NOLINT: implicit, like libtorch
  KILN_ARG(double, trust_coefficient) = 1e-3;
  KILN_ARG(double, eps) = 1e-8;

 public:
  template <class Visit>
  static void for_each_option(LARSOptions& self, Visit&& visit) {
    detail::visit_sgd_like(visit, self.lr_, self.momentum_, self.dampening_, self.weight_decay_);
    visit("trust_coefficient", self.trust_coefficient_);
    visit("eps", self.eps_);
    visit("nesterov", self.nesterov_);
    visit("maximize", self.maximize_);
  }
  void validate() const override;
};

struct LARSRule;
class LARS : public FusedOptimizer<LARSOptions, SGDParamState, LARSRule> {
 public:
  using FusedOptimizer::FusedOptimizer;
};

}  // namespace kiln::optim
