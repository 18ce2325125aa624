// CUDA multi-tensor launchers (kernels/cuda/multi_tensor.cuh and .cu, amp.cu) vs the CPU launchers: every
// optimizer over several steps, f32 and f16/bf16 parameters with master weights, found_inf and
// grad_scale read on the device, per-tensor norms (LAMB/LARS), the global norm and clipping,
// unscale + inf check, the device-side GradScaler update, the fused lerp. Lists with more tensors
// than one launch holds (40 per optimizer launch, 110 per list launch, 256 step tensors) check the
// launch splitting; odd sizes and sizes across the 16K-element chunk boundary check the tails.
// The math is the CPU's (each optimizer's rule, in kiln/optim/<name>.h); tolerances cover FMA contraction and summation
// order: f32 1e-5 relative after 3 steps, bf16/f16 parameters one rounding of the (f32) master weight.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <memory>

#include <kiln/kiln.h>
#include <kiln/kernels/amp_kernels.h>
#include <kiln/kernels/multi_tensor.h>
#include "../test_util.h"  // the repository root is not on test_cuda's include path

using kiln::DType;
using kiln::Tensor;
namespace optim = kiln::optim;

namespace {
const kiln::Device kGpu = kiln::Device::cuda(0);

using MakeOpt = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>;

std::vector<kiln::IntList> shapes_mixed() {
  return {{7}, {33, 65}, {16384}, {16385}, {3, 5, 7}, {1}, {40000}, {0}, {4097}};
}

// Leaf parameters on the CPU and identical copies on the GPU.
void make_params(const std::vector<kiln::IntList>& shapes, DType dt, std::vector<Tensor>& cpu,
                 std::vector<Tensor>& gpu) {
  for (const auto& s : shapes) {
    Tensor p = (kiln::randn(s) * 0.5).to(dt);
    cpu.push_back(p.clone().requires_grad_(true));
    gpu.push_back(p.to(kGpu).requires_grad_(true));
  }
}

// The same random gradient on both sides.
void set_grads(std::vector<Tensor>& cpu, std::vector<Tensor>& gpu, double scale = 1.0) {
  for (size_t i = 0; i < cpu.size(); ++i) {
    Tensor g = (kiln::randn(cpu[i].sizes()) * scale).to(cpu[i].dtype());
    cpu[i].set_grad(g);
    gpu[i].set_grad(g.to(kGpu));
  }
}

void require_close(const Tensor& gpu, const Tensor& cpu, double rtol, double atol, const std::string& what) {
  INFO(what << " sizes " << kiln::detail::concat(cpu.sizes()) << " dtype " << kiln::dtype_name(cpu.dtype()));
  REQUIRE(gpu.device() == kGpu);
  REQUIRE(gpu.sizes() == cpu.sizes());
  REQUIRE(kiln::allclose(gpu.detach().cpu().to(DType::F64), cpu.detach().to(DType::F64), rtol, atol));
}

void compare_states(const optim::Optimizer& og, const std::vector<Tensor>& pg, const optim::Optimizer& oc,
                    const std::vector<Tensor>& pc, double rtol, double atol, const std::string& what) {
  for (size_t i = 0; i < pc.size(); ++i) {
    const std::string w = what + " param " + std::to_string(i);
    require_close(pg[i], pc[i], rtol, atol, w);
    const optim::OptimizerParamState* sc = oc.state(pc[i]);
    const optim::OptimizerParamState* sg = og.state(pg[i]);
    REQUIRE((sc == nullptr) == (sg == nullptr));
    if (!sc) continue;
    REQUIRE(sg->step.cpu().item<double>() == sc->step.item<double>());
    const auto buffers_c = sc->buffers(), buffers_g = sg->buffers();
    REQUIRE(buffers_c.size() == buffers_g.size());
    for (size_t k = 0; k < buffers_c.size(); ++k) {
      REQUIRE(buffers_c[k].second.defined() == buffers_g[k].second.defined());
      if (buffers_c[k].second.defined())
        require_close(buffers_g[k].second, buffers_c[k].second, rtol, atol, w + " " + buffers_c[k].first);
    }
    if (sc->master.defined()) require_close(sg->master, sc->master, rtol, atol, w + " master");
  }
}

void run_optimizer(const std::string& name, const MakeOpt& make, DType dt, double rtol, double atol,
                   const std::vector<kiln::IntList>& shapes = shapes_mixed()) {
  INFO(name << " " << kiln::dtype_name(dt));
  std::vector<Tensor> pc, pg;
  make_params(shapes, dt, pc, pg);
  auto oc = make(pc);
  auto og = make(pg);
  for (int step = 0; step < 3; ++step) {
    set_grads(pc, pg);
    oc->step();
    og->step();
  }
  compare_states(*og, pg, *oc, pc, rtol, atol, name);
}

std::vector<std::pair<std::string, MakeOpt>> optimizers() {
  return {
      {"SGD",
       [](std::vector<Tensor> p) {
         return std::make_unique<optim::SGD>(p, optim::SGDOptions(0.1).weight_decay(0.01));
       }},
      {"SGD momentum",
       [](std::vector<Tensor> p) {
         return std::make_unique<optim::SGD>(p, optim::SGDOptions(0.1).momentum(0.9).dampening(0.1).weight_decay(0.01));
       }},
      {"SGD nesterov",
       [](std::vector<Tensor> p) {
         return std::make_unique<optim::SGD>(p, optim::SGDOptions(0.1).momentum(0.9).nesterov(true));
       }},
      {"Adam",
       [](std::vector<Tensor> p) {
         return std::make_unique<optim::Adam>(p, optim::AdamOptions(1e-2).weight_decay(0.01));
       }},
      {"AdamW",
       [](std::vector<Tensor> p) {
         return std::make_unique<optim::AdamW>(p, optim::AdamWOptions(1e-2).weight_decay(0.1));
       }},
      {"AdamW maximize",
       [](std::vector<Tensor> p) {
         return std::make_unique<optim::AdamW>(p, optim::AdamWOptions(1e-2).weight_decay(0.1).maximize(true));
       }},
      {"LAMB", [](std::vector<Tensor> p) { return std::make_unique<optim::LAMB>(p, optim::LAMBOptions(1e-2)); }},
      {"LARS",
       [](std::vector<Tensor> p) {
         return std::make_unique<optim::LARS>(p, optim::LARSOptions(0.1).weight_decay(1e-4).trust_coefficient(0.02));
       }},
      {"LARS without momentum",
       [](std::vector<Tensor> p) { return std::make_unique<optim::LARS>(p, optim::LARSOptions(0.1).momentum(0.0)); }},
  };
}
}  // namespace

