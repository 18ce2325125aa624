#pragma once
// Learning-rate schedules, step()-based: call sched.step() once per optimizer step
// (after opt.step()). Construction applies the value for step 0, like PyTorch's schedulers. Values
// are PyTorch's closed forms, computed in double from the step count (never by repeated
// multiplication), so a schedule restored from its state_dict continues exactly.
//
//   kiln::optim::OneCycleLR sched(opt, 3e-3, /*total_steps=*/2 * loader.size(),
//                                 kiln::optim::OneCycleLROptions().pct_start(0.25));
//
// Schedules that cycle momentum (OneCycleLR, CyclicLR) set each group's momentum(): SGD's and
// LARS's momentum, the Adam family's and LAMB's beta1.
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/optim/optimizer.h"

namespace kiln::optim {

// A schedule's state: the step count and the per-group base values it computes from.
struct SchedulerStateDict {
  int64_t last_step = 0;         // PyTorch's last_epoch: how many times step() ran
  std::vector<double> base_lrs;  // per group
  std::vector<double> last_lrs;  // per group, what the last step set
};

class LRScheduler {
 public:
  explicit LRScheduler(Optimizer& optimizer);
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  // Advances one step and sets every group's learning rate (and momentum, where cycled).
  void step();
  int64_t last_step() const { return last_step_; }
  const std::vector<double>& get_last_lr() const { return last_lrs_; }
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  // The learning rate of group `group` at step t (a pure function of t).
  virtual double lr_at(int64_t t, size_t group) const = 0;

  SchedulerStateDict state_dict() const;
  // Restores the step count and base values, and re-applies the values of that step.
  void load_state_dict(const SchedulerStateDict& dict);

 protected:
  // Sets lr (and momentum) for step t. Subclasses that cycle momentum extend it.
  virtual void apply(int64_t t);
  void initialize();  // the end of every subclass constructor: step 0
  Optimizer& opt_;
  std::vector<double> base_lrs_;

 private:
  int64_t last_step_ = 0;
  std::vector<double> last_lrs_;
};

// lr = base * gamma^decays(t): the decaying schedules below differ only in how many times the
// lr has decayed by step t.
class GammaDecayLR : public LRScheduler {
 public:
  double lr_at(int64_t t, size_t g) const override;

 protected:
  GammaDecayLR(Optimizer& opt, double gamma) : LRScheduler(opt), gamma_(gamma) {}
  virtual int64_t decays(int64_t t) const = 0;

 private:
  double gamma_;
};

// lr = base * gamma^floor(t / step_size)
class StepLR : public GammaDecayLR {
 public:
  StepLR(Optimizer& opt, int64_t step_size, double gamma = 0.1);

 protected:
  int64_t decays(int64_t t) const override { return t / step_size_; }

 private:
  int64_t step_size_;
};

// lr = base * gamma^(number of milestones <= t)
class MultiStepLR : public GammaDecayLR {
 public:
  MultiStepLR(Optimizer& opt, std::vector<int64_t> milestones, double gamma = 0.1);

 protected:
  int64_t decays(int64_t t) const override;

 private:
  std::vector<int64_t> milestones_;
};

// lr = base * gamma^t
class ExponentialLR : public GammaDecayLR {
 public:
  ExponentialLR(Optimizer& opt, double gamma);

 protected:
  int64_t decays(int64_t t) const override { return t; }
};

// PyTorch's LinearLR: lr = base * (start + (end - start) * min(t, total_iters) / total_iters)
class LinearLR : public LRScheduler {
 public:
  LinearLR(Optimizer& opt, double start_factor = 1.0 / 3.0, double end_factor = 1.0, int64_t total_iters = 5);
  double lr_at(int64_t t, size_t g) const override;

 private:
  double start_, end_;
  int64_t total_;
};

// Linear warmup to the base lr over warmup_steps, then constant: LinearLR(start_factor, 1, warmup).
// With start_factor 0 (the default) step t has lr = base * t / warmup_steps.
class LinearWarmup : public LinearLR {
 public:
  LinearWarmup(Optimizer& opt, int64_t warmup_steps, double start_factor = 0.0)
      : LinearLR(opt, start_factor, 1.0, warmup_steps) {}
};

// PyTorch's CosineAnnealingLR (closed form): eta_min + (base - eta_min) (1 + cos(pi t / T_max)) / 2
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& opt, int64_t T_max, double eta_min = 0.0);
  double lr_at(int64_t t, size_t g) const override;

 private:
  int64_t T_max_;
  double eta_min_;
};

