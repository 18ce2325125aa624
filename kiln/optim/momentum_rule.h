#pragma once
// What the update rules of SGD and LARS share (internal header, included by sgd_rule.h and
// lars_rule.h): the momentum buffer applied, per element in the opmath type T, to the update
// direction d (the scaled gradient with weight decay; for LARS also times the trust ratio):
//   buf = d on the buffer's first step, else momentum * buf + (1 - dampening) * d
//   d = nesterov ? d + momentum * buf : buf;  p -= lr * d
// Without momentum there is no buffer and d is applied directly. MomentumRule holds the options and
// the buffer the two rules share.
#include "kiln/core/macros.h"
#include "kiln/kernels/multi_tensor.h"

namespace kiln::optim {

struct MomentumRule {
  static constexpr int kMaxBuffers = 1;  // momentum_buffer
  static constexpr bool kUpdateReadsGrad = true;

  double momentum, dampening, weight_decay;
  bool nesterov, maximize;

  KILN_INLINE int num_buffers() const { return momentum != 0.0 ? 1 : 0; }
};

template <class T>
struct MomentumStep {
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

// Fills `f` from the rule's options.
template <class T>
KILN_INLINE void set_momentum_step(MomentumStep<T>& f, const MomentumRule& rule, const kernels::UpdateScalars& s) {
  f.lr = T(s.lr);
  f.weight_decay = T(rule.weight_decay);
  f.momentum = T(rule.momentum);
  f.one_minus_dampening = T(1.0 - rule.dampening);
  f.grad_mul = T(rule.maximize ? -s.inv_grad_scale : s.inv_grad_scale);
  f.use_momentum = rule.momentum != 0.0;
  f.first = s.fresh_buffers;
  f.nesterov = rule.nesterov;
}

}  // namespace kiln::optim
