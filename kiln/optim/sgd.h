#pragma once
// SGD with momentum, dampening, Nesterov momentum and (coupled) weight decay, as torch.optim.SGD:
//   g = grad + weight_decay * p
//   buf = g (first step) | momentum * buf + (1 - dampening) * g
//   g = nesterov ? g + momentum * buf : buf;  p -= lr * g
//
//   kiln::optim::SGD opt(net.parameters(), kiln::optim::SGDOptions(0.1).momentum(0.9).nesterov(true));
//
// This file also holds what SGD and LARS share: their options and per-parameter state, and the
// momentum step (MomentumRule).
#include "kiln/core/macros.h"
#include "kiln/optim/fused_optimizer.h"

namespace kiln::optim {

namespace detail {
// SGD and LARS save their shared options under the same names.
template <class Visit>
void visit_sgd_like(Visit& visit, double& lr, double& momentum, double& dampening, double& weight_decay) {
  visit("lr", lr);
  visit("momentum", momentum);
  visit("dampening", dampening);
  visit("weight_decay", weight_decay);
}

// The options SGD and LARS share; each derived class gives its name (kName), its default
// momentum and validate. for_each_option saves SGD's options (LARS, with more, has its own).
template <class Derived> class SGDLikeOptions : public OptimizerOptionsBase<Derived> {
  KILN_BASE_ARG(Derived, double, lr);
  KILN_BASE_ARG(Derived, double, momentum);
  KILN_BASE_ARG(Derived, double, dampening) = 0.0;
  KILN_BASE_ARG(Derived, double, weight_decay) = 0.0;
  KILN_BASE_ARG(Derived, bool, nesterov) = false;
  KILN_BASE_ARG(Derived, bool, maximize) = false;

 public:
  static constexpr auto kMomentumOption = &SGDLikeOptions::momentum_;
  template <class Visit> static void for_each_option(Derived& self, Visit&& visit) {
    visit_sgd_like(visit, self.lr_, self.momentum_, self.dampening_, self.weight_decay_);
    visit("nesterov", self.nesterov_);
    visit("maximize", self.maximize_);
  }

 protected:
  SGDLikeOptions(double lr, double momentum) : lr_(lr), momentum_(momentum) {}
};
}  // namespace detail

// The state of one parameter of SGD and LARS: the momentum buffer (undefined without momentum).
class SGDParamState : public OptimizerParamState {
 public:
  Tensor momentum_buffer;
  BufferSlots buffer_slots() override { return {{"momentum_buffer", &momentum_buffer}}; }
};

// What the update rules of SGD and LARS share: their options, and the momentum buffer applied, per
// element in the opmath type T, to the update direction d (the scaled gradient with weight decay;
// for LARS also times the trust ratio):
//   buf = d on the buffer's first step, else momentum * buf + (1 - dampening) * d
//   d = nesterov ? d + momentum * buf : buf;  p -= lr * d
// Without momentum there is no buffer and d is applied directly.
struct MomentumRule {
  static constexpr int kMaxBuffers = 1;  // momentum_buffer
  static constexpr bool kUpdateReadsGrad = true;

  double momentum, dampening, weight_decay;
  bool nesterov, maximize;

  template <class Derived>
  explicit MomentumRule(const detail::SGDLikeOptions<Derived>& o)
      : momentum(o.momentum()),
        dampening(o.dampening()),
        weight_decay(o.weight_decay()),
        nesterov(o.nesterov()),
        maximize(o.maximize()) {}

  KILN_INLINE int num_buffers() const { return momentum != 0.0 ? 1 : 0; }

  template <class T> struct Step {
    T lr, weight_decay, momentum, one_minus_dampening, grad_mul;  // grad_mul = ±1/grad_scale
    bool use_momentum, first, nesterov;
    KILN_INLINE void apply(T& p, T d, T& momentum_buffer) const {
      if (use_momentum) {
        momentum_buffer = first ? d : momentum * momentum_buffer + one_minus_dampening * d;
        d = nesterov ? d + momentum * momentum_buffer : momentum_buffer;
      }
      p = p - lr * d;
    }
  };

  template <class T> KILN_INLINE void set_step(Step<T>& f, const kernels::UpdateScalars& s) const {
    f.lr = T(s.lr);
    f.weight_decay = T(weight_decay);
    f.momentum = T(momentum);
    f.one_minus_dampening = T(1.0 - dampening);
    f.grad_mul = T(maximize ? -s.inv_grad_scale : s.inv_grad_scale);
    f.use_momentum = momentum != 0.0;
    f.first = s.fresh_buffers;
    f.nesterov = nesterov;
  }
};

// lr, momentum (0), dampening (0), weight_decay (0), nesterov and maximize (false): see
// detail::SGDLikeOptions.
class SGDOptions : public detail::SGDLikeOptions<SGDOptions> {
 public:
  static constexpr const char* kName = "SGD";
  SGDOptions(double lr = 1e-3) : SGDLikeOptions(lr, /*momentum=*/0.0) {}  // NOLINT: implicit, like libtorch
  void validate() const override;
};

// SGD's update rule, per element in the opmath type T:
//   g = grad / grad_scale (negated when maximizing) + weight_decay * p, then the momentum step.
struct SGDRule : MomentumRule {
  static constexpr const char* kStepName = "sgd_step";
  static constexpr bool kPerTensorNorms = false;
  explicit SGDRule(const SGDOptions& o) : MomentumRule(o) {}

  template <class T> struct Update : Step<T> {
    KILN_INLINE void operator()(T& p, T g, T& momentum_buffer, T& /*unused*/) const {
      g = g * this->grad_mul;
      g = g + this->weight_decay * p;
      this->apply(p, g, momentum_buffer);
    }
  };

  template <class T> KILN_INLINE Update<T> update(const kernels::UpdateScalars& s) const {
    Update<T> f;
    set_step<T>(f, s);
    return f;
  }
};

class SGD : public FusedOptimizer<SGDOptions, SGDParamState, SGDRule> {
 public:
  using FusedOptimizer::FusedOptimizer;
};

}  // namespace kiln::optim
