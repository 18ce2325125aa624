#pragma once
// SGD with momentum, dampening, Nesterov momentum and (coupled) weight decay, as torch.optim.SGD:
//   g = grad + weight_decay * p
//   buf = g (first step) | momentum * buf + (1 - dampening) * g
//   g = nesterov ? g + momentum * buf : buf;  p -= lr * g
//
//   kiln::optim::SGD opt(net.parameters(), kiln::optim::SGDOptions(0.1).momentum(0.9).nesterov(true));
#include "kiln/optim/optimizer.h"

namespace kiln::optim {

class SGDOptions : public OptimizerOptions {
 public:
  SGDOptions(double lr = 1e-3) : lr_(lr) {}  // NOLINT: implicit, like libtorch
  KILN_OPTIM_ARG(double, lr, 1e-3);
  KILN_OPTIM_ARG(double, momentum, 0.0);
  KILN_OPTIM_ARG(double, dampening, 0.0);
  KILN_OPTIM_ARG(double, weight_decay, 0.0);
  KILN_OPTIM_ARG(bool, nesterov, false);
  KILN_OPTIM_ARG(bool, maximize, false);

 public:
  std::unique_ptr<OptimizerOptions> clone() const override { return std::make_unique<SGDOptions>(*this); }
  const char* optimizer_name() const override { return "SGD"; }
  double get_lr() const override { return lr_; }
  void set_lr(double lr) override { lr_ = lr; }
  double get_momentum() const override { return momentum_; }
  void set_momentum(double m) override { momentum_ = m; }
  void validate() const override;
  math::OptimHyper hyper() const override;
  std::map<std::string, double> to_map() const override;
  void from_map(const std::map<std::string, double>& values) override;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, const SGDOptions& options = {});
  SGD(std::vector<ParamGroup> groups, const SGDOptions& options = {});
};

}  // namespace kiln::optim
