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

}  // namespace kiln_test
