#pragma once
// LARS (You et al. 2017, "Large Batch Training of Convolutional Networks"; momentum as in
// torchlars / NVIDIA's LARS). Per parameter tensor:
//   trust = trust_coefficient * ||p|| / (||g|| + weight_decay * ||p|| + eps)  (1 if a norm is 0)
//   d = trust * (g + weight_decay * p)
//   buf = d (first step) | momentum * buf + (1 - dampening) * d;  d = nesterov ? d + momentum * buf : buf
//   p -= lr * d
// Every tensor of a LARS optimizer is adapted (excluding biases / norm weights is not supported yet).
#include "kiln/optim/optimizer.h"

namespace kiln::optim {

class LARSOptions : public OptimizerOptions {
 public:
  LARSOptions(double lr = 1e-3) : lr_(lr) {}  // NOLINT
  KILN_OPTIM_ARG(double, lr, 1e-3);
  KILN_OPTIM_ARG(double, momentum, 0.9);
  KILN_OPTIM_ARG(double, dampening, 0.0);
  KILN_OPTIM_ARG(double, weight_decay, 0.0);
  KILN_OPTIM_ARG(double, trust_coefficient, 1e-3);
  KILN_OPTIM_ARG(double, eps, 1e-8);
  KILN_OPTIM_ARG(bool, nesterov, false);
  KILN_OPTIM_ARG(bool, maximize, false);

 public:
  std::unique_ptr<OptimizerOptions> clone() const override { return std::make_unique<LARSOptions>(*this); }
  const char* optimizer_name() const override { return "LARS"; }
  double get_lr() const override { return lr_; }
  void set_lr(double lr) override { lr_ = lr; }
  double get_momentum() const override { return momentum_; }
  void set_momentum(double m) override { momentum_ = m; }
  void validate() const override;
  math::OptimHyper hyper() const override;
  std::map<std::string, double> to_map() const override;
  void from_map(const std::map<std::string, double>& values) override;
};

class LARS : public Optimizer {
 public:
  LARS(std::vector<Tensor> params, const LARSOptions& options = {});
  LARS(std::vector<ParamGroup> groups, const LARSOptions& options = {});
};

}  // namespace kiln::optim
