// bench_optim: one AdamW step over a whole model's parameters, fused multi-tensor kernel
// (AdamW's rule, kiln/optim/adamw.h, run by the CPU launcher of kiln/kernels/multi_tensor.h:
// one read and one write of param, grad, exp_avg, exp_avg_sq per element) vs a per-parameter loop of kiln tensor ops
// (the unfused reference: ~10 passes and temporaries per parameter). Parameter lists: ResNet-18 (11.7M parameters in 62
// tensors) and GPT-2 124M (148 tensors). GB/s counts the fused kernel's minimal traffic, 28 bytes per f32 element (read
// p, g, m, v; write p, m, v), for both versions, so the ratio is the speed-up. Results of the two versions are
// validated against each other before timing is reported.
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../bench_util.h"
#include "../model_shapes.h"
#include "kiln/core/autograd.h"
#include "kiln/core/tensor.h"
#include "kiln/optim/adamw.h"

using namespace kiln;

namespace {

using kiln::bench::gpt2_124m_shapes;
using kiln::bench::resnet18_shapes;

void run(const char* name, const std::vector<IntList>& shapes) {
  manual_seed(0);
  std::vector<Tensor> fused_p, loop_p;
  int64_t numel = 0;
  for (const IntList& s : shapes) {
    Tensor p = randn(s).mul_(0.02);
    Tensor g = randn(s).mul_(0.01);
    Tensor a = p.clone().requires_grad_(), b = p.clone().requires_grad_();
    a.set_grad(g.clone());
    b.set_grad(g.clone());
    fused_p.push_back(a);
    loop_p.push_back(b);
    numel += p.numel();
  }
  const double lr = 1e-3, wd = 0.1;
  optim::AdamW opt(fused_p, optim::AdamWOptions(lr).weight_decay(wd));
  bench::LoopAdamW ref(loop_p, lr, wd);

  // validate: three steps of each agree
  for (int k = 0; k < 3; ++k) {
    opt.step();
    ref.step();
  }
  double max_err = 0;
  for (size_t i = 0; i < fused_p.size(); ++i) {
    double e = (fused_p[i].detach() - loop_p[i].detach()).abs().max().item<double>();
    max_err = std::max(max_err, e);
  }
  bench::validate(max_err < 1e-6, "fused AdamW vs per-parameter tensor ops", max_err);

  const double t_fused = bench::time_median([&] { opt.step(); }, 7, 1);
  const double t_loop = bench::time_median([&] { ref.step(); }, 5, 1);
  const double bytes = 28.0 * static_cast<double>(numel);
  std::printf(
      "%-12s %5zu tensors %7.2fM params | fused %8.2f ms %7.2f GB/s | per-param loop %8.2f ms %7.2f GB/s | speed-up "
      "%.2fx  (max |diff| %.1e)\n",
      name, shapes.size(), numel / 1e6, t_fused * 1e3, bytes / t_fused / 1e9, t_loop * 1e3, bytes / t_loop / 1e9,
      t_loop / t_fused, max_err);
}

double copy_bandwidth() {  // peer: a parallel memcpy-like copy of 64 MiB (read + write)
  Tensor a = randn({16 << 20}), b = empty({16 << 20});
  double t = bench::time_median([&] { b.copy_(a); }, 7, 2);
  return 2.0 * a.nbytes() / t / 1e9;
}

}  // namespace

int main() {
  std::printf("bench_optim: AdamW step, f32, %d OpenMP threads\n", omp_get_max_threads());
  std::printf("copy bandwidth (Tensor::copy_, 64 MiB): %.2f GB/s\n", copy_bandwidth());
  run("ResNet-18", resnet18_shapes());
  run("GPT-2 124M", gpt2_124m_shapes());
  return 0;
}
