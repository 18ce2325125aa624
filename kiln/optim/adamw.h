#pragma once
// AdamW (decoupled weight decay, Loshchilov & Hutter), as torch.optim.AdamW:
//   p *= 1 - lr * weight_decay;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
//
//   kiln::optim::AdamW opt(params, kiln::optim::AdamWOptions(3e-4).betas({0.9, 0.95}).weight_decay(0.1));
#include "kiln/optim/adam.h"

namespace kiln::optim {

class AdamWOptions : public OptimizerOptions {
 public:
  AdamWOptions() = default;
  AdamWOptions(double lr) : lr_(lr) {}  // NOLINT: implicit, like libtorch
  KILN_ARG(double, lr) = 1e-3;
  KILN_ARG(Betas, betas) = std::make_tuple(0.9, 0.999);
  KILN_ARG(double, eps) = 1e-8;
  KILN_ARG(double, weight_decay) = 1e-2;
  KILN_ARG(bool, maximize) = false;

 public:
  std::unique_ptr<OptimizerOptions> clone() const override { return std::make_unique<AdamWOptions>(*this); }
  const char* optimizer_name() const override { return "AdamW"; }
  double get_lr() const override { return lr_; }
  void set_lr(double lr) override { lr_ = lr; }
  double get_momentum() const override { return std::get<0>(betas_); }
  void set_momentum(double m) override { std::get<0>(betas_) = m; }
  void validate() const override;
  std::map<std::string, double> to_map() const override;
  void from_map(const std::map<std::string, double>& values) override;
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Tensor> params, const AdamWOptions& options = {});
  AdamW(std::vector<ParamGroup> groups, const AdamWOptions& options = {});
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
