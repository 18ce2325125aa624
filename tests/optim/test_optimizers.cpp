// Optimizers: the first steps against f64 references written from the published update rules
// (PyTorch's documented algorithms; the LAMB and LARS papers), param groups, zero_grad,
// state_dict round trips, the fused multi-tensor path vs a per-parameter loop, 16-bit master
// weights, found-inf skipping, and errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/core/autograd.h"
#include "kiln/core/error.h"
#include "kiln/core/tensor.h"
#include "kiln/optim/optim.h"
#include "tests/test_util.h"

using namespace kiln;
using kiln_test::values;
using Vec = std::vector<double>;

namespace {

Tensor make(const Vec& v, DType dt = DType::F64) { return tensor(v, TensorOptions(dt)); }

// The synthetic gradient at step k: depends on the current parameter so trajectories matter.
Vec grad_fn(const Vec& p, int k, int which) {
  Vec g(p.size());
  for (size_t i = 0; i < p.size(); ++i)
    g[i] = 0.5 * p[i] + 0.1 * double(i + 1 + which) * std::cos(double(k) + double(i) + 0.3 * which);
  return g;
}

Vec init_values(size_t n, int which) {
  Vec v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 0.3 * std::sin(1.7 * double(i) + which) + 0.05 * which;
  return v;
}

// ---- f64 references of the published rules
struct RefState {
  Vec m, v;
  bool has_buf = false;
  int step = 0;
};

void ref_sgd(Vec& p, const Vec& g0, RefState& s, double lr, double mom, double damp, double wd, bool nesterov) {
  Vec g = g0;
  for (size_t i = 0; i < p.size(); ++i) g[i] += wd * p[i];
  if (mom != 0) {
    if (!s.has_buf) {
      s.m = g;
      s.has_buf = true;
    } else
      for (size_t i = 0; i < p.size(); ++i) s.m[i] = mom * s.m[i] + (1 - damp) * g[i];
    for (size_t i = 0; i < p.size(); ++i) g[i] = nesterov ? g[i] + mom * s.m[i] : s.m[i];
  }
  for (size_t i = 0; i < p.size(); ++i) p[i] -= lr * g[i];
}

void ref_adam(Vec& p, const Vec& g0, RefState& s, double lr, double b1, double b2, double eps, double wd,
              bool decoupled) {
  if (s.m.empty()) {
    s.m.assign(p.size(), 0);
    s.v.assign(p.size(), 0);
  }
  ++s.step;
  Vec g = g0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (decoupled) p[i] *= 1 - lr * wd;
    else g[i] += wd * p[i];
    s.m[i] = b1 * s.m[i] + (1 - b1) * g[i];
    s.v[i] = b2 * s.v[i] + (1 - b2) * g[i] * g[i];
    double bc1 = 1 - std::pow(b1, s.step), bc2 = 1 - std::pow(b2, s.step);
    double denom = std::sqrt(s.v[i]) / std::sqrt(bc2) + eps;
    p[i] -= lr / bc1 * s.m[i] / denom;
  }
}

void ref_lamb(Vec& p, const Vec& g, RefState& s, double lr, double b1, double b2, double eps, double wd) {
  if (s.m.empty()) {
    s.m.assign(p.size(), 0);
    s.v.assign(p.size(), 0);
  }
  ++s.step;
  double bc1 = 1 - std::pow(b1, s.step), bc2 = 1 - std::pow(b2, s.step);
  Vec r(p.size());
  double rn = 0, pn = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    s.m[i] = b1 * s.m[i] + (1 - b1) * g[i];
    s.v[i] = b2 * s.v[i] + (1 - b2) * g[i] * g[i];
    r[i] = (s.m[i] / bc1) / (std::sqrt(s.v[i] / bc2) + eps) + wd * p[i];
    rn += r[i] * r[i];
    pn += p[i] * p[i];
  }
  rn = std::sqrt(rn);
  pn = std::sqrt(pn);
  double trust = (pn > 0 && rn > 0) ? pn / rn : 1.0;
  for (size_t i = 0; i < p.size(); ++i) p[i] -= lr * trust * r[i];
}

