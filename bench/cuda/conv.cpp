// GPU bench: convolution through cuDNN (kiln/kernels/cuda/conv_cudnn.cpp) on the convolutions of
// the Fashion-MNIST CNN (batch 256) and of ResNet-18 at ImageNet resolution (batch 128), forward
// and forward+backward (backward-data + backward-filter; the first layer's input needs no
// gradient), each with the autotuner off (cuDNN's heuristics, kiln::cudnn::set_benchmark(false))
// and on (every algorithm timed once per shape, set_benchmark(true)): the ratio off/on is the
// speed-up PyTorch's guide quotes for torch.backends.cudnn.benchmark (~1.7x forward, ~1.27x
// forward+backward on its model). Also NCHW against channels-last under f16, the layout tensor
// cores want. Every configuration runs in the same process on the same data.
//
// Validation before any time is printed (exit 1 on a mismatch): for every configuration the
// output and the input gradient of the first two samples against the CPU kernels in f32, and the
// weight gradient (a sum over the whole batch) against the f32 NCHW heuristic configuration.
// f32 runs without TF32 (kiln::cuda::allow_tf32() off, the default). Times are CUDA-event
// medians of the raw kernels (kiln::kernels::conv2d_*), no autograd. Exits 77 without a device.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include <kiln/kiln.h>

#include "cuda_bench_util.h"
#include "kiln/kernels/conv.h"
#include "kiln/kernels/memory_format.h"
#include "kiln/kernels/pool.h"

namespace {

namespace gpu = kiln::bench::gpu;
namespace K = kiln::kernels;
using kiln::DType;
using kiln::Tensor;

struct Shape {
  const char* name;
  int64_t C, H, K, k, s, p;
  int count;        // how often the network runs this convolution
  bool input_grad;  // false for the first layer (the images need no gradient)
};

struct Net {
  const char* name;
  int64_t N;
  std::vector<Shape> shapes;
};

const std::vector<Net> kNets = {
    {"Fashion-MNIST CNN",
     256,
     {{"conv1 1->32 3x3 @28", 1, 28, 32, 3, 1, 1, 1, false}, {"conv2 32->64 3x3 @14", 32, 14, 64, 3, 1, 1, 1, true}}},
    {"ResNet-18 (224x224)",
     128,
     {{"stem 3->64 7x7/2 @224", 3, 224, 64, 7, 2, 3, 1, false},
      {"layer1 64->64 3x3 @56", 64, 56, 64, 3, 1, 1, 4, true},
      {"layer2 64->128 3x3/2 @56", 64, 56, 128, 3, 2, 1, 1, true},
      {"layer2 128->128 3x3 @28", 128, 28, 128, 3, 1, 1, 3, true},
      {"layer2 down 64->128 1x1/2 @56", 64, 56, 128, 1, 2, 0, 1, true},
      {"layer3 128->256 3x3/2 @28", 128, 28, 256, 3, 2, 1, 1, true},
      {"layer3 256->256 3x3 @14", 256, 14, 256, 3, 1, 1, 3, true},
      {"layer3 down 128->256 1x1/2 @28", 128, 28, 256, 1, 2, 0, 1, true},
      {"layer4 256->512 3x3/2 @14", 256, 14, 512, 3, 2, 1, 1, true},
      {"layer4 512->512 3x3 @7", 512, 7, 512, 3, 1, 1, 3, true},
      {"layer4 down 256->512 1x1/2 @14", 256, 14, 512, 1, 2, 0, 1, true}}},
};

struct Config {
  DType dt;
  bool cl;
  bool bench;
  std::string format() const { return std::string(dt == DType::F16 ? "f16" : "f32") + (cl ? " NHWC" : " NCHW"); }
  std::string name() const { return format() + (bench ? " tuned" : " heur."); }
  // compare.py's impl: the autotuned configuration is kiln's (PyTorch's peer runs with
  // cudnn.benchmark = True), the heuristic one a peer
  const char* impl() const { return bench ? "kiln" : "kiln heuristics"; }
};

// Recorded case names, e.g. "ResNet-18 (224x224), batch 128, layer1 64->64 3x3 @56, f16 NHWC, forward".
std::string case_name(const char* net, int64_t N, const char* conv, const std::string& format, const char* pass) {
  return std::string(net) + ", batch " + std::to_string(N) + ", " + conv + ", " + format + ", " + pass;
}

// The reference configuration (index 0) is f32 NCHW heuristics.
const std::vector<Config> kConfigs = {
    {DType::F32, false, false}, {DType::F32, false, true}, {DType::F16, false, false},
    {DType::F16, false, true},  {DType::F16, true, false}, {DType::F16, true, true},
};

K::ConvGeometry geometry(int64_t N, const Shape& s, bool cl) {
  K::ConvGeometry g;
  g.N = N, g.C = s.C, g.H = g.W = s.H, g.K = s.K;
  g.kh = g.kw = s.k, g.sh = g.sw = s.s, g.ph = g.pw = s.p;
  g.channels_last = cl;
  g.set_output_size();
  return g;
}

// max |a - b| / max(1, max |b|), on the CPU in f64.
double scaled_err(const Tensor& a, const Tensor& b) {
  kiln::NoGradGuard ng;
  Tensor x = a.contiguous().cpu().to(DType::F64), y = b.contiguous().cpu().to(DType::F64);
  const double scale = std::max(1.0, kiln::abs(y).max().item<double>());
  return kiln::abs(x - y).max().item<double>() / scale;
}

Tensor first2(const Tensor& t) { return t.slice(0, 0, 2); }

// t (an NCHW CPU f32 tensor) on the GPU in dtype dt, laid out as the configuration says.
Tensor to_gpu(const Tensor& t, DType dt, bool cl) {
  Tensor g = t.to(kiln::Device::cuda(0), dt);
  return cl ? g.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2}) : g;
}