// Linear warmup then cosine annealing:
//   t <  warmup: base * (start + (1 - start) * t / warmup)
//   t >= warmup: eta_min + (base - eta_min) (1 + cos(pi (t - warmup) / (total - warmup))) / 2
//   t >= total : eta_min
class WarmupCosineLR : public LRScheduler {
 public:
  WarmupCosineLR(Optimizer& opt, int64_t warmup_steps, int64_t total_steps, double eta_min = 0.0,
                 double warmup_start_factor = 0.0);
  double lr_at(int64_t t, size_t g) const override;

 private:
  int64_t warmup_, total_;
  double eta_min_, start_;
};

// A schedule that also cycles the optimizer's momentum (beta1 for the Adam family) against the
// learning rate, as PyTorch's OneCycleLR and CyclicLR do when cycle_momentum is on.
class MomentumCyclingLR : public LRScheduler {
 public:
  virtual double momentum_at(int64_t t) const = 0;

 protected:
  MomentumCyclingLR(Optimizer& opt, bool cycle_momentum) : LRScheduler(opt), cycle_momentum_(cycle_momentum) {}
  void apply(int64_t t) override;  // the lr, then every group's momentum when cycled

 private:
  bool cycle_momentum_;
};

enum class AnnealStrategy { Cos, Linear };

struct OneCycleLROptions {
  OneCycleLROptions() = default;
  KILN_ARG(double, pct_start) = 0.3;
  KILN_ARG(AnnealStrategy, anneal_strategy) = AnnealStrategy::Cos;
  KILN_ARG(double, div_factor) = 25.0;
  KILN_ARG(double, final_div_factor) = 1e4;
  KILN_ARG(bool, three_phase) = false;
  KILN_ARG(bool, cycle_momentum) = true;
  KILN_ARG(double, base_momentum) = 0.85;
  KILN_ARG(double, max_momentum) = 0.95;
};

// PyTorch's OneCycleLR (Smith & Topin, super-convergence). initial = max_lr / div_factor,
// min = initial / final_div_factor. Phases (end steps are float, as PyTorch computes them):
//   two-phase:   [0, pct*T - 1]: initial -> max (momentum max -> base);
//                [.., T - 1]:    max -> min (momentum base -> max)
//   three-phase: [0, pct*T - 1]: initial -> max; [.., 2 pct*T - 2]: max -> initial; [.., T - 1]:
//                initial -> min (momentum max -> base -> max -> max)
// anneal cos: end + (start - end) / 2 * (1 + cos(pi * pct)); linear: start + (end - start) * pct.
// Stepping past total_steps throws.
class OneCycleLR : public MomentumCyclingLR {
 public:
  OneCycleLR(Optimizer& opt, double max_lr, int64_t total_steps, const OneCycleLROptions& options = {});
  double lr_at(int64_t t, size_t g) const override;
  double momentum_at(int64_t t) const override;

 private:
  struct Phase {
    double end_step, start_lr, end_lr, start_m, end_m;  // lr values as multiples of max_lr
  };
  double anneal(double start, double end, double pct) const;
  // The value at step t annealed from p.*from to p.*to within the phase p holding t.
  double phase_value(int64_t t, double Phase::*from, double Phase::*to) const;
  double max_lr_;
  int64_t total_;
  OneCycleLROptions o_;
  std::vector<Phase> phases_;
};

enum class CyclicMode { Triangular, Triangular2, ExpRange };

struct CyclicLROptions {
  CyclicLROptions() = default;
  KILN_ARG(int64_t, step_size_up) = 2000;
  KILN_ARG(int64_t, step_size_down) = -1;  // -1: step_size_up
  KILN_ARG(CyclicMode, mode) = CyclicMode::Triangular;
  KILN_ARG(double, gamma) = 1.0;  // exp_range: amplitude * gamma^t
  KILN_ARG(bool, cycle_momentum) = true;
  KILN_ARG(double, base_momentum) = 0.8;
  KILN_ARG(double, max_momentum) = 0.9;
};

// PyTorch's CyclicLR (Smith 2017), scale_mode as PyTorch's default per mode (cycle for
// triangular/triangular2, iterations for exp_range):
//   cycle = floor(1 + t / (up + down)); x = 1 + t / (up + down) - cycle
//   f = x <= up/(up+down) ? x / (up/(up+down)) : (x - 1) / (up/(up+down) - 1)
//   lr = base_lr + (max_lr - base_lr) * f * scale;  momentum = max_m - (max_m - base_m) * f * scale
//   scale: 1 | 1 / 2^(cycle - 1) | gamma^t
class CyclicLR : public MomentumCyclingLR {
 public:
  CyclicLR(Optimizer& opt, double base_lr, double max_lr, const CyclicLROptions& options = {});
  double lr_at(int64_t t, size_t g) const override;
  double momentum_at(int64_t t) const override;

 private:
  double scaled_fraction(int64_t t) const;  // f * scale
  double base_lr_, max_lr_;
  CyclicLROptions o_;
};

}  // namespace kiln::optim