void ref_lars(Vec& p, const Vec& g, RefState& s, double lr, double mom, double wd, double eta, double eps) {
  double pn = 0, gn = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    pn += p[i] * p[i];
    gn += g[i] * g[i];
  }
  pn = std::sqrt(pn);
  gn = std::sqrt(gn);
  double trust = (pn > 0 && gn > 0) ? eta * pn / (gn + wd * pn + eps) : 1.0;
  Vec d(p.size());
  for (size_t i = 0; i < p.size(); ++i) d[i] = trust * (g[i] + wd * p[i]);
  if (!s.has_buf) {
    s.m = d;
    s.has_buf = true;
  } else
    for (size_t i = 0; i < p.size(); ++i) s.m[i] = mom * s.m[i] + d[i];
  for (size_t i = 0; i < p.size(); ++i) p[i] -= lr * s.m[i];
}

using RefStep = std::function<void(Vec& p, const Vec& g, RefState& s)>;
using MakeOpt = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>;

// Runs `steps` steps of the optimizer on two parameters (sizes 7 and 3) and of the reference, and
// compares after every step.
void check_against_reference(const MakeOpt& make_opt, const RefStep& ref, DType dt, double tol, int steps = 3) {
  std::vector<Vec> ref_p = {init_values(7, 0), init_values(3, 1)};
  std::vector<RefState> ref_s(2);
  std::vector<Tensor> params = {make(ref_p[0], dt), make(ref_p[1], dt)};
  for (auto& p : params) p.requires_grad_();
  auto opt = make_opt(params);
  for (int k = 0; k < steps; ++k) {
    for (int j = 0; j < 2; ++j) {
      Vec kp = values(params[j]);
      params[j].set_grad(make(grad_fn(kp, k, j), dt));
      ref(ref_p[j], grad_fn(ref_p[j], k, j), ref_s[j]);
    }
    opt->step();
    for (int j = 0; j < 2; ++j) {
      Vec got = values(params[j]);
      for (size_t i = 0; i < got.size(); ++i) {
        INFO("step " << k << " param " << j << " element " << i);
        REQUIRE(got[i] == Approx(ref_p[j][i]).epsilon(tol).margin(tol));
      }
    }
  }
}

void check_both_dtypes(const MakeOpt& make_opt, const RefStep& ref) {
  SECTION("f64 parameters") { check_against_reference(make_opt, ref, DType::F64, 1e-12); }
  SECTION("f32 parameters") { check_against_reference(make_opt, ref, DType::F32, 2e-5); }
}

}  // namespace

TEST_CASE("SGD: plain, momentum + dampening + weight decay, nesterov", "[optim]") {
  SECTION("plain") {
    check_both_dtypes([](std::vector<Tensor> ps) { return std::make_unique<optim::SGD>(ps, optim::SGDOptions(0.1)); },
                      [](Vec& p, const Vec& g, RefState& s) { ref_sgd(p, g, s, 0.1, 0, 0, 0, false); });
  }
  SECTION("momentum, dampening, weight decay") {
    check_both_dtypes(
        [](std::vector<Tensor> ps) {
          return std::make_unique<optim::SGD>(ps,
                                              optim::SGDOptions(0.05).momentum(0.9).dampening(0.2).weight_decay(0.01));
        },
        [](Vec& p, const Vec& g, RefState& s) { ref_sgd(p, g, s, 0.05, 0.9, 0.2, 0.01, false); });
  }
  SECTION("nesterov") {
    check_both_dtypes(
        [](std::vector<Tensor> ps) {
          return std::make_unique<optim::SGD>(ps,
                                              optim::SGDOptions(0.05).momentum(0.8).nesterov(true).weight_decay(1e-3));
        },
        [](Vec& p, const Vec& g, RefState& s) { ref_sgd(p, g, s, 0.05, 0.8, 0, 1e-3, true); });
  }
}

