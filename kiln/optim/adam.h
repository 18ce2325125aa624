#pragma once
// Adam, as torch.optim.Adam (weight decay is L2, added to the gradient):
//   g = grad + weight_decay * p;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// amsgrad is not implemented.
#include <tuple>

#include "kiln/optim/optimizer.h"

namespace kiln::optim {

namespace detail {
void validate_adam_like(const char* name, double lr, const std::tuple<double, double>& betas,
                        double eps, double weight_decay);
std::map<std::string, double> adam_like_map(double lr, const std::tuple<double, double>& betas,
                                            double eps, double weight_decay, bool maximize);
void adam_like_from_map(const char* name, const std::map<std::string, double>& m, double& lr,
                        std::tuple<double, double>& betas, double& eps, double& weight_decay,
                        bool& maximize);
double map_get(const char* name, const std::map<std::string, double>& m, const char* key);
}  // namespace detail

// The state of one parameter of Adam, AdamW and LAMB: the first and second moments.
class AdamParamState : public OptimizerParamState {
 public:
  Tensor exp_avg;     // first moment
  Tensor exp_avg_sq;  // second moment
  BufferSlots buffer_slots() override { return {{"exp_avg", &exp_avg}, {"exp_avg_sq", &exp_avg_sq}}; }
};

class AdamOptions : public OptimizerOptions {
 public:
  AdamOptions() = default;
  AdamOptions(double lr) : lr_(lr) {}  // NOLINT: implicit, like libtorch
  KILN_ARG(double, lr) = 1e-3;
  KILN_ARG(Betas, betas) = std::make_tuple(0.9, 0.999);
  KILN_ARG(double, eps) = 1e-8;
  KILN_ARG(double, weight_decay) = 0.0;
  KILN_ARG(bool, maximize) = false;

 public:
  std::unique_ptr<OptimizerOptions> clone() const override { return std::make_unique<AdamOptions>(*this); }
  const char* optimizer_name() const override { return "Adam"; }
  double get_lr() const override { return lr_; }
  void set_lr(double lr) override { lr_ = lr; }
  double get_momentum() const override { return std::get<0>(betas_); }
  void set_momentum(double m) override { std::get<0>(betas_) = m; }
  void validate() const override;
  std::map<std::string, double> to_map() const override;
  void from_map(const std::map<std::string, double>& values) override;
};

class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, const AdamOptions& options = {});
  Adam(std::vector<ParamGroup> groups, const AdamOptions& options = {});
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