struct Times {
  double fwd = 0, fwdbwd = 0;
};

}  // namespace

int main() {
  gpu::require_gpu("bench_cuda_conv");
  if (!kiln::cudnn::is_available()) {
    std::printf("bench_cuda_conv: kiln was built without cuDNN, skipping\n");
    return 77;
  }
  cudaDeviceProp prop{};
  gpu::check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::localtime(&now));
  std::printf("bench_cuda_conv: %s, cuDNN %d, %s; f32 without TF32\n", prop.name, kiln::cudnn::version(), date);
  std::printf("heur. = cuDNN heuristics (set_benchmark(false)), tuned = autotuned (set_benchmark(true))\n");
  kiln::cuda::set_allow_tf32(false);
  kiln::cudnn::set_deterministic(false);
  kiln::manual_seed(1);

  for (const Net& net : kNets) {
    std::printf("\n== %s, batch %lld: time per call in ms (CUDA events, median)\n", net.name,
                static_cast<long long>(net.N));
    std::vector<Times> total(kConfigs.size());  // weighted by Shape::count
    double total_fwd_flops = 0, total_fwdbwd_flops = 0;
    for (const Shape& s : net.shapes) {
      // data (CPU f32) and the CPU reference on the first two samples
      const K::ConvGeometry g_nchw = geometry(net.N, s, false);
      Tensor x = kiln::randn({net.N, s.C, s.H, s.H});
      Tensor w = kiln::randn({s.K, s.C, s.k, s.k}) * (1.0 / std::sqrt(double(s.C * s.k * s.k)));
      Tensor gy = kiln::randn({net.N, s.K, g_nchw.OH, g_nchw.OW});
      const K::ConvGeometry g2 = geometry(2, s, false);
      Tensor y_ref = kiln::empty({2, s.K, g2.OH, g2.OW});
      K::conv2d_forward(y_ref, first2(x).contiguous(), w, Tensor(), g2);
      Tensor gx_ref = kiln::empty({2, s.C, s.H, s.H});
      K::conv2d_backward_input(gx_ref, first2(gy).contiguous(), w, g2);

      std::vector<Times> times(kConfigs.size());
      // forward multiply-adds x 2; backward-weight as many, backward-data too where it runs
      const double fwd_flops = 2.0 * net.N * s.K * s.C * s.k * s.k * g_nchw.OH * g_nchw.OW;
      const double fwdbwd_flops = fwd_flops * (s.input_grad ? 3 : 2);
      total_fwd_flops += s.count * fwd_flops;
      total_fwdbwd_flops += s.count * fwdbwd_flops;
      Tensor gw_ref;  // from configuration 0
      for (size_t ci = 0; ci < kConfigs.size(); ++ci) {
        const Config& c = kConfigs[ci];
        kiln::cudnn::set_benchmark(c.bench);
        const K::ConvGeometry g = geometry(net.N, s, c.cl);
        const kiln::MemoryFormat fmt = c.cl ? kiln::MemoryFormat::ChannelsLast : kiln::MemoryFormat::Contiguous;
        const kiln::TensorOptions opts = kiln::TensorOptions().dtype(c.dt).device(kiln::Device::cuda(0));
        Tensor xg = to_gpu(x, c.dt, c.cl), gyg = to_gpu(gy, c.dt, c.cl);
        Tensor wg = w.to(kiln::Device::cuda(0), c.dt);
        Tensor y = K::empty_4d({net.N, s.K, g.OH, g.OW}, opts, fmt);
        Tensor gx = K::empty_4d({net.N, s.C, s.H, s.H}, opts, fmt);
        Tensor gw = kiln::empty({s.K, s.C, s.k, s.k}, opts);
        auto fwd = [&] { K::conv2d_forward(y, xg, wg, Tensor(), g); };
        auto fwdbwd = [&] {
          fwd();
          if (s.input_grad) K::conv2d_backward_input(gx, gyg, wg, g);
          K::conv2d_backward_weight(gw, Tensor(), gyg, xg, g);
        };
        // validate (the first run also does the autotuner's search)
        fwdbwd();
        K::conv2d_backward_input(gx, gyg, wg, g);  // also for the first layer, to check it
        kiln::cuda::synchronize();
        const double tol = c.dt == DType::F16 ? 2e-2 : 1e-3;
        const std::string what = std::string(net.name) + " " + s.name + " " + c.name();
        const double ey = scaled_err(first2(y).to(DType::F32), y_ref);
        kiln::bench::validate(ey < tol, (what + ": output vs CPU").c_str(), ey);
        const double ex = scaled_err(first2(gx).to(DType::F32), gx_ref);
        kiln::bench::validate(ex < tol, (what + ": grad input vs CPU").c_str(), ex);
        if (ci == 0) {
          gw_ref = gw.cpu();
        } else {
          const double ew = scaled_err(gw.to(DType::F32), gw_ref);
          kiln::bench::validate(ew < tol, (what + ": grad weight vs f32 NCHW heuristics").c_str(), ew);
        }
        times[ci].fwd = gpu::time_ms(fwd, 10, 5, 2);
        times[ci].fwdbwd = gpu::time_ms(fwdbwd, 10, 3, 2);
        total[ci].fwd += s.count * times[ci].fwd;
        total[ci].fwdbwd += s.count * times[ci].fwdbwd;
        gpu::record("conv", case_name(net.name, net.N, s.name, c.format(), "forward"), c.impl(), times[ci].fwd,
                    gpu::flops(fwd_flops));
        gpu::record("conv", case_name(net.name, net.N, s.name, c.format(), "fwd+bwd"), c.impl(), times[ci].fwdbwd,
                    gpu::flops(fwdbwd_flops));
      }
      std::printf("%-32s", s.name);
      for (size_t ci = 0; ci < kConfigs.size(); ++ci)
        std::printf(" | %s %7.3f / %7.3f", kConfigs[ci].name().c_str(), times[ci].fwd, times[ci].fwdbwd);
      std::printf("   (fwd / fwd+bwd)\n");
    }
    auto ratio = [&](size_t slow, size_t fast, const char* what) {
      std::printf("  %-46s forward %5.2fx   forward+backward %5.2fx\n", what, total[slow].fwd / total[fast].fwd,
                  total[slow].fwdbwd / total[fast].fwdbwd);
    };
    std::printf("whole network (each convolution times its count), ms fwd / fwd+bwd:\n");
    for (size_t ci = 0; ci < kConfigs.size(); ++ci) {
      std::printf("  %-16s %9.3f / %9.3f\n", kConfigs[ci].name().c_str(), total[ci].fwd, total[ci].fwdbwd);
      const Config& c = kConfigs[ci];
      gpu::record("conv", case_name(net.name, net.N, "whole network", c.format(), "forward"), c.impl(), total[ci].fwd,
                  gpu::flops(total_fwd_flops));
      gpu::record("conv", case_name(net.name, net.N, "whole network", c.format(), "fwd+bwd"), c.impl(),
                  total[ci].fwdbwd, gpu::flops(total_fwdbwd_flops));
    }
    std::printf("speed-ups (ratio of times, >1 = the second is faster):\n");
    ratio(0, 1, "f32 NCHW: heuristics -> autotuned");
    ratio(2, 3, "f16 NCHW: heuristics -> autotuned");
    ratio(4, 5, "f16 NHWC: heuristics -> autotuned");
    ratio(3, 5, "f16 autotuned: NCHW -> channels-last");
    ratio(2, 4, "f16 heuristics: NCHW -> channels-last");
    ratio(1, 5, "autotuned: f32 NCHW -> f16 channels-last");
  }
  kiln::cudnn::set_benchmark(false);
  return 0;
}