TEST_CASE("Adam with L2 weight decay", "[optim]") {
  check_both_dtypes(
      [](std::vector<Tensor> ps) {
        return std::make_unique<optim::Adam>(ps,
                                             optim::AdamOptions(1e-2).betas({0.8, 0.99}).eps(1e-6).weight_decay(0.1));
      },
      [](Vec& p, const Vec& g, RefState& s) { ref_adam(p, g, s, 1e-2, 0.8, 0.99, 1e-6, 0.1, false); });
}

TEST_CASE("AdamW with decoupled weight decay", "[optim]") {
  check_both_dtypes(
      [](std::vector<Tensor> ps) {
        return std::make_unique<optim::AdamW>(
            ps, optim::AdamWOptions(1e-2).betas({0.9, 0.999}).eps(1e-8).weight_decay(1e-1));
      },
      [](Vec& p, const Vec& g, RefState& s) { ref_adam(p, g, s, 1e-2, 0.9, 0.999, 1e-8, 0.1, true); });
}

TEST_CASE("LAMB against the paper's update with bias correction", "[optim]") {
  check_both_dtypes(
      [](std::vector<Tensor> ps) {
        return std::make_unique<optim::LAMB>(ps, optim::LAMBOptions(1e-2).weight_decay(0.05));
      },
      [](Vec& p, const Vec& g, RefState& s) { ref_lamb(p, g, s, 1e-2, 0.9, 0.999, 1e-6, 0.05); });
}

TEST_CASE("LARS against the paper's layer-wise trust ratio", "[optim]") {
  check_both_dtypes(
      [](std::vector<Tensor> ps) {
        return std::make_unique<optim::LARS>(
            ps, optim::LARSOptions(0.5).momentum(0.9).weight_decay(1e-3).trust_coefficient(0.01));
      },
      [](Vec& p, const Vec& g, RefState& s) { ref_lars(p, g, s, 0.5, 0.9, 1e-3, 0.01, 1e-8); });
}

TEST_CASE("defaults equal PyTorch's", "[optim]") {
  optim::AdamWOptions aw;
  CHECK(aw.lr() == 1e-3);
  CHECK(std::get<0>(aw.betas()) == 0.9);
  CHECK(std::get<1>(aw.betas()) == 0.999);
  CHECK(aw.eps() == 1e-8);
  CHECK(aw.weight_decay() == 1e-2);
  optim::AdamOptions a;
  CHECK(a.weight_decay() == 0.0);
  CHECK(a.eps() == 1e-8);
  optim::SGDOptions s(0.1);
  CHECK(s.lr() == 0.1);
  CHECK(s.momentum() == 0.0);
  CHECK(s.dampening() == 0.0);
  CHECK(!s.nesterov());
  CHECK(optim::SGDOptions().lr() == 1e-3);
  optim::LAMBOptions lamb;
  CHECK(lamb.eps() == 1e-6);
  CHECK(lamb.weight_decay() == 1e-2);
  CHECK(lamb.bias_correction());
  optim::LARSOptions lars;
  CHECK(lars.momentum() == 0.9);
  CHECK(lars.trust_coefficient() == 1e-3);
}