TEST_CASE("fused optimizer steps on the GPU equal the CPU steps (f32, f64)", "[cuda][optim]") {
  kiln::manual_seed(40);
  for (auto& [name, make] : optimizers()) {
    run_optimizer(name, make, DType::F32, 2e-5, 1e-6);
    run_optimizer(name, make, DType::F64, 1e-12, 1e-13);
  }
}

TEST_CASE("fused optimizer steps with f16/bf16 parameters and f32 master weights", "[cuda][optim]") {
  kiln::manual_seed(41);
  for (auto& [name, make] : optimizers()) {
    // masters and states are f32 (1e-5); the 16-bit parameter is the rounded master: one ulp
    run_optimizer(name, make, DType::BF16, 1e-2, 1e-2);
    run_optimizer(name, make, DType::F16, 1e-3, 1e-3);
  }
}

TEST_CASE("more tensors than one launch holds: launches split, steps advance once", "[cuda][optim]") {
  kiln::manual_seed(42);
  std::vector<kiln::IntList> many;
  for (int i = 0; i < 300; ++i) many.push_back({(i * 37) % 997 + 1});
  many.push_back({70000});
  for (auto& [name, make] : optimizers()) run_optimizer(name + " (301 tensors)", make, DType::F32, 2e-5, 1e-6, many);
}

