#pragma once
// Adam, as torch.optim.Adam (weight decay is L2, added to the gradient):
//   g = grad + weight_decay * p;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// amsgrad is not implemented.
//
//   kiln::optim::Adam opt(net.parameters(), kiln::optim::AdamOptions(1e-3).betas({0.9, 0.99}));
//
// This file also holds what Adam, AdamW and LAMB share: their options and per-parameter state, and
// the bias-corrected moment step of Adam and AdamW (AdamMomentsRule).
#include <tuple>

#include "kiln/core/macros.h"
#include "kiln/optim/fused_optimizer.h"

namespace kiln::optim {

namespace detail {
// Adam, AdamW and LAMB check their shared options the same way.
void validate_adam_like(const char* name, double lr, const Betas& betas, double eps, double weight_decay);
// ... and save the same options under the same names.
template <class Visit>
void visit_adam_like(Visit& visit, double& lr, Betas& betas, double& eps, double& weight_decay, bool& maximize) {
  visit("lr", lr);
  visit("betas", betas);
  visit("eps", eps);
  visit("weight_decay", weight_decay);
  visit("maximize", maximize);
}

// The options Adam, AdamW and LAMB share, checked and saved the same way; each derived class
// gives its name (kName) and its defaults of eps and weight_decay.
template <class Derived> class AdamLikeOptions : public OptimizerOptionsBase<Derived> {
  KILN_BASE_ARG(Derived, double, lr);
  KILN_BASE_ARG(Derived, Betas, betas) = std::make_tuple(0.9, 0.999);
  KILN_BASE_ARG(Derived, double, eps);
  KILN_BASE_ARG(Derived, double, weight_decay);
  KILN_BASE_ARG(Derived, bool, maximize) = false;

 public:
  static constexpr auto kMomentumOption = &AdamLikeOptions::betas_;
  template <class Visit> static void for_each_option(Derived& self, Visit&& visit) {
    visit_adam_like(visit, self.lr_, self.betas_, self.eps_, self.weight_decay_, self.maximize_);
  }
  void validate() const override { validate_adam_like(Derived::kName, lr_, betas_, eps_, weight_decay_); }

 protected:
  AdamLikeOptions(double lr, double eps, double weight_decay) : lr_(lr), eps_(eps), weight_decay_(weight_decay) {}
};
}  // namespace detail

// The state of one parameter of Adam, AdamW and LAMB: the first and second moments.
class AdamParamState : public OptimizerParamState {
 public:
  Tensor exp_avg;     // first moment
  Tensor exp_avg_sq;  // second moment
  BufferSlots buffer_slots() override { return {{"exp_avg", &exp_avg}, {"exp_avg_sq", &exp_avg_sq}}; }
};

// What the update rules of Adam and AdamW share: their options, and the bias-corrected moment
// step, per element in the opmath type T, on the gradient g after scaling and any L2 term, step t
// counted from 1:
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// The two rules differ only in where weight decay enters.
struct AdamMomentsRule {
  static constexpr int kMaxBuffers = 2;  // exp_avg, exp_avg_sq
  static constexpr bool kPerTensorNorms = false;
  static constexpr bool kUpdateReadsGrad = true;

  double beta1, beta2, eps, weight_decay;
  bool maximize;

  template <class Derived>
  explicit AdamMomentsRule(const detail::AdamLikeOptions<Derived>& o)
      : beta1(std::get<0>(o.betas())),
        beta2(std::get<1>(o.betas())),
        eps(o.eps()),
        weight_decay(o.weight_decay()),
        maximize(o.maximize()) {}

  KILN_INLINE int num_buffers() const { return 2; }

  template <class T> struct Moments {
    T beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
    T step_size;     // lr / (1 - b1^t)
    T inv_bc2_sqrt;  // 1 / sqrt(1 - b2^t)
    T grad_mul;      // ±1/grad_scale
    KILN_INLINE void step(T& p, T g, T& exp_avg, T& exp_avg_sq) const {
      exp_avg = beta1 * exp_avg + one_minus_beta1 * g;
      exp_avg_sq = beta2 * exp_avg_sq + one_minus_beta2 * g * g;
      const T denom = math::sqrt(exp_avg_sq) * inv_bc2_sqrt + eps;
      p = p - step_size * (exp_avg / denom);
    }
  };

  template <class T> KILN_INLINE void set_moments(Moments<T>& f, const kernels::UpdateScalars& s) const {
    f.beta1 = T(beta1);
    f.one_minus_beta1 = T(1.0 - beta1);
    f.beta2 = T(beta2);
    f.one_minus_beta2 = T(1.0 - beta2);
    f.eps = T(eps);
    f.step_size = T(s.lr / (1.0 - math::pow(beta1, s.step)));
    f.inv_bc2_sqrt = T(1.0 / math::sqrt(1.0 - math::pow(beta2, s.step)));
    f.grad_mul = T(maximize ? -s.inv_grad_scale : s.inv_grad_scale);
  }
};

// lr, betas (0.9, 0.999), eps, weight_decay and maximize (false): see detail::AdamLikeOptions.
class AdamOptions : public detail::AdamLikeOptions<AdamOptions> {
 public:
  static constexpr const char* kName = "Adam";
  AdamOptions(double lr = 1e-3)  // NOLINT: implicit, like libtorch
      : AdamLikeOptions(lr, /*eps=*/1e-8, /*weight_decay=*/0.0) {}
};

// Adam's update rule, per element in the opmath type T:
//   g = grad / grad_scale (negated when maximizing) + weight_decay * p, then the moment step.
struct AdamRule : AdamMomentsRule {
  static constexpr const char* kStepName = "adam_step";
  explicit AdamRule(const AdamOptions& o) : AdamMomentsRule(o) {}

  template <class T> struct Update : Moments<T> {
    T weight_decay;
    KILN_INLINE void operator()(T& p, T g, T& exp_avg, T& exp_avg_sq) const {
      g = g * this->grad_mul;
      g = g + weight_decay * p;
      this->step(p, g, exp_avg, exp_avg_sq);
    }
  };

  template <class T> KILN_INLINE Update<T> update(const kernels::UpdateScalars& s) const {
    Update<T> f;
    set_moments<T>(f, s);
    f.weight_decay = T(weight_decay);
    return f;
  }
};

class Adam : public FusedOptimizer<AdamOptions, AdamParamState, AdamRule> {
 public:
  using FusedOptimizer::FusedOptimizer;
};

}  // namespace kiln::optim
