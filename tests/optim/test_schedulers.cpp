// LR schedules against values derived by hand from PyTorch's formulas at sampled steps.
#include <catch2/catch.hpp>

#include <cmath>
#include <initializer_list>
#include <utility>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/core/tensor.h"
#include "kiln/optim/optim.h"

using namespace kiln;

namespace {
const double kPi = 3.14159265358979323846;

Tensor param() { return zeros({2}).requires_grad_(); }

// lr of group 0 after stepping the schedule to step t (from its current step).
template <class S> double lr_after(S& s, optim::Optimizer& opt, int64_t t) {
  while (s.last_step() < t) s.step();
  return opt.param_groups()[0].lr();
}

// CHECKs lr_after at each (step, lr) in order.
template <class S> void check_lrs(S& s, optim::Optimizer& opt, std::initializer_list<std::pair<int64_t, double>> want) {
  for (const auto& [t, lr] : want) {
    INFO("step " << t);
    CHECK(lr_after(s, opt, t) == Approx(lr));
  }
}
}  // namespace

TEST_CASE("StepLR, MultiStepLR, ExponentialLR", "[sched]") {
  Tensor w = param();
  SECTION("StepLR") {
    optim::SGD opt({w}, 0.1);
    optim::StepLR s(opt, 3, 0.5);
    check_lrs(s, opt, {{0, 0.1}, {2, 0.1}, {3, 0.05}, {7, 0.025}});
  }
  SECTION("MultiStepLR") {
    optim::SGD opt({w}, 1.0);
    optim::MultiStepLR s(opt, {2, 5}, 0.1);
    check_lrs(s, opt, {{1, 1.0}, {2, 0.1}, {4, 0.1}, {5, 0.01}});
    CHECK(s.get_last_lr()[0] == Approx(0.01));
  }
  SECTION("ExponentialLR") {
    optim::SGD opt({w}, 2.0);
    optim::ExponentialLR s(opt, 0.9);
    CHECK(lr_after(s, opt, 0) == Approx(2.0));
    CHECK(lr_after(s, opt, 3) == Approx(2.0 * 0.729));
  }
}

TEST_CASE("LinearLR, LinearWarmup, CosineAnnealingLR, WarmupCosineLR", "[sched]") {
  Tensor w = param();
  SECTION("LinearLR with PyTorch's defaults") {
    optim::SGD opt({w}, 0.3);
    optim::LinearLR s(opt);  // 1/3 -> 1 over 5 steps
    CHECK(lr_after(s, opt, 0) == Approx(0.1));
    CHECK(lr_after(s, opt, 2) == Approx(0.3 * (1.0 / 3 + (2.0 / 3) * 2 / 5)));
    CHECK(lr_after(s, opt, 5) == Approx(0.3));
    CHECK(lr_after(s, opt, 9) == Approx(0.3));
  }
  SECTION("LinearWarmup") {
    optim::AdamW opt({w}, 1e-3);
    optim::LinearWarmup s(opt, 4);
    CHECK(lr_after(s, opt, 0) == 0.0);
    CHECK(lr_after(s, opt, 1) == Approx(2.5e-4));
    CHECK(lr_after(s, opt, 4) == Approx(1e-3));
    CHECK(lr_after(s, opt, 10) == Approx(1e-3));
  }
  SECTION("CosineAnnealingLR") {
    optim::SGD opt({w}, 0.1);
    optim::CosineAnnealingLR s(opt, 10, 0.001);
    CHECK(lr_after(s, opt, 0) == Approx(0.1));
    CHECK(lr_after(s, opt, 3) == Approx(0.001 + 0.099 * (1 + std::cos(kPi * 0.3)) / 2));
    CHECK(lr_after(s, opt, 5) == Approx(0.0505));
    CHECK(lr_after(s, opt, 10) == Approx(0.001));
  }
  SECTION("WarmupCosineLR") {
    optim::SGD opt({w}, 0.1);
    optim::WarmupCosineLR s(opt, 5, 25, 0.0);
    CHECK(lr_after(s, opt, 0) == 0.0);
    CHECK(lr_after(s, opt, 2) == Approx(0.04));
    CHECK(lr_after(s, opt, 5) == Approx(0.1));
    CHECK(lr_after(s, opt, 15) == Approx(0.05));
    CHECK(lr_after(s, opt, 20) == Approx(0.1 * (1 + std::cos(kPi * 0.75)) / 2));
    CHECK(lr_after(s, opt, 25) == 0.0);
  }
}