TEST_CASE("found_inf set on the device skips the step without touching anything", "[cuda][optim]") {
  kiln::manual_seed(43);
  for (auto& [name, make] : optimizers()) {
    INFO(name);
    std::vector<Tensor> pc, pg;
    make_params(shapes_mixed(), DType::BF16, pc, pg);
    auto og = make(pg);
    set_grads(pc, pg);
    og->step();  // creates the state
    std::vector<Tensor> before, m_before, master_before;
    std::vector<double> step_before;
    for (const Tensor& p : pg) {
      before.push_back(p.detach().cpu());
      const optim::OptimizerParamState* s = og->state(p);
      step_before.push_back(s->step.cpu().item<double>());
      const Tensor first_buffer = s->buffers().front().second;  // exp_avg or momentum_buffer
      m_before.push_back(first_buffer.defined() ? first_buffer.cpu() : Tensor());
      master_before.push_back(s->master.cpu());
    }
    set_grads(pc, pg);
    optim::StepFlags flags;
    flags.found_inf = kiln::full({}, 1.0, kiln::TensorOptions(DType::F32).device(kGpu));
    og->step(flags);
    for (size_t i = 0; i < pg.size(); ++i) {
      const optim::OptimizerParamState* s = og->state(pg[i]);
      REQUIRE(kiln::equal(pg[i].detach().cpu(), before[i]));
      REQUIRE(s->step.cpu().item<double>() == step_before[i]);
      if (m_before[i].defined()) REQUIRE(kiln::equal(s->buffers().front().second.cpu(), m_before[i]));
      REQUIRE(kiln::equal(s->master.cpu(), master_before[i]));
    }
    // found_inf = 0 on the device: the step runs
    flags.found_inf = kiln::zeros({}, kiln::TensorOptions(DType::F32).device(kGpu));
    og->step(flags);
    REQUIRE(og->state(pg[0])->step.cpu().item<double>() == step_before[0] + 1);
  }
}

TEST_CASE("grad_scale read on the device divides the gradients inside the step", "[cuda][optim]") {
  kiln::manual_seed(44);
  std::vector<Tensor> pc, pg;
  make_params(shapes_mixed(), DType::F32, pc, pg);
  optim::AdamW oc(pc, optim::AdamWOptions(1e-2).weight_decay(0.1));
  optim::AdamW og(pg, optim::AdamWOptions(1e-2).weight_decay(0.1));
  optim::LARS lc(pc, optim::LARSOptions(0.1));
  optim::LARS lg(pg, optim::LARSOptions(0.1));
  for (int step = 0; step < 2; ++step) {
    set_grads(pc, pg, 1024.0);
    optim::StepFlags fc, fg;
    fc.grad_scale = kiln::full({}, 1024.0, DType::F32);
    fg.grad_scale = kiln::full({}, 1024.0, kiln::TensorOptions(DType::F32).device(kGpu));
    oc.step(fc);
    og.step(fg);
    lc.step(fc);
    lg.step(fg);
  }
  compare_states(og, pg, oc, pc, 2e-5, 1e-6, "AdamW+LARS with grad_scale");
}

TEST_CASE("multi_tensor_norm matches the CPU for p = 1, 2, inf, 3; NaN propagates", "[cuda][optim][norm]") {
  kiln::manual_seed(45);
  std::vector<Tensor> cpu, gpu;
  for (const auto& s : shapes_mixed()) {
    Tensor t = kiln::randn(s);
    cpu.push_back(t);
    gpu.push_back(t.to(kGpu));
  }
  Tensor nd = kiln::randn({40, 30}).t();  // not dense after slicing
  cpu.push_back(nd.slice(0, 1, 29, 2));
  gpu.push_back(nd.to(kGpu).slice(0, 1, 29, 2));
  for (int i = 0; i < 200; ++i) {  // > 110 tensors: two launches
    Tensor t = kiln::randn({i % 13 + 1}).to(i % 3 == 0 ? DType::BF16 : DType::F32);
    cpu.push_back(t);
    gpu.push_back(t.to(kGpu));
  }
  for (double p : {1.0, 2.0, 3.0, static_cast<double>(INFINITY)}) {
    INFO("p = " << p);
    Tensor c = kiln::kernels::multi_tensor_norm(cpu, p);
    Tensor g = kiln::kernels::multi_tensor_norm(gpu, p);
    REQUIRE(g.device() == kGpu);
    REQUIRE(g.dtype() == DType::F32);
    REQUIRE(g.cpu().item<double>() == Approx(c.item<double>()).epsilon(1e-5));
  }
  // f64 in the list: an f64 result
  Tensor d = kiln::randn({1000}).to(DType::F64);
  REQUIRE(kiln::kernels::multi_tensor_norm({d.to(kGpu)}, 2.0).dtype() == DType::F64);
  REQUIRE(kiln::kernels::multi_tensor_norm({d.to(kGpu)}, 2.0).cpu().item<double>() ==
          Approx(kiln::kernels::multi_tensor_norm({d}, 2.0).item<double>()).epsilon(1e-12));
  // NaN anywhere gives NaN, for the sum norms and the max norm
  Tensor with_nan = kiln::randn({5000});
  with_nan.data_ptr<float>()[4321] = NAN;
  std::vector<Tensor> lst = {gpu[0], with_nan.to(kGpu), gpu[2]};
  for (double p : {1.0, 2.0, static_cast<double>(INFINITY)})
    REQUIRE(std::isnan(kiln::kernels::multi_tensor_norm(lst, p).cpu().item<double>()));
  // all tensors empty: 0 on the device
  Tensor z = kiln::kernels::multi_tensor_norm({kiln::empty({0}, kGpu)}, 2.0);
  REQUIRE(z.device() == kGpu);
  REQUIRE(z.cpu().item<double>() == 0.0);
}

