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

class LAMBOptions : public OptimizerOptions {
 public:
  LAMBOptions() = default;
  LAMBOptions(double lr) : lr_(lr) {}  // NOLINT: implicit, like libtorch
  KILN_ARG(double, lr) = 1e-3;
  KILN_ARG(Betas, betas) = std::make_tuple(0.9, 0.999);
  KILN_ARG(double, eps) = 1e-6;
  KILN_ARG(double, weight_decay) = 1e-2;
  KILN_ARG(bool, bias_correction) = true;
  KILN_ARG(bool, maximize) = false;

 public:
  std::unique_ptr<OptimizerOptions> clone() const override { return std::make_unique<LAMBOptions>(*this); }
  const char* optimizer_name() const override { return "LAMB"; }
  double get_lr() const override { return lr_; }
  void set_lr(double lr) override { lr_ = lr; }
  double get_momentum() const override { return std::get<0>(betas_); }
  void set_momentum(double m) override { std::get<0>(betas_) = m; }
  void validate() const override;
  std::map<std::string, double> to_map() const override;
  void from_map(const std::map<std::string, double>& values) override;
};

class LAMB : public Optimizer {
 public:
  LAMB(std::vector<Tensor> params, const LAMBOptions& options = {});
  LAMB(std::vector<ParamGroup> groups, const LAMBOptions& options = {});
  // This optimizer's state of `param` (nullptr before its first step).
  const AdamParamState* state(const Tensor& param) const {
    return static_cast<const AdamParamState*>(Optimizer::state(param));
  }

 protected:
  std::unique_ptr<OptimizerParamState> make_param_state() const override;
  int buffers_needed(const OptimizerOptions& options) const override;
  void run_step_kernel(const OptimizerOptions& options, const kernels::MultiTensorLists& lists,
                       const kernels::StepScalars& scalars) const override;
};

}  // namespace kiln::optim
