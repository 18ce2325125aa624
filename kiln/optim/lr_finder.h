#pragma once
// The LR range test (Smith, "Cyclical Learning Rates", 2017; the fastai LR finder): train with
// an exponentially increasing learning rate, watch a smoothed loss, stop when it diverges, and
// suggest the rate where the loss falls fastest.
#include <functional>
#include <vector>

#include "kiln/core/arg.h"
#include "kiln/optim/optimizer.h"

namespace kiln::optim {

struct LRFinderOptions {
  KILN_ARG(double, start_lr) = 1e-7;
  KILN_ARG(double, end_lr) = 10.0;
  KILN_ARG(int64_t, num_steps) = 100;
  KILN_ARG(double, smoothing) = 0.98;      // exponential moving average of the loss (bias-corrected)
  KILN_ARG(double, diverge_factor) = 4.0;  // stop once the smoothed loss exceeds this times its minimum
  KILN_ARG(int64_t, skip_start) = 10;      // points ignored when looking for the steepest descent
};

struct LRFinderResult {
  std::vector<double> lrs, losses, smoothed;
  double suggested_lr = 0;  // 0 when there were too few points
  bool diverged = false;
};

// `train_step` runs one forward/backward/optimizer step at the learning rate already set on
// every group of `opt` and returns the loss. The caller restores the model afterwards if it
// wants to train from the original weights.
LRFinderResult lr_range_test(Optimizer& opt, const std::function<double()>& train_step,
                             const LRFinderOptions& options = {});

}  // namespace kiln::optim
