#pragma once
// Loss modules: the functional losses with their options stored, called as loss(input, target).
#include "kiln/nn/functional.h"
#include "kiln/nn/module.h"
#include "kiln/nn/options.h"

namespace kiln::nn {

struct CrossEntropyLossOptions {
  KILN_ARG(int64_t, ignore_index) = -100;
  KILN_ARG(double, label_smoothing) = 0.0;
  KILN_ARG(Reduction, reduction) = Reduction::Mean;
};

class CrossEntropyLoss : public Module {
 public:
  explicit CrossEntropyLoss(const CrossEntropyLossOptions& options = {})
      : Module("CrossEntropyLoss"), options(options) {}
  Tensor operator()(const Tensor& input, const Tensor& target) const {
    return functional::cross_entropy(input, target, options.ignore_index(), options.label_smoothing(),
                                     options.reduction());
  }
  CrossEntropyLossOptions options;
};

class NLLLoss : public Module {
 public:
  explicit NLLLoss(int64_t ignore_index = -100, Reduction reduction = Reduction::Mean)
      : Module("NLLLoss"), ignore_index(ignore_index), reduction(reduction) {}
  Tensor operator()(const Tensor& log_probs, const Tensor& target) const {
    return functional::nll_loss(log_probs, target, ignore_index, reduction);
  }
  int64_t ignore_index;
  Reduction reduction;
};

#define KILN_SIMPLE_LOSS(NAME, FN)                                                                \
  class NAME : public Module {                                                                    \
   public:                                                                                        \
    explicit NAME(Reduction reduction = Reduction::Mean) : Module(#NAME), reduction(reduction) {} \
    Tensor operator()(const Tensor& input, const Tensor& target) const {                          \
      return functional::FN(input, target, reduction);                                            \
    }                                                                                             \
    Reduction reduction;                                                                          \
  };
KILN_SIMPLE_LOSS(MSELoss, mse_loss)
KILN_SIMPLE_LOSS(L1Loss, l1_loss)
#undef KILN_SIMPLE_LOSS

class SmoothL1Loss : public Module {
 public:
  explicit SmoothL1Loss(Reduction reduction = Reduction::Mean, double beta = 1.0)
      : Module("SmoothL1Loss"), reduction(reduction), beta(beta) {}
  Tensor operator()(const Tensor& input, const Tensor& target) const {
    return functional::smooth_l1_loss(input, target, reduction, beta);
  }
  Reduction reduction;
  double beta;
};

class BCEWithLogitsLoss : public Module {
 public:
  explicit BCEWithLogitsLoss(Reduction reduction = Reduction::Mean, Tensor pos_weight = Tensor())
      : Module("BCEWithLogitsLoss"), reduction(reduction), pos_weight(std::move(pos_weight)) {}
  Tensor operator()(const Tensor& input, const Tensor& target) const {
    return functional::binary_cross_entropy_with_logits(input, target, reduction, pos_weight);
  }
  Reduction reduction;
  Tensor pos_weight;
};

}  // namespace kiln::nn
