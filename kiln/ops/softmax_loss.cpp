// softmax / log_softmax (fused kernels along the last dim, any dim by transposition) and the
// classification/regression losses built on them.
#include "kiln/core/autocast.h"
#include "kiln/core/autograd.h"
#include "kiln/core/shape.h"
#include "kiln/kernels/copy_fill.h"
#include "kiln/kernels/matmul.h"
#include "kiln/kernels/pointwise.h"
#include "kiln/kernels/reduce.h"
#include "kiln/kernels/softmax.h"
#include "kiln/kernels/cross_entropy.h"
#include "kiln/ops/op_helpers.h"

namespace kiln {

using autograd::SavedTensor;
using autograd::TensorList;
using detail::reduce_loss;

namespace {

// Runs `f(in_last) -> out_last` with `dim` moved last and contiguous, then moves it back.
template <class F> Tensor along_last(const Tensor& x, int64_t dim, F f) {
  if (x.dim() == 0 || dim == x.dim() - 1) return f(x.contiguous());
  Tensor t = x.transpose(dim, -1).contiguous();
  return f(t).transpose(dim, -1);
}

Tensor softmax_impl(const Tensor& x_in, int64_t dim_in, bool log) {
  const char* name = log ? "log_softmax" : "softmax";
  const Tensor x = amp::to_autocast_f32(x_in);  // autocast: f32 (kiln/core/autocast.h)
  KILN_CHECK(x.defined(), name, ": input is undefined");
  KILN_CHECK(is_floating(x.dtype()), name, ": expected a floating-point tensor, got ", x.dtype());
  int64_t dim = wrap_dim(dim_in, x.dim(), name);
  Tensor out;
  {
    NoGradGuard ng;
    out = along_last(x.detach(), dim, [&](const Tensor& in) {
      Tensor o = empty(in.sizes(), in.options());
      kernels::softmax(o, in, log);
      return o;
    });
  }
  if (autograd::any_requires_grad({&x})) {
    SavedTensor so = SavedTensor::output(out, log ? "LogSoftmaxBackward" : "SoftmaxBackward");
    autograd::record_function(
        log ? "LogSoftmaxBackward" : "SoftmaxBackward", {&x}, {&out},
        autograd::fused_or_composite(
            [=](const TensorList& g) {
              Tensor y = so.get(), gy = g[0];
              Tensor r = along_last(y, dim, [&](const Tensor& yl) {
                Tensor gl = (dim == y.dim() - 1 || y.dim() == 0) ? gy.contiguous() : gy.transpose(dim, -1).contiguous();
                Tensor gi = empty(yl.sizes(), yl.options());
                kernels::softmax_backward(gi, gl, yl, log);
                return gi;
              });
              return TensorList{r};
            },
            [=](const TensorList& g) {
              Tensor y = so.get();
              if (log) return TensorList{g[0] - exp(y) * sum(g[0], {dim}, true)};
              return TensorList{y * (g[0] - sum(g[0] * y, {dim}, true))};
            }));
  }
  return out;
}

// Flattens [N, C, d1, ...] logits to [N*d1*..., C] rows and the targets to match.
void flatten_classes(const char* op, const Tensor& input, const Tensor& target, Tensor& rows, Tensor& flat_target,
                     IntList& per_sample_shape) {
  KILN_CHECK(input.defined() && target.defined(), op, ": an operand is undefined");
  KILN_CHECK(input.device() == target.device(), op, ": input on ", input.device(), " but target on ", target.device());
  KILN_CHECK(target.dtype() == DType::I64 || target.dtype() == DType::I32, op,
             ": target must hold class indices as int64 or int32, got ", target.dtype(),
             " (probability targets are not supported)");
  KILN_CHECK(input.dim() >= 1, op, ": input must have a class dimension, got sizes ", input.sizes());
  if (input.dim() == 1) {  // unbatched [C] with a 0-dim target
    KILN_CHECK(target.dim() == 0, op, ": for input of sizes ", input.sizes(), " the target must be 0-dim, got sizes ",
               target.sizes());
    rows = input.unsqueeze(0);
    flat_target = target.reshape({1});
    per_sample_shape = {};
    return;
  }
  IntList expected = input.sizes();
  expected.erase(expected.begin() + 1);
  KILN_CHECK(target.sizes() == expected, op, ": target sizes ", target.sizes(), " do not match input sizes ",
             input.sizes(), " (expected ", expected, ")");
  if (input.dim() == 2) {
    rows = input;
  } else {  // [N, C, d...] -> [N, d..., C] -> rows
    IntList perm{0};
    for (int64_t d = 2; d < input.dim(); ++d) perm.push_back(d);
    perm.push_back(1);
    rows = input.permute(perm).reshape({-1, input.size(1)});
  }
  flat_target = target.reshape({-1});
  per_sample_shape = expected;
}

}  // namespace

Tensor softmax(const Tensor& a, int64_t dim) { return softmax_impl(a, dim, false); }
Tensor log_softmax(const Tensor& a, int64_t dim) { return softmax_impl(a, dim, true); }
Tensor Tensor::softmax(int64_t dim) const { return kiln::softmax(*this, dim); }
Tensor Tensor::log_softmax(int64_t dim) const { return kiln::log_softmax(*this, dim); }

Tensor nll_loss(const Tensor& log_probs, const Tensor& target, int64_t ignore_index, Reduction reduction) {
  Tensor rows, t;
  IntList sample_shape;
  flatten_classes("nll_loss", log_probs, target, rows, t, sample_shape);
  const int64_t C = rows.size(1);
  Tensor ti = t.to(DType::I64);
  Tensor valid = ti != static_cast<double>(ignore_index);
  {
    NoGradGuard ng;
    Tensor bad = logical_and(valid, logical_or(ti < 0.0, ti >= static_cast<double>(C)));
    if (bad.numel() > 0 && bad.to(DType::F64).sum().item<double>() > 0) {
      Tensor first = (bad.to(DType::I64)).argmax();
      int64_t i = first.item<int64_t>();
      KILN_FAIL("nll_loss: target ", ti.cpu().data_ptr<int64_t>()[i], " at position ", i, " is out of range for ", C,
                " classes (ignore_index is ", ignore_index, ")");
    }
  }
  Tensor safe = where(valid, ti, zeros({}, ti.options()));
  Tensor picked = -gather(rows, 1, safe.unsqueeze(1)).squeeze(1);
  Tensor validf = valid.to(rows.dtype());
  Tensor per = picked * validf;
  if (reduction == Reduction::Mean) return per.sum() / validf.sum();
  if (reduction == Reduction::Sum) return per.sum();
  return per.reshape(sample_shape);
}

// Cross-entropy on class-index targets, fused (kiln/kernels/cross_entropy.h): one kernel computes
// per row max, logsumexp and the (label-smoothed) loss and saves lse; the backward writes
// dx = (softmax(x) - q) * g from x and lse in one pass. Input [N, C] or [C], or [N, C, d...] moved
// to [N*d..., C] rows like flatten_classes does. The loss is computed in f32 (f64 for f64 logits)
// and returned in the logits' dtype (f32 under autocast, where 16-bit logits are still read
// natively instead of being cast first).
//
// Targets out of range: on the CPU a kiln::Error naming the target and its position; on CUDA
// nothing is checked on the host (that would synchronise every step): the row's loss is NaN,
// so the reduced loss is NaN, and its gradient row is NaN.
//
// create_graph (grad mode on during backward): the backward is the differentiable formula
// (softmax(x) - q) * g built from kiln ops, so second derivatives work.
Tensor cross_entropy(const Tensor& input, const Tensor& target, int64_t ignore_index, double label_smoothing,
                     Reduction reduction) {
  KILN_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, "cross_entropy: label_smoothing must be in [0, 1], got ",
             label_smoothing);
  KILN_CHECK(input.defined() && is_floating(input.dtype()), "cross_entropy: input must be floating-point logits");
  // autocast runs cross_entropy in f32: the loss is f32, the 16-bit logits are read as they are
  const bool low = input.dtype() == DType::F16 || input.dtype() == DType::BF16;
  const DType out_dtype = low && amp::autocast_dtype() ? DType::F32 : input.dtype();
  Tensor rows, flat_target;
  IntList sample_shape;
  flatten_classes("cross_entropy", input, target, rows, flat_target, sample_shape);
  const Tensor x = rows.contiguous();  // differentiable: its gradient flows back to input
  const Tensor t = flat_target.contiguous();
  const int64_t R = x.size(0), C = x.size(1);
  const DType sd = kernels::xent_stat_dtype(x.dtype());
  const double e = label_smoothing;

