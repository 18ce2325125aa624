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

class LARSOptions : public OptimizerOptions {
 public:
  LARSOptions() = default;
  LARSOptions(double lr) : lr_(lr) {}  // NOLINT: implicit, like libtorch
  KILN_ARG(double, lr) = 1e-3;
  KILN_ARG(double, momentum) = 0.9;
  KILN_ARG(double, dampening) = 0.0;
  KILN_ARG(double, weight_decay) = 0.0;
  KILN_ARG(double, trust_coefficient) = 1e-3;
  KILN_ARG(double, eps) = 1e-8;
  KILN_ARG(bool, nesterov) = false;
  KILN_ARG(bool, maximize) = false;

 public:
  std::unique_ptr<OptimizerOptions> clone() const override { return std::make_unique<LARSOptions>(*this); }
  const char* optimizer_name() const override { return "LARS"; }
  double get_lr() const override { return lr_; }
  void set_lr(double lr) override { lr_ = lr; }
  double get_momentum() const override { return momentum_; }
  void set_momentum(double m) override { momentum_ = m; }
  void validate() const override;
  std::map<std::string, double> to_map() const override;
  void from_map(const std::map<std::string, double>& values) override;
};

class LARS : public Optimizer {
 public:
  LARS(std::vector<Tensor> params, const LARSOptions& options = {});
  LARS(std::vector<ParamGroup> groups, const LARSOptions& options = {});
  // This optimizer's state of `param` (nullptr before its first step).
  const SGDParamState* state(const Tensor& param) const {
    return static_cast<const SGDParamState*>(Optimizer::state(param));
  }

 protected:
  std::unique_ptr<OptimizerParamState> make_param_state() const override;
  int buffers_needed(const OptimizerOptions& options) const override;
  void run_step_kernel(const OptimizerOptions& options, const kernels::MultiTensorLists& lists,
                       const kernels::StepScalars& scalars) const override;
};

}  // namespace kiln::optim
