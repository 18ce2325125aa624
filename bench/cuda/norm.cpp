// GPU bench: fused BatchNorm and LayerNorm (kiln/kernels/cuda/norm.cu), forward and
// forward+backward, against the composite of kiln ops (mean, var, sub, div, mul, add) on the same
// device in the same run, and against the device-to-device copy bandwidth measured here too.
// GB/s counts the minimal traffic: forward reads x and writes y (2 x bytes(x)); forward+backward
// adds reading g and x and writing dx (5 x bytes(x) in all). The fused kernels move more than
// that (the statistics pass reads x once more), so 100% of copy bandwidth is not reachable.
// Before timing, every fused GPU result is validated against the CPU kernel on the same data
// (exit 1 on a mismatch); timings are never asserted. Exits 77 without a device.
#include <cmath>
#include <cstdio>
#include <string>

#include <kiln/kiln.h>
#include <kiln/nn/functional.h>

#include "cuda_bench_util.h"

namespace {

namespace F = kiln::nn::functional;
using namespace kiln::bench;  // gpu::, max_rel_err, the composites
using kiln::DType;
using kiln::Tensor;

// recorded under the printed name, e.g. "layer_norm f32 [16384,768] forward+backward"
void row(const std::string& name, double fused_ms, double comp_ms, double bytes, double copy_gbs) {
  gpu::fused_row("norm", 44, "composite", name, name, fused_ms, comp_ms, bytes, copy_gbs);
}

// fused(x, w, b) / comp(x, w, b) on GPU tensors; the CPU runs `fused` on CPU copies as the reference.
// x [N, C, H, W] in channels-last memory, same values, on `dev` (Tensor::to makes it contiguous).
Tensor channels_last(const Tensor& x, kiln::Device dev) {
  return x.permute({0, 2, 3, 1}).contiguous().to(dev).permute({0, 3, 1, 2});
}

// cl: x (and the incoming gradient) in channels-last memory.
template <class Fused, class Comp>
void run(const std::string& name, const Tensor& x_cpu, const Tensor& w_cpu, const Tensor& b_cpu, double tol, bool cl,
         Fused fused, Comp comp) {
  const kiln::Device dev = kiln::Device::cuda(0);
  const double nbytes = static_cast<double>(x_cpu.nbytes());
  const double copy_gbs = gpu::copy_bandwidth_gbs(x_cpu.nbytes());
  Tensor x0 = cl ? channels_last(x_cpu, dev) : x_cpu.to(dev), w0 = w_cpu.to(dev), b0 = b_cpu.to(dev);
  Tensor g_cpu = kiln::randn(x_cpu.sizes()).to(x_cpu.dtype());
  Tensor g = cl ? channels_last(g_cpu, dev) : g_cpu.to(dev);

  // ---- validation against the CPU kernel: forward, then gradients
  auto grads = [&](const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& gg, auto f) {
    Tensor xl = x.detach().requires_grad_(), wl = w.detach().requires_grad_(), bl = b.detach().requires_grad_();
    Tensor y = f(xl, wl, bl);
    y.backward(gg);
    return std::vector<Tensor>{y.detach(), xl.grad(), wl.grad(), bl.grad()};
  };
  auto ref = grads(x_cpu, w_cpu, b_cpu, g_cpu, fused);
  auto got = grads(x0, w0, b0, g, fused);
  const char* parts[] = {"y", "dx", "dweight", "dbias"};
  for (int i = 0; i < 4; ++i) {
    // dweight/dbias are sums over the batch: compare relative to their larger magnitude
    const double e = max_rel_err(got[i], ref[i]) / (i >= 2 ? 100.0 : 1.0);
    kiln::bench::validate(e < tol, (name + " " + parts[i] + " vs CPU").c_str(), e);
  }
  {
    kiln::NoGradGuard ng;
    const double e = max_rel_err(comp(x0, w0, b0), ref[0]);
    kiln::bench::validate(e < tol, (name + " composite vs CPU").c_str(), e);
  }

  // ---- forward, no graph
  {
    kiln::NoGradGuard ng;
    Tensor y;
    const double tf = gpu::time_ms([&] { y = fused(x0, w0, b0); });
    const double tc = gpu::time_ms([&] { y = comp(x0, w0, b0); });
    row(name + " forward", tf, tc, 2 * nbytes, copy_gbs);
  }
  // ---- forward + backward
  Tensor x = x0.detach().requires_grad_(), w = w0.detach().requires_grad_(), b = b0.detach().requires_grad_();
  auto step = [&](auto f) {
    x.set_grad(Tensor());
    w.set_grad(Tensor());
    b.set_grad(Tensor());
    f(x, w, b).backward(g);
  };
  const double tf = gpu::time_ms([&] { step(fused); }, 10, 5);
  const double tc = gpu::time_ms([&] { step(comp); }, 10, 5);
  row(name + " forward+backward", tf, tc, 5 * nbytes, copy_gbs);
}

}  // namespace

int main() {
  const cudaDeviceProp prop = gpu::start("bench_cuda_norm");
  std::printf("device: %s\n", prop.name);
  const double eps = 1e-5;
  auto bn = [&](const Tensor& a, const Tensor& w, const Tensor& b) {
    return F::batch_norm(a, Tensor(), Tensor(), w, b, true, 0.1, eps);
  };
  auto bn_comp = [&](const Tensor& a, const Tensor& w, const Tensor& b) { return bn_composite(a, w, b, eps); };
  for (auto sizes : std::vector<kiln::IntList>{{128, 32, 28, 28}, {256, 64, 56, 56}}) {
    Tensor x = kiln::randn(sizes) * 2.0 + 0.5;
    Tensor w = kiln::randn({sizes[1]}), b = kiln::randn({sizes[1]});
    run("batch_norm f32 " + kiln::detail::concat(sizes), x, w, b, 1e-4, false, bn, bn_comp);
  }
  {  // channels-last memory: the kernel runs on [N*H*W, C] (the column path)
    Tensor x = kiln::randn({256, 64, 56, 56}) * 2.0 + 0.5;
    Tensor w = kiln::randn({64}), b = kiln::randn({64});
    run("batch_norm f32 channels-last [256,64,56,56]", x, w, b, 1e-4, true, bn, bn_comp);
  }
  for (int64_t K : {768, 4096}) {
    const int64_t R = 8192 * 768 / K * 2;
    Tensor x = kiln::randn({R, K}) * 2.0 + 0.5;
    Tensor w = kiln::randn({K}), b = kiln::randn({K});
    auto ln = [K, eps](const Tensor& a, const Tensor& ww, const Tensor& bb) {
      return F::layer_norm(a, {K}, ww, bb, eps);
    };
    auto ln_comp = [eps](const Tensor& a, const Tensor& ww, const Tensor& bb) { return ln_composite(a, ww, bb, eps); };
    run("layer_norm f32 [" + std::to_string(R) + "," + std::to_string(K) + "]", x, w, b, 1e-4, false, ln, ln_comp);
    if (K == 768)
      run("layer_norm bf16 [" + std::to_string(R) + "," + std::to_string(K) + "]", x.to(DType::BF16), w.to(DType::BF16),
          b.to(DType::BF16), 5e-2, false, ln, ln_comp);
  }
  return 0;
}
