#pragma once
// SGD's update rule (internal header: kiln/optim/sgd.cpp runs it on the CPU, sgd.cu on a GPU).
// PyTorch's SGD, per element, in the opmath type T:
//   g = grad / grad_scale (negated when maximizing) + weight_decay * p
//   buf = g on the buffer's first step, else momentum * buf + (1 - dampening) * g
//   g = nesterov ? g + momentum * buf : buf;  p -= lr * g
// Without momentum there is no buffer and g is applied directly.
#include "kiln/core/macros.h"
#include "kiln/kernels/multi_tensor.h"

namespace kiln::optim {

struct SGDRule {
  static constexpr const char* kStepName = "sgd_step";
  static constexpr int kMaxBuffers = 1;  // momentum_buffer
  static constexpr bool kPerTensorNorms = false;
  static constexpr bool kUpdateReadsGrad = true;

  double momentum, dampening, weight_decay;
  bool nesterov, maximize;

  KILN_INLINE int num_buffers() const { return momentum != 0.0 ? 1 : 0; }

  template <class T>
  struct Update {
    T lr, weight_decay, momentum, one_minus_dampening, grad_mul;  // grad_mul = ±1/grad_scale
    bool use_momentum, first, nesterov;
    KILN_INLINE void operator()(T& p, T g, T& momentum_buffer, T& /*unused*/) const {
      g = g * grad_mul;
      g = g + weight_decay * p;
      if (use_momentum) {
        momentum_buffer = first ? g : momentum * momentum_buffer + one_minus_dampening * g;
        g = nesterov ? g + momentum * momentum_buffer : momentum_buffer;
      }
      p = p - lr * g;
    }
  };

  template <class T>
  KILN_INLINE Update<T> update(const kernels::UpdateScalars& s) const {
    Update<T> f;
    f.lr = T(s.lr);
    f.weight_decay = T(weight_decay);
    f.momentum = T(momentum);
    f.one_minus_dampening = T(1.0 - dampening);
    f.grad_mul = T(maximize ? -s.inv_grad_scale : s.inv_grad_scale);
    f.use_momentum = momentum != 0.0;
    f.first = s.fresh_buffers;
    f.nesterov = nesterov;
    return f;
  }
};

inline kernels::MultiTensorStep<SGDRule> sgd_step{SGDRule::kStepName};

}  // namespace kiln::optim
