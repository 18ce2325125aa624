// l1_loss, smooth_l1_loss and binary_cross_entropy_with_logits (reductions as in PyTorch).
// l1 and smooth-l1 are short compositions of differentiable ops. BCE-with-logits records its own
// backward: the composite stable formula goes through abs() and relu(), whose derivatives at 0
// would give the wrong gradient at x = 0, while the analytic one is exact everywhere:
//   loss = (1 - t) x + lw * softplus(-x),  lw = 1 + (pos_weight - 1) t
//   dloss/dx = (1 - t) - lw * sigmoid(-x),  dloss/dt = -x + (pos_weight - 1) softplus(-x),
//   dloss/dpos_weight = t * softplus(-x),   softplus(-x) = log(1 + exp(-|x|)) + max(-x, 0).
#include "kiln/core/autocast.h"
#include "kiln/core/autograd.h"
#include "kiln/core/shape.h"
#include "kiln/nn/functional.h"
#include "kiln/ops/op_helpers.h"

namespace kiln::nn::functional {

using autograd::SavedTensor;
using autograd::TensorList;
using kiln::detail::reduce_loss;

namespace {

void check_pair(const char* op, const Tensor& input, const Tensor& target) {
  KILN_CHECK(input.defined() && target.defined(), op, ": input and target must be defined");
  KILN_CHECK(input.device() == target.device(), op, ": input on ", input.device(), " but target on ", target.device());
  KILN_CHECK(input.sizes() == target.sizes(), op, ": input sizes ", input.sizes(), " and target sizes ", target.sizes(),
             " differ");
  KILN_CHECK(is_floating(input.dtype()) && is_floating(target.dtype()), op,
             ": expected floating-point input and target, got ", input.dtype(), " and ", target.dtype());
}

// softplus(-x) = log(1 + exp(-x)), computed without overflow.
Tensor softplus_neg(const Tensor& x) { return log(exp(-abs(x)) + 1.0) + kiln::relu(-x); }

}  // namespace

Tensor l1_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  if (auto out = amp::autocast_rerun(amp::Policy::F32, {input, target},
                                     [&](const auto& a) { return l1_loss(a[0], a[1], reduction); }))
    return *out;
  check_pair("l1_loss", input, target);
  return reduce_loss(abs(input - target), reduction);
}

Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, Reduction reduction, double beta) {
  if (auto out = amp::autocast_rerun(amp::Policy::F32, {input, target},
                                     [&](const auto& a) { return smooth_l1_loss(a[0], a[1], reduction, beta); }))
    return *out;
  check_pair("smooth_l1_loss", input, target);
  KILN_CHECK(beta >= 0, "smooth_l1_loss: beta must be non-negative, got ", beta);
  if (beta == 0.0) return reduce_loss(abs(input - target), reduction);
  Tensor d = input - target;
  Tensor ad = abs(d);
  Tensor per = where(ad < beta, d * d * (0.5 / beta), ad - 0.5 * beta);
  return reduce_loss(per, reduction);
}

Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target, Reduction reduction,
                                        const Tensor& pos_weight) {
  if (auto out = amp::autocast_rerun(amp::Policy::F32, {input, target}, [&](const auto& a) {
        return binary_cross_entropy_with_logits(a[0], a[1], reduction, pos_weight);
      }))
    return *out;
  const char* op = "binary_cross_entropy_with_logits";
  check_pair(op, input, target);
  const bool has_pw = pos_weight.defined();
  if (has_pw) {
    KILN_CHECK(pos_weight.device() == input.device(), op, ": pos_weight on ", pos_weight.device(), " but input on ",
               input.device());
    broadcast_shapes(input.sizes(), pos_weight.sizes(), op);  // throws naming both shapes
    KILN_CHECK(broadcast_shapes(input.sizes(), pos_weight.sizes(), op) == input.sizes(), op, ": pos_weight sizes ",
               pos_weight.sizes(), " must broadcast to input sizes ", input.sizes());
  }
  DType dt = promote_types(input.dtype(), target.dtype());
  if (has_pw) dt = promote_types(dt, pos_weight.dtype());
  Tensor per;
  {
    NoGradGuard ng;
    Tensor x = input.detach().to(dt), t = target.detach().to(dt);
    Tensor sp = softplus_neg(x);
    Tensor lw = has_pw ? (pos_weight.detach().to(dt) - 1.0) * t + 1.0 : Tensor();
    per = (1.0 - t) * x + (has_pw ? lw * sp : sp);
  }
  if (autograd::any_requires_grad({&input, &target, &pos_weight})) {
    const bool gi = input.requires_grad(), gt = target.requires_grad(), gp = has_pw && pos_weight.requires_grad();
    SavedTensor sx(input, op), st(target, op), sp_w;
    if (has_pw) sp_w = SavedTensor(pos_weight, op);
    const IntList pw_sizes = has_pw ? pos_weight.sizes() : IntList{};
    const DType in_dt = input.dtype(), t_dt = target.dtype();
    const DType pw_dt = has_pw ? pos_weight.dtype() : dt;
    autograd::record_function("BinaryCrossEntropyWithLogitsBackward", {&input, &target, &pos_weight}, {&per},
                              [=](const TensorList& g) {
                                Tensor x = sx.get().to(dt), t = st.get().to(dt);
                                Tensor pw = has_pw ? sp_w.get().to(dt) : Tensor();
                                Tensor gi_out, gt_out, gp_out;
                                if (gi) {
                                  Tensor lw = has_pw ? (pw - 1.0) * t + 1.0 : Tensor();
                                  Tensor s = kiln::sigmoid(-x);
                                  gi_out = (g[0] * ((1.0 - t) - (has_pw ? lw * s : s))).to(in_dt);
                                }
                                if (gt || gp) {
                                  Tensor sp = softplus_neg(x);
                                  if (gt) gt_out = (g[0] * (has_pw ? (pw - 1.0) * sp - x : -x)).to(t_dt);
                                  if (gp) gp_out = sum_to(g[0] * t * sp, pw_sizes).to(pw_dt);
                                }
                                return TensorList{gi_out, gt_out, gp_out};
                              });
  }
  return reduce_loss(per, reduction);
}

}  // namespace kiln::nn::functional
