// Autograd overhead per op on tiny tensors, where the framework's bookkeeping (allocation, node
// creation, the engine's walk) is all there is. Target: < 2 us per op for forward +
// backward. Compared with the same ops under NoGradGuard (forward only, no graph), and with the
// profiler recording (kiln/core/profiler.h): what profiling costs per op, and that it costs
// nothing when off (the plain runs before and after it are alike).
#include <cmath>
#include <cstdio>

#include <kiln/kiln.h>

#include "../bench_util.h"

int main() {
  kiln::manual_seed(0);
  auto x = kiln::randn({1}, kiln::TensorOptions().requires_grad(true));
  auto w = kiln::randn({1}, kiln::TensorOptions().requires_grad(true));
  constexpr int kOps = 100;  // ops per graph (a chain of mul/add/tanh)
  auto chain = [&] {
    kiln::Tensor h = x;
    for (int i = 0; i < kOps / 4; ++i) h = (h * w + 1.0).tanh() * 0.5;
    return h;
  };
  double t_fwd_bwd = kiln::bench::time_median(
      [&] {
        auto y = chain();
        y.sum().backward();
      },
      50, 5);
  kiln::Tensor last;
  double t_nograd = kiln::bench::time_median(
      [&] {
        kiln::NoGradGuard ng;
        last = chain();
      },
      50, 5);
  double t_profiled = 0;
  size_t events = 0;
  {
    kiln::profiler::Profiler prof;
    t_profiled = kiln::bench::time_median(
        [&] {
          auto y = chain();
          y.sum().backward();
        },
        50, 5);
    prof.stop();
    events = prof.events().size();
  }
  double t_after = kiln::bench::time_median(
      [&] {  // the profiler off again
        auto y = chain();
        y.sum().backward();
      },
      50, 5);
  kiln::bench::validate(events > 0, "profiler events", 0);
  // the chain's gradient must exist and be finite
  kiln::bench::validate(w.grad().defined() && std::isfinite(w.grad().item<float>()), "gradient", 0);
  std::printf("ops per graph: %d (+1 sum)\n", kOps);
  std::printf("forward + backward: %.2f us per op\n", t_fwd_bwd / (kOps + 1) * 1e6);
  std::printf("forward, no grad:   %.2f us per op\n", t_nograd / kOps * 1e6);
  std::printf("autograd overhead ratio (fwd+bwd / no-grad fwd): %.2fx\n", (t_fwd_bwd / (kOps + 1)) / (t_nograd / kOps));
  std::printf("forward + backward, profiler recording: %.2f us per op (%.2fx; %zu events)\n",
              t_profiled / (kOps + 1) * 1e6, t_profiled / t_fwd_bwd, events);
  std::printf("forward + backward, profiler off again: %.2f us per op (%.2fx the first run)\n",
              t_after / (kOps + 1) * 1e6, t_after / t_fwd_bwd);
  return 0;
}
