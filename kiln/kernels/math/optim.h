#pragma once
// Optimizer update math, written once for both backends (DESIGN.md §3.1).
//
// Every optimizer step is split into
//   - `OptimHyper`: the group's configuration (betas, eps, weight decay, momentum, ...), a plain
//     struct passed by value to the launcher (and, later, to a CUDA kernel as a kernel argument);
//   - the per-step scalars that live in tensors on the parameters' device: the learning rate, each
//     parameter's step count, the loss scaler's found-inf flag and grad scale. A launcher reads them
//     where it runs (the CPU launcher on the host, a CUDA kernel on the device), then builds the
//     per-tensor functor with one of the make_* functions below, so that construction is shared too;
//   - the per-element functor, applied to (param, grad, exp_avg, exp_avg_sq) in the opmath type T
//     (float for f32/f16/bf16 parameters, whose 16-bit copies are rounded from f32 master weights,
//     double for f64).
//
// The update rules are PyTorch's documented algorithms (torch.optim.SGD / Adam / AdamW), and for
// LAMB and LARS the papers' (You et al. 2019 "Large Batch Optimization for Deep Learning", Alg. 2 with
// Adam-style bias correction as in NVIDIA apex FusedLAMB; You et al. 2017 "Large Batch Training of
// Convolutional Networks", with momentum as in torchlars). LAMB and LARS need per-tensor norms,
// computed by the launcher in a first multi-tensor pass (`lamb_direction` / the raw param and grad)
// and handed to the second pass as a trust ratio.
#include <cmath>

#include "kiln/core/macros.h"

