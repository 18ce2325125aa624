#include "kiln/optim/lr_finder.h"

#include <cmath>

namespace kiln::optim {

LRFinderResult lr_range_test(Optimizer& opt, const std::function<double()>& train_step, const LRFinderOptions& o) {
  KILN_CHECK(o.start_lr() > 0 && o.end_lr() > o.start_lr() && o.num_steps() >= 2,
             "lr_range_test: need 0 < start_lr < end_lr and at least 2 steps");
  LRFinderResult r;
  const double ratio = std::pow(o.end_lr() / o.start_lr(), 1.0 / static_cast<double>(o.num_steps() - 1));
  double avg = 0, best = INFINITY;
  for (int64_t i = 0; i < o.num_steps(); ++i) {
    const double lr = o.start_lr() * std::pow(ratio, static_cast<double>(i));
    for (auto& g : opt.param_groups()) g.set_lr(lr);
    const double loss = train_step();
    avg = o.smoothing() * avg + (1 - o.smoothing()) * loss;
    const double smooth = avg / (1 - std::pow(o.smoothing(), static_cast<double>(i + 1)));
    r.lrs.push_back(lr);
    r.losses.push_back(loss);
    r.smoothed.push_back(smooth);
    if (!std::isfinite(loss) || (i > o.skip_start() && smooth > o.diverge_factor() * best)) {
      r.diverged = true;
      break;
    }
    best = std::min(best, smooth);
  }
  // Steepest descent of the smoothed loss against log10(lr), before divergence.
  const int64_t n = static_cast<int64_t>(r.lrs.size()) - (r.diverged ? 1 : 0);
  double steepest = INFINITY;
  for (int64_t i = std::max<int64_t>(o.skip_start(), 1); i < n; ++i) {
    double slope = (r.smoothed[i] - r.smoothed[i - 1]) / (std::log10(r.lrs[i]) - std::log10(r.lrs[i - 1]));
    if (slope < steepest) {
      steepest = slope;
      r.suggested_lr = r.lrs[i];
    }
  }
  return r;
}

}  // namespace kiln::optim
