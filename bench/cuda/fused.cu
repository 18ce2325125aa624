// GPU bench: fused pointwise kernels (kiln/kernels/cuda/fused.cu) against the unfused chains of
// kiln ops (each op its own kernel) on the same device in the same run, and against the
// device-to-device copy bandwidth measured here too (the fused GELU is the textbook case: one
// kernel instead of five).
//   gelu                 F::fused_gelu(x)            vs  x * 0.5 * (1 + erf(x / 1.41421))  (5 kernels)
//   bias+gelu            F::bias_gelu(x, b)          vs  gelu(x + b)                       (2 kernels)
//   bias+dropout+add     F::bias_dropout_add(...)    vs  r + dropout(x + b)                (3 kernels)
// forward, and forward+backward for the last two. GB/s counts the minimal traffic of the fused
// kernel (reads + writes of full tensors), so the chain's GB/s is "effective", not its traffic.
// Every fused GPU result is validated first (against the chain on the GPU and against the CPU
// on a slice; exit 1 on a mismatch); timings are never asserted. Exits 77 without a device.
#include <cstdio>
#include <string>
#include <vector>

#include <kiln/kiln.h>
#include <kiln/nn/functional.h>

#include "cuda_bench_util.h"

namespace {

namespace F = kiln::nn::functional;
namespace gpu = kiln::bench::gpu;
using kiln::DType;
using kiln::Tensor;
using kiln::bench::max_rel_err;

// rec: the case name recorded for compare.py (empty: the printed name).
// e.g. "gelu float32 [67108864] forward", "bias+gelu forward+backward [16384, 4096] bfloat16"
void row(const std::string& name, double fused_ms, double chain_ms, double bytes, double copy_gbs,
         const std::string& rec = "") {
  gpu::fused_row("fused", 40, "unfused", name, rec.empty() ? name : rec, fused_ms, chain_ms, bytes, copy_gbs);
}

double tol_of(DType dt) { return dt == DType::F32 ? 1e-5 : dt == DType::F16 ? 4e-3 : 3e-2; }

// The guide's GELU: one kernel vs its five.
void bench_gelu(DType dt, int64_t n, double copy_gbs) {
  const kiln::Device dev = kiln::Device::cuda(0);
  kiln::NoGradGuard ng;
  Tensor x = (kiln::randn({n}, kiln::TensorOptions().device(dev)) * 2.0).to(dt);
  auto chain = [&] { return x * 0.5 * (1.0 + kiln::erf(x / 1.41421)); };
  const std::string name = std::string("gelu (guide) ") + kiln::dtype_name(dt);
  // chain rounds after every op in f16: compare with the dtype's tolerance
  double e = max_rel_err(F::fused_gelu(x), chain());
  kiln::bench::validate(e < tol_of(dt) * 2, (name + " fused vs chain").c_str(), e);
  Tensor xs = x.slice(0, 0, 1 << 20);
  e = max_rel_err(F::fused_gelu(xs), F::fused_gelu(xs.cpu()));
  kiln::bench::validate(e < tol_of(dt), (name + " vs CPU").c_str(), e);
  Tensor y;
  const double tf = gpu::time_ms([&] { y = F::fused_gelu(x); });
  const double tc = gpu::time_ms([&] { y = chain(); });
  row(name, tf, tc, 2.0 * x.nbytes(), copy_gbs,
      std::string("gelu ") + kiln::dtype_name(dt) + " [" + std::to_string(n) + "] forward");
}

// bias + GELU and bias + dropout + residual, forward and forward+backward.
void bench_bias_ops(DType dt, int64_t rows, int64_t cols, double copy_gbs) {
  const kiln::Device dev = kiln::Device::cuda(0);
  const auto opts = kiln::TensorOptions().device(dev);
  Tensor x = kiln::randn({rows, cols}, opts).to(dt), b = kiln::randn({cols}, opts).to(dt);
  Tensor r = kiln::randn({rows, cols}, opts).to(dt), g = kiln::randn({rows, cols}, opts).to(dt);
  const double nb = static_cast<double>(x.nbytes());
  const std::string sfx = " [" + std::to_string(rows) + ", " + std::to_string(cols) + "] " + kiln::dtype_name(dt);
  const double tol = tol_of(dt) * 2;

  // ---- validation: fused vs chain on the GPU, fused GPU vs fused CPU on a slice (incl. grads)
  auto grads = [&](auto f, const Tensor& xx, const Tensor& bb, const Tensor& rr, const Tensor& gg) {
    Tensor xl = xx.detach().requires_grad_(), bl = bb.detach().requires_grad_();
    Tensor y = f(xl, bl, rr);
    y.backward(gg);
    return std::vector<Tensor>{y.detach(), xl.grad(), bl.grad()};
  };
  auto bg = [](const Tensor& a, const Tensor& bb, const Tensor&) { return F::bias_gelu(a, bb); };
  auto bg_chain = [](const Tensor& a, const Tensor& bb, const Tensor&) { return kiln::gelu(a + bb); };
  auto bda = [](const Tensor& a, const Tensor& bb, const Tensor& rr) {
    return F::bias_dropout_add(a, bb, rr, 0.1, true);
  };
  auto bda_chain = [](const Tensor& a, const Tensor& bb, const Tensor& rr) {
    return rr + F::dropout(a + bb, 0.1, true);
  };
  {
    const char* parts[] = {"y", "dx", "dbias"};
    auto fg = grads(bg, x, b, r, g), cg = grads(bg_chain, x, b, r, g);
    Tensor xs = x.slice(0, 0, 64), rs = r.slice(0, 0, 64), gs = g.slice(0, 0, 64);
    auto sg = grads(bg, xs, b, rs, gs), sc = grads(bg, xs.cpu(), b.cpu(), rs.cpu(), gs.cpu());
    for (int i = 0; i < 3; ++i) {
      const double scale = i == 2 ? 1.0 / rows : 1.0;  // dbias sums all rows
      double e = max_rel_err(fg[i], cg[i]) * scale;
      kiln::bench::validate(e < tol, ("bias_gelu " + std::string(parts[i]) + " vs chain" + sfx).c_str(), e);
      e = max_rel_err(sg[i], sc[i]) * (i == 2 ? 1.0 / 64 : 1.0);
      kiln::bench::validate(e < tol, ("bias_gelu " + std::string(parts[i]) + " vs CPU" + sfx).c_str(), e);
    }
    kiln::manual_seed(3);
    auto fd = grads(bda, x, b, r, g);
    kiln::manual_seed(3);
    auto cd = grads(bda_chain, x, b, r, g);
    for (int i = 0; i < 3; ++i) {
      double e = max_rel_err(fd[i], cd[i]) * (i == 2 ? 1.0 / rows : 1.0);
      kiln::bench::validate(e < tol, ("bias_dropout_add " + std::string(parts[i]) + " vs chain" + sfx).c_str(), e);
    }
  }

  // ---- forward
  {
    kiln::NoGradGuard ng;
    Tensor y;
    double tf = gpu::time_ms([&] { y = F::bias_gelu(x, b); });
    double tc = gpu::time_ms([&] { y = kiln::gelu(x + b); });
    row("bias+gelu forward" + sfx, tf, tc, 2 * nb, copy_gbs);
    tf = gpu::time_ms([&] { y = F::bias_dropout_add(x, b, r, 0.1, true); });
    tc = gpu::time_ms([&] { y = r + F::dropout(x + b, 0.1, true); });
    row("bias+dropout+add forward" + sfx, tf, tc, 3 * nb, copy_gbs);
  }
  // ---- forward + backward (gradients for x and the bias; the residual's is g itself)
  Tensor xl = x.detach().requires_grad_(), bl = b.detach().requires_grad_();
  auto step = [&](auto f) {
    xl.set_grad(Tensor());
    bl.set_grad(Tensor());
    f(xl, bl, r).backward(g);
  };
  double tf = gpu::time_ms([&] { step(bg); }, 10, 5);
  double tc = gpu::time_ms([&] { step(bg_chain); }, 10, 5);
  row("bias+gelu forward+backward" + sfx, tf, tc, 5 * nb, copy_gbs);  // x, y | g, x, dx
  tf = gpu::time_ms([&] { step(bda); }, 10, 5);
  tc = gpu::time_ms([&] { step(bda_chain); }, 10, 5);
  row("bias+dropout+add forward+backward" + sfx, tf, tc, 5 * nb, copy_gbs);  // x, r, y | g, dx
}

}  // namespace

int main() {
  const cudaDeviceProp prop = gpu::start("bench_cuda_fused");
  const int64_t n = int64_t{64} << 20;  // 64M elements
  const double copy_gbs = gpu::copy_bandwidth_gbs(static_cast<size_t>(n) * 4);
  std::printf("device: %s; device copy of %lld MiB: %.0f GB/s (read + write)\n", prop.name,
              static_cast<long long>(n * 4 >> 20), copy_gbs);
  for (DType dt : {DType::F32, DType::F16}) bench_gelu(dt, n, copy_gbs);
  // [16384, 4096] = 64M elements (16 x 1024 tokens of a 4096-wide MLP activation)
  for (DType dt : {DType::F32, DType::BF16}) bench_bias_ops(dt, 16384, 4096, copy_gbs);
  return 0;
}
