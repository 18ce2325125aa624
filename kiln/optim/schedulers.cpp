#include "kiln/optim/schedulers.h"

#include <algorithm>
#include <cmath>

#include "kiln/core/error.h"

namespace kiln::optim {

namespace {
constexpr double kPi = 3.14159265358979323846;
}

// ---------------------------------------------------------------- base

LRScheduler::LRScheduler(Optimizer& optimizer) : opt_(optimizer) {
  for (const ParamGroup& g : opt_.param_groups()) base_lrs_.push_back(g.lr());
  last_lrs_ = base_lrs_;
}

void LRScheduler::initialize() {
  last_step_ = 0;
  apply(0);
}

void LRScheduler::step() {
  apply(last_step_ + 1);
  ++last_step_;
}

void LRScheduler::apply(int64_t t) {
  auto& groups = opt_.param_groups();
  const size_t n = std::min(groups.size(), base_lrs_.size());
  std::vector<double> lrs(n);
  for (size_t g = 0; g < n; ++g) lrs[g] = lr_at(t, g);  // may throw: change nothing then
  for (size_t g = 0; g < n; ++g) groups[g].set_lr(lrs[g]);
  last_lrs_ = lrs;
}

SchedulerStateDict LRScheduler::state_dict() const {
  SchedulerStateDict d;
  d.last_step = last_step_;
  d.base_lrs = base_lrs_;
  d.last_lrs = last_lrs_;
  return d;
}

void LRScheduler::load_state_dict(const SchedulerStateDict& d) {
  KILN_CHECK(d.base_lrs.size() == base_lrs_.size(), "LRScheduler::load_state_dict: the state dict has ",
             d.base_lrs.size(), " groups, the schedule ", base_lrs_.size());
  KILN_CHECK(d.last_step >= 0, "LRScheduler::load_state_dict: negative step count ", d.last_step);
  base_lrs_ = d.base_lrs;
  apply(d.last_step);
  last_step_ = d.last_step;
}

// ---------------------------------------------------------------- simple schedules

double GammaDecayLR::lr_at(int64_t t, size_t g) const {
  return base_lrs_[g] * std::pow(gamma_, static_cast<double>(decays(t)));
}

StepLR::StepLR(Optimizer& opt, int64_t step_size, double gamma) : GammaDecayLR(opt, gamma), step_size_(step_size) {
  KILN_CHECK(step_size > 0, "StepLR: step_size must be positive, got ", step_size);
  initialize();
}

MultiStepLR::MultiStepLR(Optimizer& opt, std::vector<int64_t> milestones, double gamma)
    : GammaDecayLR(opt, gamma), milestones_(std::move(milestones)) {
  std::sort(milestones_.begin(), milestones_.end());
  initialize();
}
int64_t MultiStepLR::decays(int64_t t) const {
  // bisect_right: milestones <= t (a repeated milestone counts twice, as PyTorch's Counter does)
  return std::upper_bound(milestones_.begin(), milestones_.end(), t) - milestones_.begin();
}

ExponentialLR::ExponentialLR(Optimizer& opt, double gamma) : GammaDecayLR(opt, gamma) { initialize(); }

LinearLR::LinearLR(Optimizer& opt, double start_factor, double end_factor, int64_t total_iters)
    : LRScheduler(opt), start_(start_factor), end_(end_factor), total_(total_iters) {
  KILN_CHECK(start_factor >= 0.0 && start_factor <= 1.0 && end_factor >= 0.0 && end_factor <= 1.0,
             "LinearLR: start_factor and end_factor must be in [0, 1], got ", start_factor, " and ", end_factor);
  KILN_CHECK(total_iters > 0, "LinearLR: total_iters must be positive, got ", total_iters);
  initialize();
}
double LinearLR::lr_at(int64_t t, size_t g) const {
  const double k = static_cast<double>(std::min(t, total_)) / static_cast<double>(total_);
  return base_lrs_[g] * (start_ + (end_ - start_) * k);
}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& opt, int64_t T_max, double eta_min)
    : LRScheduler(opt), T_max_(T_max), eta_min_(eta_min) {
  KILN_CHECK(T_max > 0, "CosineAnnealingLR: T_max must be positive, got ", T_max);
  initialize();
}
double CosineAnnealingLR::lr_at(int64_t t, size_t g) const {
  return eta_min_ +
         (base_lrs_[g] - eta_min_) * (1.0 + std::cos(kPi * static_cast<double>(t) / static_cast<double>(T_max_))) / 2.0;
}

WarmupCosineLR::WarmupCosineLR(Optimizer& opt, int64_t warmup_steps, int64_t total_steps, double eta_min,
                               double warmup_start_factor)
    : LRScheduler(opt), warmup_(warmup_steps), total_(total_steps), eta_min_(eta_min), start_(warmup_start_factor) {
  KILN_CHECK(warmup_steps >= 0 && total_steps > warmup_steps,
             "WarmupCosineLR: need 0 <= warmup_steps < total_steps, got ", warmup_steps, " and ", total_steps);
  KILN_CHECK(warmup_start_factor >= 0.0 && warmup_start_factor <= 1.0,
             "WarmupCosineLR: warmup_start_factor must be in [0, 1], got ", warmup_start_factor);
  initialize();
}
double WarmupCosineLR::lr_at(int64_t t, size_t g) const {
  const double base = base_lrs_[g];
  if (t < warmup_) return base * (start_ + (1.0 - start_) * static_cast<double>(t) / static_cast<double>(warmup_));
  if (t >= total_) return eta_min_;
  const double pct = static_cast<double>(t - warmup_) / static_cast<double>(total_ - warmup_);
  return eta_min_ + (base - eta_min_) * (1.0 + std::cos(kPi * pct)) / 2.0;
}