TEST_CASE("each optimizer keeps its own state: SGD a momentum_buffer, Adam two moments", "[optim]") {
  Tensor w = make({1.0}).requires_grad_();
  optim::SGD sgd({w}, optim::SGDOptions(0.1).momentum(0.9));
  for (int k = 0; k < 2; ++k) {
    w.set_grad(make({0.5}));
    sgd.step();
  }
  // buf = 0.5, then 0.9 * 0.5 + 0.5; w = 1 - 0.1 * 0.5 - 0.1 * 0.95
  const optim::SGDParamState* s = sgd.state(w);
  REQUIRE(s);
  CHECK(values(s->momentum_buffer)[0] == Approx(0.95).epsilon(1e-15));
  CHECK(values(w)[0] == Approx(0.855).epsilon(1e-15));
  auto keys = [](const std::map<std::string, Tensor>& entries) {
    std::vector<std::string> out;
    for (const auto& [key, t] : entries) out.push_back(key);
    return out;
  };
  CHECK(keys(sgd.state_dict().state.at(0)) == std::vector<std::string>{"momentum_buffer", "step"});

  Tensor plain = make({1.0}).requires_grad_();
  optim::SGD no_momentum({plain}, optim::SGDOptions(0.1));
  plain.set_grad(make({0.5}));
  no_momentum.step();
  CHECK(!no_momentum.state(plain)->momentum_buffer.defined());
  CHECK(values(plain)[0] == Approx(0.95).epsilon(1e-15));
  CHECK(keys(no_momentum.state_dict().state.at(0)) == std::vector<std::string>{"step"});

  Tensor a = make({1.0}).requires_grad_();
  optim::Adam adam({a}, optim::AdamOptions(0.1));
  a.set_grad(make({0.5}));
  adam.step();
  const optim::AdamParamState* as = adam.state(a);
  CHECK(values(as->exp_avg)[0] == Approx(0.05).epsilon(1e-15));        // (1 - 0.9) * 0.5
  CHECK(values(as->exp_avg_sq)[0] == Approx(0.00025).epsilon(1e-12));  // (1 - 0.999) * 0.25
  CHECK(keys(adam.state_dict().state.at(0)) == std::vector<std::string>{"exp_avg", "exp_avg_sq", "step"});
  // a state entry another optimizer would use is refused
  optim::OptimizerStateDict wrong = sgd.state_dict();
  wrong.state.at(0)["exp_avg"] = wrong.state.at(0).at("momentum_buffer");
  CHECK_THROWS_WITH(sgd.load_state_dict(wrong), Catch::Contains("unknown state entry 'exp_avg'"));
}

TEST_CASE("parameter groups with different learning rates", "[optim]") {
  Tensor a = make({1.0, 2.0}).requires_grad_();
  Tensor b = make({3.0}).requires_grad_();
  optim::SGD opt({optim::ParamGroup({a}), optim::ParamGroup({b}, optim::SGDOptions(0.01))}, optim::SGDOptions(0.1));
  REQUIRE(opt.param_groups().size() == 2);
  CHECK(opt.param_groups()[0].lr() == 0.1);
  CHECK(opt.param_groups()[1].lr() == 0.01);
  a.set_grad(make({1.0, 1.0}));
  b.set_grad(make({1.0}));
  opt.step();
  CHECK(values(a) == Vec{0.9, 1.9});
  CHECK(values(b)[0] == Approx(2.99).epsilon(1e-15));
  opt.param_groups()[0].set_lr(1.0);  // what a schedule does
  opt.step();
  CHECK(values(a)[0] == Approx(0.9 - 1.0).epsilon(1e-15));
  CHECK(values(a)[1] == Approx(1.9 - 1.0).epsilon(1e-15));

  // add_param_group with the defaults, and a per-group option other than lr
  Tensor c = make({5.0}).requires_grad_();
  opt.add_param_group(optim::ParamGroup({c}));
  CHECK(opt.param_groups()[2].lr() == 0.1);
  Tensor d = make({5.0}).requires_grad_();
  opt.add_param_group(optim::ParamGroup({d}, optim::SGDOptions(0.1).weight_decay(1.0)));
  c.set_grad(make({0.0}));
  d.set_grad(make({0.0}));
  opt.step();
  CHECK(values(c)[0] == 5.0);
  CHECK(values(d)[0] == Approx(4.5));
}

TEST_CASE("zero_grad sets gradients to none by default", "[optim]") {
  Tensor w = make({1.0, 2.0}).requires_grad_();
  optim::SGD opt({w}, 0.1);
  ((w * w).sum()).backward();
  REQUIRE(w.grad().defined());
  opt.zero_grad(false);
  REQUIRE(w.grad().defined());
  CHECK(values(w.grad()) == Vec{0.0, 0.0});
  opt.zero_grad();
  CHECK(!w.grad().defined());
  opt.step();  // no gradient: nothing happens
  CHECK(values(w) == Vec{1.0, 2.0});
  CHECK(opt.state(w) == nullptr);
}

