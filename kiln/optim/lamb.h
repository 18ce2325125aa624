#pragma once
// LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning"; defaults as NVIDIA apex
// FusedLAMB). Per parameter tensor:
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   r = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + weight_decay * p   (no bias correction
//       when bias_correction(false))
//   p -= lr * trust * r,  trust = ||p|| / ||r|| when both are non-zero, else 1
// Global gradient-norm clipping (apex's max_grad_norm) is left to kiln::optim::clip_grad_norm.
#include "kiln/optim/adam.h"

namespace kiln::optim {

// lr, betas (0.9, 0.999), eps, weight_decay and maximize (false) as detail::AdamLikeOptions, and:
class LAMBOptions : public detail::AdamLikeOptions<LAMBOptions> {
 public:
  static constexpr const char* kName = "LAMB";
  LAMBOptions(double lr = 1e-3)  // NOLINT: implicit, like libtorch
      : AdamLikeOptions(lr, /*eps=*/1e-6, /*weight_decay=*/1e-2) {}
  KILN_ARG(bool, bias_correction) = true;

 public:
  template <class Visit>
  static void for_each_option(LAMBOptions& self, Visit&& visit) {
    AdamLikeOptions::for_each_option(self, visit);
    visit("bias_correction", self.bias_correction_);
  }
};

struct LAMBRule;
class LAMB : public FusedOptimizer<LAMBOptions, AdamParamState, LAMBRule> {
 public:
  using FusedOptimizer::FusedOptimizer;
};

}  // namespace kiln::optim