namespace kiln::math {

#if defined(__CUDACC__)
using ::pow; using ::sqrt;  // (kiln::pow/sqrt on tensors would hide them otherwise)
#else
using std::pow; using std::sqrt;
#endif

enum class OptimAlgo : int { SGD = 0, Adam = 1, LAMB = 2, LARS = 3 };

// A group's configuration for one step. Which fields an algorithm reads:
//   SGD : momentum, dampening, nesterov, weight_decay (coupled: g += wd * p)
//   Adam: beta1, beta2, eps, weight_decay, decoupled (false: Adam, g += wd * p; true: AdamW,
//         p *= 1 - lr * wd)
//   LAMB: beta1, beta2, eps, weight_decay (added to the update direction), bias_correction
//   LARS: momentum, dampening, nesterov, weight_decay, trust_coefficient, eps
// Every algorithm honours maximize (ascend: g = -g).
struct OptimHyper {
  OptimAlgo algo = OptimAlgo::SGD;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.0;
  double momentum = 0.0, dampening = 0.0;
  double trust_coefficient = 0.001;
  bool nesterov = false;
  bool decoupled = false;
  bool bias_correction = true;
  bool maximize = false;
};

// ---------------------------------------------------------------- SGD
// PyTorch's SGD:
//   g = grad (+ wd * p);  buf = g on the first step, else momentum * buf + (1 - dampening) * g
//   g = nesterov ? g + momentum * buf : buf;  p -= lr * g
template <class T>
struct SgdStep {
  T lr, wd, momentum, one_minus_dampening, grad_mul;  // grad_mul = ±1/grad_scale
  bool use_momentum, first, nesterov;
  KILN_INLINE void operator()(T& p, T g, T& buf, T& /*unused*/) const {
    g = g * grad_mul;
    g = g + wd * p;
    if (use_momentum) {
      buf = first ? g : momentum * buf + one_minus_dampening * g;
      g = nesterov ? g + momentum * buf : buf;
    }
    p = p - lr * g;
  }
};

template <class T>
KILN_INLINE SgdStep<T> make_sgd_step(const OptimHyper& h, double lr, bool first_momentum_step,
                                     double inv_grad_scale) {
  SgdStep<T> f;
  f.lr = T(lr);
  f.wd = T(h.weight_decay);
  f.momentum = T(h.momentum);
  f.one_minus_dampening = T(1.0 - h.dampening);
  f.grad_mul = T(h.maximize ? -inv_grad_scale : inv_grad_scale);
  f.use_momentum = h.momentum != 0.0;
  f.first = first_momentum_step;
  f.nesterov = h.nesterov;
  return f;
}

// ---------------------------------------------------------------- Adam / AdamW
// PyTorch's Adam (decoupled = false) and AdamW (decoupled = true), step t counted from 1:
//   Adam : g += wd * p          AdamW: p *= 1 - lr * wd
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
template <class T>
struct AdamStep {
  T beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
  T wd_coupled;     // Adam: weight_decay; AdamW: 0
  T decay;          // AdamW: 1 - lr * weight_decay; Adam: 1
  T step_size;      // lr / (1 - b1^t)
  T inv_bc2_sqrt;   // 1 / sqrt(1 - b2^t)
  T grad_mul;       // ±1/grad_scale
  KILN_INLINE void operator()(T& p, T g, T& m, T& v) const {
    g = g * grad_mul;
    g = g + wd_coupled * p;
    p = p * decay;
    m = beta1 * m + one_minus_beta1 * g;
    v = beta2 * v + one_minus_beta2 * g * g;
    T denom = sqrt(v) * inv_bc2_sqrt + eps;
    p = p - step_size * (m / denom);
  }
};

template <class T>
KILN_INLINE AdamStep<T> make_adam_step(const OptimHyper& h, double lr, double step,
                                       double inv_grad_scale) {
  AdamStep<T> f;
  double bc1 = 1.0 - pow(h.beta1, step);
  double bc2 = 1.0 - pow(h.beta2, step);
  f.beta1 = T(h.beta1);
  f.one_minus_beta1 = T(1.0 - h.beta1);
  f.beta2 = T(h.beta2);
  f.one_minus_beta2 = T(1.0 - h.beta2);
  f.eps = T(h.eps);
  f.wd_coupled = T(h.decoupled ? 0.0 : h.weight_decay);
  f.decay = T(h.decoupled ? 1.0 - lr * h.weight_decay : 1.0);
  f.step_size = T(lr / bc1);
  f.inv_bc2_sqrt = T(1.0 / sqrt(bc2));
  f.grad_mul = T(h.maximize ? -inv_grad_scale : inv_grad_scale);
  return f;
}

// ---------------------------------------------------------------- LAMB
// Pass 1 (moments): m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2, returning the direction
//   r = (m / bc1) / (sqrt(v / bc2) + eps) + wd * p
// whose squared norm the launcher accumulates per tensor together with ||p||^2.
// Pass 2 (apply): trust = ||p|| / ||r|| when both are non-zero, else 1;  p -= lr * trust * r,
// recomputing r from the stored m, v and the unchanged p (no temporary buffer).
template <class T>
struct LambStep {
  T beta1, one_minus_beta1, beta2, one_minus_beta2, eps, wd;
  T inv_bc1, inv_bc2_sqrt, grad_mul;
  T lr_trust;  // pass 2 only: lr * trust ratio
  KILN_INLINE T direction(T p, T m, T v) const {
    return (m * inv_bc1) / (sqrt(v) * inv_bc2_sqrt + eps) + wd * p;
  }
  KILN_INLINE T moments(T p, T g, T& m, T& v) const {
    g = g * grad_mul;
    m = beta1 * m + one_minus_beta1 * g;
    v = beta2 * v + one_minus_beta2 * g * g;
    return direction(p, m, v);
  }
  KILN_INLINE void apply(T& p, T m, T v) const { p = p - lr_trust * direction(p, m, v); }
};

template <class T>
KILN_INLINE LambStep<T> make_lamb_step(const OptimHyper& h, double step, double inv_grad_scale) {
  LambStep<T> f;
  double bc1 = h.bias_correction ? 1.0 - pow(h.beta1, step) : 1.0;
  double bc2 = h.bias_correction ? 1.0 - pow(h.beta2, step) : 1.0;
  f.beta1 = T(h.beta1);
  f.one_minus_beta1 = T(1.0 - h.beta1);
  f.beta2 = T(h.beta2);
  f.one_minus_beta2 = T(1.0 - h.beta2);
  f.eps = T(h.eps);
  f.wd = T(h.weight_decay);
  f.inv_bc1 = T(1.0 / bc1);
  f.inv_bc2_sqrt = T(1.0 / sqrt(bc2));
  f.grad_mul = T(h.maximize ? -inv_grad_scale : inv_grad_scale);
  f.lr_trust = T(0);
  return f;
}

KILN_INLINE double lamb_trust_ratio(double param_norm, double update_norm) {
  return (param_norm > 0.0 && update_norm > 0.0) ? param_norm / update_norm : 1.0;
}

// ---------------------------------------------------------------- LARS
// Pass 1: the launcher computes ||p|| and ||g|| (g after unscaling) per tensor.
//   trust = eta * ||p|| / (||g|| + wd * ||p|| + eps) when both norms are non-zero, else 1
// Pass 2: d = trust * (g + wd * p);  buf = d on the first step, else momentum * buf + (1 - dampening) d
//   d = nesterov ? d + momentum * buf : buf;  p -= lr * d
template <class T>
struct LarsStep {
  T lr, wd, momentum, one_minus_dampening, grad_mul, trust;
  bool use_momentum, first, nesterov;
  KILN_INLINE void operator()(T& p, T g, T& buf, T& /*unused*/) const {
    g = g * grad_mul;
    T d = trust * (g + wd * p);
    if (use_momentum) {
      buf = first ? d : momentum * buf + one_minus_dampening * d;
      d = nesterov ? d + momentum * buf : buf;
    }
    p = p - lr * d;
  }
};

KILN_INLINE double lars_trust_ratio(const OptimHyper& h, double param_norm, double grad_norm) {
  return (param_norm > 0.0 && grad_norm > 0.0)
             ? h.trust_coefficient * param_norm / (grad_norm + h.weight_decay * param_norm + h.eps)
             : 1.0;
}

template <class T>
KILN_INLINE LarsStep<T> make_lars_step(const OptimHyper& h, double lr, bool first_momentum_step,
                                       double inv_grad_scale, double trust) {
  LarsStep<T> f;
  f.lr = T(lr);
  f.wd = T(h.weight_decay);
  f.momentum = T(h.momentum);
  f.one_minus_dampening = T(1.0 - h.dampening);
  f.grad_mul = T(h.maximize ? -inv_grad_scale : inv_grad_scale);
  f.trust = T(trust);
  f.use_momentum = h.momentum != 0.0;
  f.first = first_momentum_step;
  f.nesterov = h.nesterov;
  return f;
}

// ---------------------------------------------------------------- norms (grad clipping, LAMB, LARS)
// Per-element contribution to a p-norm: |x|^p (p = 2: x^2, p = 1: |x|); inf norm uses max |x|.
struct NormTerm {
  double p;
  template <class T> KILN_INLINE T operator()(T x) const {
    T a = x < T(0) ? -x : x;
    if (p == 2.0) return x * x;
    if (p == 1.0) return a;
    return pow(a, T(p));
  }
};

}  // namespace kiln::math