TEST_CASE("a step after backward through autograd", "[optim]") {
  Tensor w = make({1.0, -2.0, 0.5}).requires_grad_();
  optim::SGD opt({w}, optim::SGDOptions(0.25));
  Tensor loss = (w * w).sum();  // grad 2w
  loss.backward();
  opt.step();
  CHECK(values(w) == Vec{0.5, -1.0, 0.25});
  CHECK(opt.state(w)->step.item<double>() == 1.0);
}

namespace {

// Builds parameters of several sizes (some spanning many 64K-element chunks), sets gradients from
// a seed, and returns them.
std::vector<Tensor> big_params(DType dt) {
  std::vector<int64_t> sizes = {140001, 7, 3000, 1, 65537, 300};
  std::vector<Tensor> ps;
  manual_seed(7);
  for (int64_t n : sizes) ps.push_back(randn({n}, TensorOptions(dt)).requires_grad_());
  return ps;
}
void set_grads(std::vector<Tensor>& ps, int k) {
  // Noise drawn once per (step, size) and reused: the Philox normal draw dominates test time.
  static std::map<std::pair<int, int64_t>, Tensor> noise;
  for (auto& p : ps) {
    Tensor& n = noise[{k, p.numel()}];
    if (!n.defined()) {
      manual_seed(100 + k);
      n = randn(p.sizes());
    }
    p.set_grad(n.to(p.dtype()) + p.detach() * 0.1);
  }
}
std::vector<Tensor> clones(const std::vector<Tensor>& ps) {
  std::vector<Tensor> out;
  for (auto& p : ps) out.push_back(p.detach().clone().requires_grad_());
  return out;
}

// Steps `oa` (over `a`) and `ob` (over `b`) with the gradients of steps from..to-1, then REQUIREs
// the two parameter lists equal.
void step_both_and_compare(std::vector<Tensor>& a, optim::Optimizer& oa, std::vector<Tensor>& b, optim::Optimizer& ob,
                           int from, int to) {
  for (int k = from; k < to; ++k) {
    set_grads(a, k);
    set_grads(b, k);
    oa.step();
    ob.step();
  }
  for (size_t i = 0; i < a.size(); ++i) REQUIRE(equal(a[i], b[i]));
}

using MakeAny = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>;

std::vector<std::pair<const char*, MakeAny>> all_optimizers() {
  return {
      {"SGD",
       [](std::vector<Tensor> p) {
         return std::make_unique<optim::SGD>(p,
                                             optim::SGDOptions(0.01).momentum(0.9).nesterov(true).weight_decay(1e-4));
       }},
      {"Adam",
       [](std::vector<Tensor> p) {
         return std::make_unique<optim::Adam>(p, optim::AdamOptions(1e-3).weight_decay(1e-2));
       }},
      {"AdamW",
       [](std::vector<Tensor> p) {
         return std::make_unique<optim::AdamW>(p, optim::AdamWOptions(1e-3).weight_decay(1e-2));
       }},
      {"LAMB", [](std::vector<Tensor> p) { return std::make_unique<optim::LAMB>(p, optim::LAMBOptions(1e-3)); }},
      {"LARS",
       [](std::vector<Tensor> p) {
         return std::make_unique<optim::LARS>(p, optim::LARSOptions(0.1).weight_decay(1e-4));
       }},
  };
}

// Runs body(make_opt, params) for every optimizer of all_optimizers() and every dtype of dtypes,
// params being fresh big_params of that dtype, with an INFO naming both.
template <class Body> void for_each_optimizer(std::initializer_list<DType> dtypes, Body&& body) {
  for (auto& [name, make_opt] : all_optimizers())
    for (DType dt : dtypes) {
      INFO(name << " " << dt);
      body(make_opt, big_params(dt));
    }
}

}  // namespace

TEST_CASE("the fused multi-tensor step equals a per-parameter loop bitwise", "[optim]") {
  for_each_optimizer({DType::F32, DType::BF16}, [](const MakeAny& make_opt, std::vector<Tensor> a) {
    auto b = clones(a);
    auto fused = make_opt(a);
    auto loop = make_opt(b);
    loop->set_fused(false);
    step_both_and_compare(a, *fused, b, *loop, 0, 3);
  });
}