  Tensor loss_rows = empty({R}, x.options().dtype(sd).requires_grad(false));
  Tensor lse = empty({R}, x.options().dtype(sd).requires_grad(false));
  Tensor count;  // non-ignored targets (Mean), on the device: nothing is read on the host
  Tensor out;
  {
    NoGradGuard ng;
    kernels::cross_entropy_forward(loss_rows, lse, x.detach(), t, ignore_index, e);
    switch (reduction) {
      case Reduction::None: out = loss_rows.to(out_dtype).reshape(sample_shape); break;
      case Reduction::Sum: out = loss_rows.sum().to(out_dtype); break;
      case Reduction::Mean:
        count = (t != static_cast<double>(ignore_index)).sum().to(sd);
        out = (loss_rows.sum() / count).to(out_dtype);
        break;
    }
  }
  if (autograd::any_requires_grad({&x})) {
    SavedTensor saved_x(x, "CrossEntropyBackward");
    // the loss gradient of every row, [R] (None) or one value for all rows (Sum, Mean), into
    // dx: the fused kernel, or (create_graph) a differentiable formula
    auto fused = [=](const TensorList& g) {
      const Tensor xs = saved_x.get();
      Tensor g_rows = reduction == Reduction::None  ? g[0].reshape({R}).to(sd).contiguous()
                      : reduction == Reduction::Sum ? g[0].reshape({1}).to(sd)
                                                    : (g[0].reshape({1}).to(sd) / count);
      Tensor dx = empty(xs.sizes(), xs.options().requires_grad(false));
      kernels::cross_entropy_backward(dx, g_rows.contiguous(), xs.detach(), lse, t, ignore_index, e);
      return TensorList{dx};
    };
    auto composite = [=](const TensorList& g) {
      const Tensor xs = saved_x.get();
      Tensor g_rows = reduction == Reduction::None  ? g[0].reshape({R})
                      : reduction == Reduction::Sum ? g[0].reshape({1})
                                                    : g[0].reshape({1}) / count;
      Tensor valid = (t != static_cast<double>(ignore_index)).to(g_rows.dtype());
      Tensor safe =
          where(t != static_cast<double>(ignore_index), t.to(DType::I64), zeros({}, t.options().dtype(DType::I64)));
      Tensor classes = arange(static_cast<double>(C), t.options().dtype(DType::I64)).view({1, C});
      Tensor q = (classes == safe.view({R, 1})).to(g_rows.dtype()) * (1.0 - e) + e / static_cast<double>(C);
      Tensor dx = (softmax(xs, 1) - q) * (g_rows * valid).view({R, 1});
      return TensorList{dx.to(xs.dtype())};
    };
    autograd::record_function("CrossEntropyBackward", {&x}, {&out}, autograd::fused_or_composite(fused, composite));
  }
  return out;
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  KILN_CHECK(input.defined() && target.defined(), "mse_loss: an operand is undefined");
  KILN_CHECK(input.sizes() == target.sizes(), "mse_loss: input sizes ", input.sizes(), " and target sizes ",
             target.sizes(), " differ");
  Tensor d = amp::to_autocast_f32(input) - amp::to_autocast_f32(target);  // autocast: f32
  return reduce_loss(d * d, reduction);
}

}  // namespace kiln