TEST_CASE("OneCycleLR: lr and momentum at sampled steps", "[sched]") {
  Tensor w = param();
  SECTION("SGD, cos annealing, momentum cycling") {
    optim::SGD opt({w}, optim::SGDOptions(0.5).momentum(0.9));
    optim::OneCycleLR s(opt, 0.1, 100);  // warmup ends at pct*T - 1 = 29
    auto& g = opt.param_groups()[0];
    CHECK(g.lr() == Approx(0.004));  // max / 25
    CHECK(g.momentum() == Approx(0.95));
    CHECK(lr_after(s, opt, 14) == Approx(0.1 + (0.004 - 0.1) / 2 * (std::cos(kPi * 14 / 29) + 1)));
    CHECK(g.momentum() == Approx(0.85 + (0.95 - 0.85) / 2 * (std::cos(kPi * 14 / 29) + 1)));
    CHECK(lr_after(s, opt, 29) == Approx(0.1));
    CHECK(g.momentum() == Approx(0.85));
    CHECK(lr_after(s, opt, 64) == Approx((0.1 + 0.004 / 1e4) / 2));  // middle of the anneal
    CHECK(g.momentum() == Approx(0.9));
    CHECK(lr_after(s, opt, 99) == Approx(4e-7));
    CHECK(g.momentum() == Approx(0.95));
    s.step();  // step 100 == total_steps is allowed, as in PyTorch
    CHECK_THROWS_AS(s.step(), kiln::Error);
  }
  SECTION("AdamW cycles beta1; linear annealing") {
    optim::AdamW opt({w}, 1e-3);
    optim::OneCycleLR s(opt, 1e-2, 50,
                        optim::OneCycleLROptions()
                            .anneal_strategy(optim::AnnealStrategy::Linear)
                            .pct_start(0.2)
                            .div_factor(10)
                            .final_div_factor(100));
    auto& o = static_cast<const optim::AdamWOptions&>(opt.param_groups()[0].options());
    CHECK(opt.param_groups()[0].lr() == Approx(1e-3));
    CHECK(std::get<0>(o.betas()) == Approx(0.95));
    CHECK(std::get<1>(o.betas()) == 0.999);
    CHECK(lr_after(s, opt, 4) == Approx(1e-3 + 9e-3 * 4 / 9));  // warmup ends at 9
    CHECK(std::get<0>(o.betas()) == Approx(0.95 - 0.1 * 4 / 9));
    CHECK(lr_after(s, opt, 9) == Approx(1e-2));
    CHECK(lr_after(s, opt, 29) == Approx(1e-2 + (1e-5 - 1e-2) * 20 / 40));
    CHECK(lr_after(s, opt, 49) == Approx(1e-5));
  }
  SECTION("three phases, no momentum cycling") {
    optim::SGD opt({w}, optim::SGDOptions(0.5).momentum(0.5));
    optim::OneCycleLR s(opt, 1.0, 100, optim::OneCycleLROptions().three_phase(true).cycle_momentum(false));
    CHECK(lr_after(s, opt, 29) == Approx(1.0));
    CHECK(lr_after(s, opt, 58) == Approx(0.04));  // back to initial at 2*pct*T - 2
    CHECK(lr_after(s, opt, 99) == Approx(4e-6));
    CHECK(opt.param_groups()[0].momentum() == 0.5);
  }
}

TEST_CASE("CyclicLR: triangular, triangular2, exp_range", "[sched]") {
  Tensor w = param();
  SECTION("triangular with momentum") {
    optim::SGD opt({w}, optim::SGDOptions(0.1).momentum(0.9));
    optim::CyclicLR s(opt, 0.001, 0.006, optim::CyclicLROptions().step_size_up(4));
    auto& g = opt.param_groups()[0];
    CHECK(g.lr() == Approx(0.001));
    CHECK(g.momentum() == Approx(0.9));
    CHECK(lr_after(s, opt, 2) == Approx(0.0035));
    CHECK(g.momentum() == Approx(0.85));
    CHECK(lr_after(s, opt, 4) == Approx(0.006));
    CHECK(g.momentum() == Approx(0.8));
    CHECK(lr_after(s, opt, 6) == Approx(0.0035));
    CHECK(lr_after(s, opt, 8) == Approx(0.001));
    CHECK(lr_after(s, opt, 12) == Approx(0.006));
  }
  SECTION("triangular2 halves the amplitude each cycle; asymmetric steps") {
    optim::SGD opt({w}, 0.1);
    optim::CyclicLR s(opt, 0.0, 1.0,
                      optim::CyclicLROptions()
                          .step_size_up(2)
                          .step_size_down(6)
                          .mode(optim::CyclicMode::Triangular2)
                          .cycle_momentum(false));
    check_lrs(s, opt, {{2, 1.0}, {5, 0.5}, {10, 0.5}, {18, 0.25}});
  }
  SECTION("exp_range") {
    optim::Adam opt({w}, 0.1);
    optim::CyclicLR s(opt, 0.001, 0.006,
                      optim::CyclicLROptions().step_size_up(4).mode(optim::CyclicMode::ExpRange).gamma(0.9));
    CHECK(lr_after(s, opt, 2) == Approx(0.001 + 0.005 * 0.5 * std::pow(0.9, 2)));
    CHECK(lr_after(s, opt, 12) == Approx(0.001 + 0.005 * std::pow(0.9, 12)));
    CHECK(opt.param_groups()[0].momentum() == Approx(0.9 - 0.1 * std::pow(0.9, 12)));
  }
}

TEST_CASE("schedules apply to every group and resume from state_dict", "[sched]") {
  Tensor a = param(), b = param();
  optim::SGD opt({optim::ParamGroup({a}), optim::ParamGroup({b}, optim::SGDOptions(0.01))}, 0.1);
  optim::StepLR s(opt, 2, 0.5);
  for (int i = 0; i < 5; ++i) s.step();
  CHECK(opt.param_groups()[0].lr() == Approx(0.025));
  CHECK(opt.param_groups()[1].lr() == Approx(0.0025));

  optim::SGD opt2({optim::ParamGroup({param()}), optim::ParamGroup({param()}, optim::SGDOptions(0.01))}, 0.1);
  optim::OneCycleLR one(opt, 1.0, 40), one2(opt2, 1.0, 40);
  for (int i = 0; i < 17; ++i) one.step();
  one2.load_state_dict(one.state_dict());
  for (int i = 0; i < 5; ++i) {
    one.step();
    one2.step();
  }
  CHECK(one2.last_step() == 22);
  CHECK(opt2.param_groups()[1].lr() == opt.param_groups()[1].lr());
  CHECK(opt2.param_groups()[0].momentum() == opt.param_groups()[0].momentum());
}
