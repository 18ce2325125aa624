#pragma once
// What the functional-layer tests (conv, norm, pool and their fused blocks) share: the names they
// use and the BatchNorm arguments of a fused-vs-composite run.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include <kiln/kiln.h>
#include <kiln/nn/functional.h>
#include "tests/test_util.h"

namespace F = kiln::nn::functional;
using namespace kiln_test;  // with its DType, IntList, Tensor and TL

namespace kiln_test {

// The BatchNorm inputs of one run over C channels: weight and bias as fresh leaves copied from
// w0 and b0 when affine (undefined otherwise), and running statistics away from 0 and 1 so that
// their use and update are both visible.
struct BatchNormArgs {
  Tensor weight, bias, running_mean, running_var;

  BatchNormArgs(bool affine, const Tensor& w0, const Tensor& b0, int64_t C, DType dtype)
      : weight(affine ? w0.clone().requires_grad_() : Tensor()),
        bias(affine ? b0.clone().requires_grad_() : Tensor()),
        running_mean(kiln::arange(static_cast<double>(C), dtype) * 0.25 - 0.5),
        running_var(kiln::arange(static_cast<double>(C), dtype) * 0.3 + 0.5) {}

  // After backward: the gradients of weight and bias (left undefined without affine).
  void take_grads(Tensor& dweight, Tensor& dbias) const {
    if (!weight.defined()) return;
    dweight = weight.grad();
    dbias = bias.grad();
  }
};

// The BatchNorm side of one run of a fused block or of its composite: the weight and bias
// gradients (undefined without affine) and the running statistics after the run.
struct BatchNormRun {
  Tensor dw, db, rm, rv;
};

// check_same_tensor on the BatchNorm sides of two runs: the weight and bias gradients (with
// affine) within grad_tol, the running statistics within stats_tol.
inline void check_same_batch_norm(const BatchNormRun& got, const BatchNormRun& want, bool affine, double grad_tol,
                                  double stats_tol) {
  if (affine) {
    check_same_tensor(got.dw, want.dw, grad_tol, "BatchNorm weight gradient");
    check_same_tensor(got.db, want.db, grad_tol, "BatchNorm bias gradient");
  }
  check_same_tensor(got.rm, want.rm, stats_tol, "running_mean");
  check_same_tensor(got.rv, want.rv, stats_tol, "running_var");
}

// The f64 gradchecks F::batch_norm and F::batch_norm_relu share; bn(x, running_mean, running_var,
// weight, bias, training) runs the op. On x [3, 2, 2, 3] with weight w and bias b: of x, w and b in
// training, of x alone without affine, and in eval with running statistics; then of a fresh [N, C]
// input with its own weight and bias. Returns {x, w, b}, for the caller to go on checking with.
template <class BatchNorm> TL check_batch_norm_gradchecks(BatchNorm bn) {
  Tensor x = kiln::randn({3, 2, 2, 3}, f64(true));
  Tensor w = kiln::randn({2}, f64(true)), b = kiln::randn({2}, f64(true));
  CHECK(kiln::gradcheck([&](const TL& in) { return bn(in[0], Tensor(), Tensor(), in[1], in[2], true); }, {x, w, b}));
  CHECK(kiln::gradcheck([&](const TL& in) { return bn(in[0], Tensor(), Tensor(), Tensor(), Tensor(), true); }, {x}));
  Tensor rm = kiln::randn({2}, f64()), rv = kiln::rand({2}, f64()) + 0.5;
  CHECK(kiln::gradcheck([&](const TL& in) { return bn(in[0], rm, rv, in[1], in[2], false); }, {x, w, b}));
  Tensor x2 = kiln::randn({5, 3}, f64(true));
  Tensor w2 = kiln::randn({3}, f64(true)), b2 = kiln::randn({3}, f64(true));
  CHECK(kiln::gradcheck([&](const TL& in) { return bn(in[0], Tensor(), Tensor(), in[1], in[2], true); }, {x2, w2, b2}));
  return {x, w, b};
}

}  // namespace kiln_test