TEST_CASE("fused AdamW equals an unfused AdamW written with tensor ops", "[optim]") {
  auto ps = big_params(DType::F32);
  auto ref = clones(ps);
  std::vector<Tensor> m, v;
  for (auto& p : ref) {
    m.push_back(zeros_like(p));
    v.push_back(zeros_like(p));
  }
  const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.05;
  optim::AdamW opt(ps, optim::AdamWOptions(lr).weight_decay(wd));
  for (int k = 1; k <= 3; ++k) {
    set_grads(ps, k);
    set_grads(ref, k);
    opt.step();
    NoGradGuard ng;
    for (size_t i = 0; i < ref.size(); ++i) {
      Tensor p = ref[i].detach();
      Tensor g = ref[i].grad();
      p.mul_(1 - lr * wd);
      m[i].mul_(b1).add_(g, 1 - b1);
      v[i].mul_(b2).add_(g * g, 1 - b2);
      Tensor denom = v[i].sqrt() / std::sqrt(1 - std::pow(b2, k)) + eps;
      p.add_(m[i] / denom, -lr / (1 - std::pow(b1, k)));
    }
  }
  for (size_t i = 0; i < ps.size(); ++i) REQUIRE(allclose(ps[i], ref[i], 1e-5, 1e-6));
}

TEST_CASE("state_dict round trip resumes identically", "[optim]") {
  for_each_optimizer({DType::F32, DType::F16}, [](const MakeAny& make_opt, std::vector<Tensor> a) {
    auto opt = make_opt(a);
    for (int k = 0; k < 3; ++k) {
      set_grads(a, k);
      opt->step();
    }
    optim::OptimizerStateDict sd = opt->state_dict();
    auto b = clones(a);
    // through the flat form a checkpoint file would hold
    auto sd2 = optim::OptimizerStateDict::unflatten(sd.optimizer, sd.flatten());
    auto opt2 = make_opt(b);
    opt2->param_groups()[0].set_lr(123.0);  // overwritten by the load
    opt2->load_state_dict(sd2);
    CHECK(opt2->param_groups()[0].lr() == opt->param_groups()[0].lr());
    step_both_and_compare(a, *opt, b, *opt2, 3, 5);
    // the saved dict is a deep copy: later steps did not change it
    CHECK(sd.state.at(0).at("step").item<double>() == 3.0);
  });
}

TEST_CASE("f16 and bf16 parameters keep f32 master weights", "[optim]") {
  for (DType dt : {DType::F16, DType::BF16}) {
    INFO(dt);
    Vec init = init_values(5, 0);
    Tensor p16 = make(init, dt).requires_grad_();
    Tensor p32 = p16.detach().to(DType::F32).requires_grad_();
    optim::AdamW o16({p16}, optim::AdamWOptions(1e-4));
    optim::AdamW o32({p32}, optim::AdamWOptions(1e-4));
    for (int k = 0; k < 3; ++k) {
      Tensor g = make(grad_fn(init, k, 0), DType::F32);
      p16.set_grad(g.to(dt));
      p32.set_grad(g.to(dt).to(DType::F32));
      o16.step();
      o32.step();
    }
    const optim::AdamParamState* s = o16.state(p16);
    REQUIRE(s);
    REQUIRE(s->master.defined());
    CHECK(s->master.dtype() == DType::F32);
    CHECK(s->exp_avg.dtype() == DType::F32);
    CHECK(equal(s->master, p32.detach()));         // the f32 trajectory, not a 16-bit one
    CHECK(equal(p16, s->master.to(dt)));           // the parameter is the rounded master
    CHECK(!equal(p16.to(DType::F32), s->master));  // tiny lr updates are below 16-bit resolution
  }
}