TEST_CASE("clip_grad_norm on the GPU equals the CPU", "[cuda][optim][clip]") {
  kiln::manual_seed(46);
  for (double max_norm : {0.5, 1e6}) {
    std::vector<Tensor> pc, pg;
    make_params(shapes_mixed(), DType::F32, pc, pg);
    set_grads(pc, pg);
    Tensor nc = optim::clip_grad_norm(pc, max_norm);
    Tensor ng = optim::clip_grad_norm(pg, max_norm);
    REQUIRE(ng.cpu().item<double>() == Approx(nc.item<double>()).epsilon(1e-5));
    for (size_t i = 0; i < pc.size(); ++i) require_close(pg[i].grad(), pc[i].grad(), 1e-5, 1e-7, "clipped grad");
    Tensor inf_c = optim::clip_grad_norm(pc, max_norm, INFINITY);
    Tensor inf_g = optim::clip_grad_norm(pg, max_norm, INFINITY);
    REQUIRE(inf_g.cpu().item<double>() == Approx(inf_c.item<double>()).epsilon(1e-6));
  }
}

TEST_CASE("multi_tensor_scale_ and multi_tensor_lerp_ match the CPU", "[cuda][optim]") {
  kiln::manual_seed(47);
  std::vector<Tensor> c, g, c2, g2;
  for (const auto& s : shapes_mixed()) {
    for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::F64}) {
      Tensor t = kiln::randn(s).to(dt), u = kiln::randn(s).to(dt);
      c.push_back(t.clone());
      g.push_back(t.to(kGpu));
      c2.push_back(u);
      g2.push_back(u.to(kGpu));
    }
  }
  Tensor nd = kiln::randn({30, 20});
  c.push_back(nd.clone().t().slice(0, 0, 20, 3));
  g.push_back(nd.to(kGpu).t().slice(0, 0, 20, 3));  // non-dense: scaled through a copy
  kiln::kernels::multi_tensor_scale_(c, kiln::full({}, 0.37, DType::F64));
  kiln::kernels::multi_tensor_scale_(g, kiln::full({}, 0.37, kiln::TensorOptions(DType::F32).device(kGpu)));
  for (size_t i = 0; i < c.size(); ++i) require_close(g[i], c[i], 1e-6, 1e-7, "scale");
  c.pop_back();
  g.pop_back();
  kiln::kernels::multi_tensor_lerp_(c, c2, 0.1);
  kiln::kernels::multi_tensor_lerp_(g, g2, 0.1);
  for (size_t i = 0; i < c.size(); ++i) {
    const DType dt = c[i].dtype();
    const double tol = dt == DType::BF16 ? 1e-2 : dt == DType::F16 ? 1e-3 : 1e-6;  // one rounding apart at most
    require_close(g[i], c[i], tol, tol, "lerp");
  }
}

