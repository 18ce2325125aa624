#pragma once
// SGD with momentum, dampening, Nesterov momentum and (coupled) weight decay, as torch.optim.SGD:
//   g = grad + weight_decay * p
//   buf = g (first step) | momentum * buf + (1 - dampening) * g
//   g = nesterov ? g + momentum * buf : buf;  p -= lr * g
//
//   kiln::optim::SGD opt(net.parameters(), kiln::optim::SGDOptions(0.1).momentum(0.9).nesterov(true));
#include "kiln/optim/optimizer.h"

namespace kiln::optim {

// The state of one parameter of SGD and LARS: the momentum buffer (undefined without momentum).
class SGDParamState : public OptimizerParamState {
 public:
  Tensor momentum_buffer;
  BufferSlots buffer_slots() override { return {{"momentum_buffer", &momentum_buffer}}; }
};

class SGDOptions : public OptimizerOptions {
 public:
  SGDOptions() = default;
  SGDOptions(double lr) : lr_(lr) {}  // NOLINT: implicit, like libtorch
  KILN_ARG(double, lr) = 1e-3;
  KILN_ARG(double, momentum) = 0.0;
  KILN_ARG(double, dampening) = 0.0;
  KILN_ARG(double, weight_decay) = 0.0;
  KILN_ARG(bool, nesterov) = false;
  KILN_ARG(bool, maximize) = false;

 public:
  std::unique_ptr<OptimizerOptions> clone() const override { return std::make_unique<SGDOptions>(*this); }
  const char* optimizer_name() const override { return "SGD"; }
  double get_lr() const override { return lr_; }
  void set_lr(double lr) override { lr_ = lr; }
  double get_momentum() const override { return momentum_; }
  void set_momentum(double m) override { momentum_ = m; }
  void validate() const override;
  std::map<std::string, double> to_map() const override;
  void from_map(const std::map<std::string, double>& values) override;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, const SGDOptions& options = {});
  SGD(std::vector<ParamGroup> groups, const SGDOptions& options = {});
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