TEST_CASE("found_inf skips the step; grad_scale unscales inside the update", "[optim]") {
  Tensor w = make({1.0, 2.0}, DType::F32).requires_grad_();
  optim::Adam opt({w}, 0.1);
  w.set_grad(make({0.5, -0.5}, DType::F32));
  opt.step(optim::StepFlags{full({}, 1.0), Tensor()});
  CHECK(values(w) == Vec{1.0, 2.0});
  CHECK(opt.state(w)->step.item<double>() == 0.0);
  CHECK(values(opt.state(w)->exp_avg) == Vec{0.0, 0.0});

  Tensor w2 = make({1.0, 2.0}, DType::F32).requires_grad_();
  optim::Adam opt2({w2}, 0.1);
  opt.step(optim::StepFlags{zeros({}), Tensor()});  // flag clear: steps
  w2.set_grad(make({0.5 * 1024, -0.5 * 1024}, DType::F32));
  opt2.step(optim::StepFlags{Tensor(), full({}, 1024.0)});
  CHECK(equal(w, w2));
}

TEST_CASE("dense permuted (channels_last-like) parameters", "[optim]") {
  manual_seed(3);
  Tensor base = randn({2, 3, 4, 5});
  Tensor nhwc = base.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2});  // NCHW sizes, NHWC strides
  REQUIRE(!nhwc.is_contiguous());
  Tensor a = nhwc.requires_grad_();
  Tensor b = base.clone().requires_grad_();
  optim::AdamW oa({a}, 1e-2), ob({b}, 1e-2);
  for (int k = 0; k < 2; ++k) {
    manual_seed(9 + k);
    Tensor g = randn({2, 3, 4, 5});
    a.set_grad(g);  // contiguous gradient: copied once into the parameter's layout
    b.set_grad(g);
    oa.step();
    ob.step();
  }
  CHECK(oa.state(a)->exp_avg.strides() == a.strides());
  CHECK(equal(a, b));
}

#define KILN_THROWS(...) CHECK_THROWS_AS(([&] { __VA_ARGS__; }()), kiln::Error)

TEST_CASE("bad arguments throw kiln::Error", "[optim]") {
  Tensor w = make({1.0}).requires_grad_();
  KILN_THROWS(optim::SGD({w}, optim::SGDOptions(-0.1)));
  KILN_THROWS(optim::Adam({w}, optim::AdamOptions(-1e-3)));
  KILN_THROWS(optim::Adam({w}, optim::AdamOptions(1e-3).betas({1.0, 0.999})));
  KILN_THROWS(optim::AdamW({w}, optim::AdamWOptions(1e-3).betas({0.9, -0.1})));
  KILN_THROWS(optim::AdamW({w}, optim::AdamWOptions(1e-3).eps(-1)));
  KILN_THROWS(optim::LAMB({w}, optim::LAMBOptions(1e-3).weight_decay(-1)));
  KILN_THROWS(optim::SGD({w}, optim::SGDOptions(0.1).nesterov(true)));
  KILN_THROWS(optim::LARS({w}, optim::LARSOptions(0.1).trust_coefficient(0)));
  KILN_THROWS(optim::SGD(std::vector<Tensor>{}, 0.1));
  Tensor nonleaf = w * 2.0;
  CHECK_THROWS_WITH([&] { optim::SGD o({nonleaf}, 0.1); }(), Catch::Contains("non-leaf"));
  KILN_THROWS(optim::SGD({w, w}, 0.1));
  CHECK_THROWS_WITH(
      [&] {
        optim::SGD o({optim::ParamGroup({w}), optim::ParamGroup({w})}, 0.1);
      }(),
      Catch::Contains("more than one parameter group"));
  optim::SGD opt({w}, 0.1);
  KILN_THROWS(opt.add_param_group(optim::ParamGroup({w})));
  KILN_THROWS(opt.add_param_group(optim::ParamGroup({make({1.0}).requires_grad_()}, optim::AdamOptions())));
  KILN_THROWS(opt.param_groups()[0].set_lr(-1.0));
  KILN_THROWS(optim::SGD({tensor(std::vector<int64_t>{1, 2})}, 0.1));
  optim::Adam adam({make({1.0}).requires_grad_()});
  KILN_THROWS(opt.load_state_dict(adam.state_dict()));
}