TEST_CASE("unscale_and_check_ scales every gradient and flags an Inf on the device", "[cuda][amp]") {
  kiln::manual_seed(48);
  std::vector<Tensor> c, g;
  for (const auto& s : shapes_mixed()) {
    for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
      Tensor t = (kiln::randn(s) * 100.0).to(dt);
      c.push_back(t.clone());
      g.push_back(t.to(kGpu));
    }
  }
  auto found_g = kiln::zeros({}, kiln::TensorOptions(DType::F32).device(kGpu));
  auto found_c = kiln::zeros({}, DType::F32);
  kiln::kernels::unscale_and_check_(c, kiln::full({}, 1.0 / 64, DType::F32), found_c);
  kiln::kernels::unscale_and_check_(g, kiln::full({}, 1.0 / 64, kiln::TensorOptions(DType::F32).device(kGpu)), found_g);
  REQUIRE(found_g.cpu().item<float>() == 0.0f);
  for (size_t i = 0; i < c.size(); ++i) require_close(g[i], c[i], 0, 0, "unscaled (exact: power of two)");
  // one Inf in the middle of a long f16 tensor, and a NaN in another list
  Tensor big = kiln::randn({70001}).to(DType::F16);
  big.data_ptr<kiln::Half>()[54321] = kiln::Half(INFINITY);
  std::vector<Tensor> lst = {g[0], big.to(kGpu), g[5]};
  kiln::kernels::unscale_and_check_(lst, kiln::full({}, 0.5, kiln::TensorOptions(DType::F32).device(kGpu)), found_g);
  REQUIRE(found_g.cpu().item<float>() == 1.0f);
  found_g.zero_();
  Tensor n = kiln::randn({17});
  n.data_ptr<float>()[16] = NAN;
  kiln::kernels::unscale_and_check_({n.to(kGpu)}, kiln::full({}, 0.5, kiln::TensorOptions(DType::F32).device(kGpu)),
                                    found_g);
  REQUIRE(found_g.cpu().item<float>() == 1.0f);
}

TEST_CASE("GradScaler on the GPU: unscale, skip on overflow, back off and grow on the device", "[cuda][amp]") {
  auto w = kiln::tensor({1.0f, 2.0f}).to(kGpu).requires_grad_(true);
  optim::SGD opt({w}, optim::SGDOptions(0.1));
  kiln::amp::GradScaler scaler(kiln::amp::GradScalerOptions().enabled(true).growth_interval(3));
  scaler.scale((w * w).sum()).backward();
  scaler.step(opt);
  scaler.update();
  REQUIRE(w.detach().cpu().data_ptr<float>()[1] == Approx(2.0f - 0.1f * 4.0f));
  REQUIRE(scaler.get_scale() == 65536.0);
  REQUIRE(scaler.scale_tensor().device() == kGpu);
  kiln_test::check_grad_scaler_backoff_and_growth(scaler, opt, w);
  // the kernel directly, f32 scale
  Tensor scale = kiln::full({}, 8.0, kiln::TensorOptions(DType::F32).device(kGpu));
  Tensor tracker = kiln::full({}, 1.0, kiln::TensorOptions(DType::I64).device(kGpu));
  Tensor skipped = kiln::zeros({}, kiln::TensorOptions(DType::I64).device(kGpu));
  Tensor found = kiln::zeros({}, kiln::TensorOptions(DType::F32).device(kGpu));
  kiln::kernels::amp_update_scale_(scale, tracker, skipped, found, 2.0, 0.5, 2);
  REQUIRE(scale.cpu().item<double>() == 16.0);
  REQUIRE(tracker.cpu().item<int64_t>() == 0);
  REQUIRE(skipped.cpu().item<int64_t>() == 0);
  found.fill_(1.0);
  kiln::kernels::amp_update_scale_(scale, tracker, skipped, found, 2.0, 0.25, 2);
  REQUIRE(scale.cpu().item<double>() == 4.0);
  REQUIRE(skipped.cpu().item<int64_t>() == 1);
}

TEST_CASE("EMA.update on the GPU equals the CPU", "[cuda][ema]") {
  kiln::manual_seed(49);
  kiln::nn::Linear a(17, 9), b(17, 9);
  b.to(kGpu);
  {
    kiln::NoGradGuard ng;
    b.weight.copy_(a.weight.detach().to(kGpu));
    b.bias.copy_(a.bias.detach().to(kGpu));
  }
  optim::EMA ea(a, 0.99), eb(b, 0.99);
  for (int i = 0; i < 3; ++i) {
    Tensor d = kiln::randn({9, 17});
    {
      kiln::NoGradGuard ng;
      a.weight.add_(d);
      b.weight.add_(d.to(kGpu));
    }
    ea.update();
    eb.update();
  }
  auto sa = ea.state_dict(), sb = eb.state_dict();
  require_close(sb.at("ema.weight"), sa.at("ema.weight"), 1e-6, 1e-6, "ema weight");
  require_close(sb.at("ema.bias"), sa.at("ema.bias"), 1e-6, 1e-6, "ema bias");
}