// ---------------------------------------------------------------- OneCycleLR

OneCycleLR::OneCycleLR(Optimizer& opt, double max_lr, int64_t total_steps, const OneCycleLROptions& o)
    : MomentumCyclingLR(opt, o.cycle_momentum()), max_lr_(max_lr), total_(total_steps), o_(o) {
  KILN_CHECK(total_steps > 0, "OneCycleLR: total_steps must be positive, got ", total_steps);
  KILN_CHECK(max_lr >= 0.0, "OneCycleLR: max_lr must be >= 0, got ", max_lr);
  KILN_CHECK(o.pct_start() >= 0.0 && o.pct_start() <= 1.0, "OneCycleLR: pct_start must be in [0, 1], got ",
             o.pct_start());
  KILN_CHECK(o.div_factor() > 0.0 && o.final_div_factor() > 0.0,
             "OneCycleLR: div_factor and final_div_factor must be positive");
  const double initial = max_lr / o.div_factor();
  const double min_lr = initial / o.final_div_factor();
  const double T = static_cast<double>(total_steps);
  const double bm = o.base_momentum(), mm = o.max_momentum();
  if (o.three_phase()) {
    phases_ = {{o.pct_start() * T - 1.0, initial, max_lr, mm, bm},
               {2.0 * o.pct_start() * T - 2.0, max_lr, initial, bm, mm},
               {T - 1.0, initial, min_lr, mm, mm}};
  } else {
    phases_ = {{o.pct_start() * T - 1.0, initial, max_lr, mm, bm}, {T - 1.0, max_lr, min_lr, bm, mm}};
  }
  for (double& b : base_lrs_) b = initial;  // PyTorch's group["initial_lr"]
  initialize();
}

double OneCycleLR::anneal(double start, double end, double pct) const {
  if (o_.anneal_strategy() == AnnealStrategy::Cos) return end + (start - end) / 2.0 * (std::cos(kPi * pct) + 1.0);
  return (end - start) * pct + start;
}

double OneCycleLR::lr_at(int64_t t, size_t) const {
  KILN_CHECK(t <= total_, "OneCycleLR: tried to step ", t,
             " times; the specified number of total "
             "steps is ",
             total_);
  return phase_value(t, &Phase::start_lr, &Phase::end_lr);
}

double OneCycleLR::momentum_at(int64_t t) const { return phase_value(t, &Phase::start_m, &Phase::end_m); }

double OneCycleLR::phase_value(int64_t t, double Phase::*from, double Phase::*to) const {
  double start = 0.0;
  for (size_t i = 0; i < phases_.size(); ++i) {
    const Phase& p = phases_[i];
    if (static_cast<double>(t) <= p.end_step || i + 1 == phases_.size())
      return anneal(p.*from, p.*to, (static_cast<double>(t) - start) / (p.end_step - start));
    start = p.end_step;
  }
  return 0.0;
}

// ---------------------------------------------------------------- MomentumCyclingLR

void MomentumCyclingLR::apply(int64_t t) {
  LRScheduler::apply(t);
  if (!cycle_momentum_) return;
  const double m = momentum_at(t);
  for (ParamGroup& g : opt_.param_groups()) g.set_momentum(m);
}

// ---------------------------------------------------------------- CyclicLR

CyclicLR::CyclicLR(Optimizer& opt, double base_lr, double max_lr, const CyclicLROptions& o)
    : MomentumCyclingLR(opt, o.cycle_momentum()), base_lr_(base_lr), max_lr_(max_lr), o_(o) {
  KILN_CHECK(o.step_size_up() > 0, "CyclicLR: step_size_up must be positive, got ", o.step_size_up());
  if (o_.step_size_down() <= 0) o_.step_size_down(o_.step_size_up());
  KILN_CHECK(base_lr >= 0.0 && max_lr >= 0.0, "CyclicLR: learning rates must be >= 0");
  for (double& b : base_lrs_) b = base_lr;
  initialize();
}

double CyclicLR::scaled_fraction(int64_t t) const {
  const double total = static_cast<double>(o_.step_size_up() + o_.step_size_down());
  const double ratio = static_cast<double>(o_.step_size_up()) / total;
  const double td = static_cast<double>(t);
  const double cycle = std::floor(1.0 + td / total);
  const double x = 1.0 + td / total - cycle;
  const double f = x <= ratio ? x / ratio : (x - 1.0) / (ratio - 1.0);
  double scale = 1.0;
  switch (o_.mode()) {
    case CyclicMode::Triangular: scale = 1.0; break;
    case CyclicMode::Triangular2: scale = 1.0 / std::pow(2.0, cycle - 1.0); break;
    case CyclicMode::ExpRange: scale = std::pow(o_.gamma(), td); break;
  }
  return f * scale;
}

double CyclicLR::lr_at(int64_t t, size_t g) const {
  return base_lrs_[g] + (max_lr_ - base_lrs_[g]) * scaled_fraction(t);
}

double CyclicLR::momentum_at(int64_t t) const {
  return o_.max_momentum() - (o_.max_momentum() - o_.base_momentum()) * scaled_fraction(t);
}

}  // namespace kiln::optim
