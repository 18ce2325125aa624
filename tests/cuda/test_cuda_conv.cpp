// CUDA convolution (cuDNN) and pooling against the CPU kernels on random inputs (never zeros):
// forward, gradient to the input, to the weight and to the bias, through the differentiable
// functional ops, for stride / padding / dilation / groups (depthwise included), NCHW and
// channels-last, f32 / f16 / bf16, with the cuDNN autotuner off and on and in deterministic mode.
//
// Tolerances (max |gpu - cpu| <= tol * max(1, max |cpu|), the CPU computing in f32 from the same
// rounded inputs): f32 5e-4 (cuDNN sums in a different order, and its Winograd / FFT algorithms
// add a little error); f32 with TF32 allowed 5e-3 (10-bit mantissa products); f16 1e-2 and bf16
// 4e-2 (the output and, for some algorithms, intermediate tiles are rounded to 16 bits). Pooling
// does the CPU's arithmetic in the CPU's order: f32 max (values and indices) must be equal, the
// averages within 1e-6; f16/bf16 compare with the CPU's widen-to-f32 path within one rounding.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <kiln/kiln.h>
#include <kiln/nn/functional.h>

#include "kiln/kernels/conv.h"
#include "kiln/kernels/memory_format.h"
#include "kiln/kernels/pool.h"

// the repository root is not on test_cuda's include path
#include "../conv_geometry.h"
#include "../test_util.h"

namespace {

namespace F = kiln::nn::functional;
using kiln::DType;
using kiln::MemoryFormat;
using kiln::Tensor;
using kiln_test::channels_last;
using kiln_test::values;

const kiln::Device kGpu = kiln::Device::cuda(0);

// Restores the cuDNN flags and TF32 at scope exit; the second form first sets the cuDNN autotuner
// (benchmark) and TF32 for the scope.
struct SettingsGuard {
  bool bench = kiln::cudnn::benchmark(), det = kiln::cudnn::deterministic(), tf32 = kiln::cuda::allow_tf32();
  SettingsGuard() = default;
  SettingsGuard(bool benchmark, bool allow_tf32) {
    kiln::cudnn::set_benchmark(benchmark);
    kiln::cuda::set_allow_tf32(allow_tf32);
  }
  ~SettingsGuard() {
    kiln::cudnn::set_benchmark(bench);
    kiln::cudnn::set_deterministic(det);
    kiln::cuda::set_allow_tf32(tf32);
  }
};

// max |gpu - ref| <= tol * max(1, max |ref|)
void require_near(const Tensor& gpu, const Tensor& ref, double tol, const std::string& what) {
  INFO(what << " sizes " << kiln::detail::concat(ref.sizes()));
  REQUIRE(gpu.defined());
  REQUIRE(ref.defined());
  REQUIRE(gpu.device() == kGpu);
  REQUIRE(gpu.sizes() == ref.sizes());
  const auto a = values(gpu), b = values(ref);
  double scale = 1, worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < b.size(); ++i) scale = std::max(scale, std::abs(b[i]));
  for (size_t i = 0; i < b.size(); ++i) {
    const double d = std::abs(a[i] - b[i]);
    if (!(d <= worst)) {  // also catches NaN
      worst = d;
      at = i;
    }
  }
  INFO("worst element " << at << ": gpu " << (a.empty() ? 0 : a[at]) << " cpu " << (b.empty() ? 0 : b[at]) << " (scale "
                        << scale << ", tol " << tol << ")");
  REQUIRE(worst <= tol * scale);
}

void require_bitwise(const Tensor& a, const Tensor& b, const std::string& what) {
  INFO(what);
  REQUIRE(a.sizes() == b.sizes());
  REQUIRE(kiln::equal(a.cpu(), b.cpu()));
}

double conv_tol(DType dt) {
  if (dt == DType::F16) return 1e-2;
  if (dt == DType::BF16) return 4e-2;
  return kiln::cuda::allow_tf32() ? 5e-3 : 5e-4;
}

struct ConvCase {
  const char* name;
  int64_t N, C, H, W, K, kh, kw, sh, sw, ph, pw, dh, dw, groups;
  bool bias;
};

const std::vector<ConvCase> kConvCases = {
    {"3x3 pad 1", 2, 3, 9, 9, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1, true},
    {"1x1 single pixel", 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, true},
    {"rect 3x2 stride 2 odd sizes", 5, 7, 7, 10, 4, 3, 2, 2, 2, 0, 1, 1, 1, 1, true},
    {"dilation 2", 2, 4, 11, 13, 6, 3, 3, 1, 1, 2, 2, 2, 2, 1, false},
    {"groups 2", 3, 4, 8, 9, 6, 3, 3, 1, 2, 1, 1, 1, 1, 2, true},
    {"depthwise 3x3", 2, 8, 15, 15, 8, 3, 3, 1, 1, 1, 1, 1, 1, 8, true},
    {"depthwise multiplier 2, stride 2", 2, 6, 14, 14, 12, 5, 5, 2, 2, 2, 2, 1, 1, 6, false},
    {"1x1 stride 2 (ResNet downsample)", 4, 16, 14, 14, 32, 1, 1, 2, 2, 0, 0, 1, 1, 1, false},
    {"CNN conv2 (32 -> 64, 14x14)", 8, 32, 14, 14, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1, true},
    {"ResNet 3x3 64 -> 64, 28x28", 4, 64, 28, 28, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1, false},
    {"ResNet stem 7x7 stride 2", 2, 3, 33, 33, 16, 7, 7, 2, 2, 3, 3, 1, 1, 1, false},
};

F::Conv2dParams params_of(const ConvCase& c) {
  F::Conv2dParams p;
  p.stride = {c.sh, c.sw};
  p.padding = {c.ph, c.pw};
  p.dilation = {c.dh, c.dw};
  p.groups = c.groups;
  return p;
}

struct ConvResult {
  Tensor y, gx, gw, gb;
};

// y = conv2d(x, w, b), then backward with upstream gradient gy; all on the inputs' device.
ConvResult run_conv(const Tensor& x0, const Tensor& w0, const Tensor& b0, const Tensor& gy, const F::Conv2dParams& p) {
  Tensor x = x0.detach().requires_grad_(true);
  Tensor w = w0.detach().requires_grad_(true);
  Tensor b = b0.defined() ? b0.detach().requires_grad_(true) : Tensor();
  Tensor y = F::conv2d(x, w, b, p);
  y.backward(gy);
  return {y.detach(), x.grad(), w.grad(), b.defined() ? b.grad() : Tensor()};
}

struct ConvInputs {
  Tensor x, w, b, gy;  // CPU f32
};

ConvInputs make_inputs(const ConvCase& c) {
  const int64_t OH = (c.H + 2 * c.ph - c.dh * (c.kh - 1) - 1) / c.sh + 1;
  const int64_t OW = (c.W + 2 * c.pw - c.dw * (c.kw - 1) - 1) / c.sw + 1;
  ConvInputs in;
  in.x = kiln::randn({c.N, c.C, c.H, c.W});
  in.w = kiln::randn({c.K, c.C / c.groups, c.kh, c.kw}) * (1.0 / std::sqrt(double(c.C / c.groups * c.kh * c.kw)));
  in.b = c.bias ? kiln::randn({c.K}) : Tensor();
  in.gy = kiln::randn({c.N, c.K, OH, OW});
  return in;
}

// The GPU result of case c in dtype dt and layout, and the CPU f32 reference computed from the
// same (rounded) values.
void check_conv_case(const ConvCase& c, const ConvInputs& in, DType dt, bool cl) {
  const std::string what = std::string(c.name) + " " + kiln::dtype_name(dt) + (cl ? " channels-last" : " NCHW") +
                           (kiln::cudnn::benchmark() ? " benchmark" : "") +
                           (kiln::cudnn::deterministic() ? " deterministic" : "");
  const F::Conv2dParams p = params_of(c);
  Tensor xg = in.x.to(kGpu, dt), wg = in.w.to(kGpu, dt), gyg = in.gy.to(kGpu, dt);
  Tensor bg = in.b.defined() ? in.b.to(kGpu, dt) : Tensor();
  if (cl) xg = channels_last(xg);
  ConvResult g = run_conv(xg, wg, bg, gyg, p);
  // reference: f32 on the CPU from the values the GPU saw
  ConvResult r = run_conv(xg.cpu().to(DType::F32), wg.cpu().to(DType::F32),
                          bg.defined() ? bg.cpu().to(DType::F32) : Tensor(), gyg.cpu().to(DType::F32), p);
  REQUIRE(g.y.dtype() == dt);
  if (cl) {  // has_layout ignores the strides of size-1 dimensions (ambiguous layouts)
    INFO(what << ": a channels-last input gives a channels-last output");
    REQUIRE(kiln::kernels::has_layout(g.y, MemoryFormat::ChannelsLast));
  }
  const double tol = conv_tol(dt);
  require_near(g.y, r.y, tol, what + ": forward");
  require_near(g.gx, r.gx, tol, what + ": grad input");
  require_near(g.gw, r.gw, tol, what + ": grad weight");
  if (c.bias) require_near(g.gb, r.gb, tol, what + ": grad bias");
}

void check_all_conv(const std::vector<DType>& dtypes) {
  kiln::manual_seed(21);
  for (const ConvCase& c : kConvCases) {
    const ConvInputs in = make_inputs(c);
    for (DType dt : dtypes)
      for (bool cl : {false, true}) check_conv_case(c, in, dt, cl);
  }
}

}  // namespace

TEST_CASE("conv2d on cuDNN matches the CPU (heuristic algorithms)", "[cuda][conv]") {
  if (!kiln::cudnn::built_with_cudnn()) {
    Tensor x = kiln::randn({1, 1, 3, 3}, kiln::TensorOptions().device(kGpu));
    REQUIRE_THROWS_WITH(F::conv2d(x, x), Catch::Contains("without cuDNN"));
    return;
  }
  SettingsGuard guard(/*benchmark=*/false, /*allow_tf32=*/false);
  kiln::cudnn::set_deterministic(false);
  REQUIRE(kiln::cudnn::is_available());
  REQUIRE(kiln::cudnn::version() >= 80000);
  check_all_conv({DType::F32, DType::F16});
}

// cuDNN may have no channels-last algorithm for exact f32 with dilation or groups: the kernels then
// run on NCHW copies. The test hook makes every channels-last search fail so that path runs here.
TEST_CASE("conv2d on cuDNN: channels-last falls back to NCHW copies without an algorithm", "[cuda][conv]") {
  if (!kiln::cudnn::built_with_cudnn()) return;
  SettingsGuard guard(/*benchmark=*/false, /*allow_tf32=*/false);
  struct Refuse {
    Refuse() { kiln::cudnn::detail::set_refuse_channels_last_for_testing(true); }
    ~Refuse() { kiln::cudnn::detail::set_refuse_channels_last_for_testing(false); }
  } refuse;
  kiln::manual_seed(22);
  const int64_t before = kiln::cudnn::detail::channels_last_fallbacks();
  for (const char* name : {"dilation 2", "groups 2", "3x3 pad 1"})
    for (const ConvCase& c : kConvCases)
      if (std::string(c.name) == name) check_conv_case(c, make_inputs(c), DType::F32, true);
  CHECK(kiln::cudnn::detail::channels_last_fallbacks() - before == 9);  // forward, input and weight grads
}

TEST_CASE("conv2d on cuDNN matches the CPU (autotuned, cached)", "[cuda][conv]") {
  if (!kiln::cudnn::built_with_cudnn()) return;
  SettingsGuard guard(/*benchmark=*/true, /*allow_tf32=*/false);
  kiln::cudnn::set_deterministic(false);
  kiln::cudnn::clear_autotune_cache();
  check_all_conv({DType::F32, DType::F16});
  const size_t cached = kiln::cudnn::autotune_cache_size();
  REQUIRE(cached > 0);
  // the same shapes again: answered from the cache, no new entries
  check_all_conv({DType::F16});
  REQUIRE(kiln::cudnn::autotune_cache_size() == cached);
  kiln::cudnn::clear_autotune_cache();
  REQUIRE(kiln::cudnn::autotune_cache_size() == 0);
}

TEST_CASE("conv2d on cuDNN: bf16 and TF32", "[cuda][conv]") {
  if (!kiln::cudnn::built_with_cudnn()) return;
  SettingsGuard guard(/*benchmark=*/false, /*allow_tf32=*/false);
  kiln::manual_seed(22);
  for (size_t i : {size_t{0}, size_t{4}, size_t{8}}) {
    const ConvInputs in = make_inputs(kConvCases[i]);
    for (bool cl : {false, true}) check_conv_case(kConvCases[i], in, DType::BF16, cl);
  }
  kiln::cuda::set_allow_tf32(true);  // conv_tol widens to 5e-3
  for (size_t i : {size_t{0}, size_t{9}}) {
    const ConvInputs in = make_inputs(kConvCases[i]);
    for (bool cl : {false, true}) check_conv_case(kConvCases[i], in, DType::F32, cl);
  }
}

TEST_CASE("conv2d on cuDNN: the bias and its gradient in f16 and bf16, both layouts", "[cuda][conv]") {
  // The bias is added and its gradient summed by kiln's kernels (legacy cuDNN's bias calls
  // reject bf16); a gradient summed over 4 x 30 x 30 pixels per channel.
  if (!kiln::cudnn::built_with_cudnn()) return;
  SettingsGuard guard(/*benchmark=*/false, /*allow_tf32=*/false);
  kiln::manual_seed(24);
  const ConvCase c{"bias, 4 x 8 x 32 x 32 -> 24", 4, 8, 32, 32, 24, 3, 3, 1, 1, 0, 0, 1, 1, 1, true};
  const ConvInputs in = make_inputs(c);
  for (DType dt : {DType::F16, DType::BF16, DType::F32})
    for (bool cl : {false, true}) check_conv_case(c, in, dt, cl);
}

TEST_CASE("conv2d on cuDNN: deterministic mode is bitwise reproducible", "[cuda][conv]") {
  if (!kiln::cudnn::built_with_cudnn()) return;
  SettingsGuard guard;
  kiln::cudnn::set_deterministic(true);
  kiln::manual_seed(23);
  // a weight gradient summed over many pixels: where non-deterministic (atomic) algorithms exist
  const ConvCase c{"deterministic", 32, 64, 28, 28, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1, true};
  const ConvInputs in = make_inputs(c);
  for (bool bench : {false, true}) {
    kiln::cudnn::set_benchmark(bench);
    for (DType dt : {DType::F32, DType::F16})
      for (bool cl : {false, true}) {
        const std::string what = std::string(kiln::dtype_name(dt)) + (cl ? " channels-last" : " NCHW") +
                                 (bench ? " benchmark" : " heuristics");
        Tensor xg = in.x.to(kGpu, dt), wg = in.w.to(kGpu, dt), bg = in.b.to(kGpu, dt), gyg = in.gy.to(kGpu, dt);
        if (cl) xg = channels_last(xg);
        ConvResult a = run_conv(xg, wg, bg, gyg, params_of(c));
        ConvResult b = run_conv(xg, wg, bg, gyg, params_of(c));
        require_bitwise(a.y, b.y, what + ": forward");
        require_bitwise(a.gx, b.gx, what + ": grad input");
        require_bitwise(a.gw, b.gw, what + ": grad weight");
        require_bitwise(a.gb, b.gb, what + ": grad bias");
      }
  }
  // and the values are right
  kiln::cudnn::set_benchmark(false);
  check_conv_case(c, in, DType::F32, true);
}

TEST_CASE("conv_transpose2d, autocast and bad layouts on CUDA", "[cuda][conv]") {
  if (!kiln::cudnn::built_with_cudnn()) return;
  SettingsGuard guard(/*benchmark=*/false, /*allow_tf32=*/false);
  kiln::manual_seed(24);
  // conv_transpose2d runs backward-data forward, and forward + backward-filter for its gradients
  F::ConvTranspose2dParams p;
  p.stride = {2, 2};
  p.padding = {1, 1};
  p.output_padding = {1, 1};
  p.groups = 2;
  Tensor x = kiln::randn({3, 4, 7, 6}), w = kiln::randn({4, 3, 3, 3}) * 0.3, b = kiln::randn({6});
  for (bool cl : {false, true}) {
    auto run = [&](const Tensor& x0, const Tensor& w0, const Tensor& b0) {
      Tensor xv = x0.detach().requires_grad_(true), wv = w0.detach().requires_grad_(true),
             bv = b0.detach().requires_grad_(true);
      Tensor y = F::conv_transpose2d(xv, wv, bv, p);
      (y * y).sum().backward();
      return ConvResult{y.detach(), xv.grad(), wv.grad(), bv.grad()};
    };
    Tensor xg = x.to(kGpu);
    if (cl) xg = channels_last(xg);
    ConvResult g = run(xg, w.to(kGpu), b.to(kGpu)), r = run(x, w, b);
    const std::string what = cl ? "conv_transpose2d channels-last" : "conv_transpose2d NCHW";
    require_near(g.y, r.y, conv_tol(DType::F32), what + ": forward");
    require_near(g.gx, r.gx, conv_tol(DType::F32), what + ": grad input");
    require_near(g.gw, r.gw, conv_tol(DType::F32), what + ": grad weight");
    require_near(g.gb, r.gb, conv_tol(DType::F32), what + ": grad bias");
  }
  {  // autocast: f32 parameters, f16 convolution on cuDNN
    Tensor xi = kiln::randn({4, 8, 12, 12}), wi = kiln::randn({16, 8, 3, 3}) * 0.1;
    F::Conv2dParams cp;
    cp.padding = {1, 1};
    Tensor y;
    {
      kiln::amp::Autocast ac(DType::F16);
      y = F::conv2d(xi.to(kGpu), wi.to(kGpu), Tensor(), cp);
    }
    REQUIRE(y.dtype() == DType::F16);
    require_near(y, F::conv2d(xi.to(DType::F16).to(DType::F32), wi.to(DType::F16).to(DType::F32), Tensor(), cp), 1e-2,
                 "autocast f16 conv2d");
  }
  {  // the raw kernel rejects operands whose layout disagrees with the geometry
    const kiln::kernels::ConvGeometry g = kiln_test::conv_geometry({2, 3, 5, 5}, 4, {3, 3}, {0, 0});  // NCHW
    Tensor xc = channels_last(kiln::randn({2, 3, 5, 5}).to(kGpu));
    Tensor out = kiln::empty({2, 4, 3, 3}, kiln::TensorOptions().device(kGpu));
    Tensor wk = kiln::randn({4, 3, 3, 3}).to(kGpu);
    REQUIRE_THROWS_WITH(kiln::kernels::conv2d_forward(out, xc, wk, Tensor(), g), Catch::Contains("NCHW-contiguous"));
  }
}

// ------------------------------------------------------------------------------------ pooling

namespace {

struct PoolCase {
  int64_t N, C, H, W, k, s, p;
};

const std::vector<PoolCase> kPoolCases = {
    {1, 1, 1, 1, 1, 1, 0},                              // one element
    {2, 3, 7, 9, 3, 2, 1},                              // odd sizes, padding
    {8, 32, 28, 28, 2, 2, 0},                           // the CNN's pool
    {4, 64, 56, 56, 3, 2, 1},                           // ResNet's stem pool
    {5, 7, 33, 17, 2, 1, 1},                            // overlapping windows, stride 1
    {3, 5, 31, 29, 4, 3, 2},  {2, 4, 17, 23, 2, 5, 1},  // stride larger than the kernel (uncovered inputs get 0)
};

// x in layout 0 NCHW, 1 channels-last, 2 a non-contiguous view (every other column).
Tensor in_layout(const Tensor& t, int layout) {
  if (layout == 0) return t.contiguous();
  if (layout == 1) return channels_last(t);
  Tensor wide = kiln::empty({t.size(0), t.size(1), t.size(2), 2 * t.size(3)}, t.options());
  Tensor v = wide.slice(3, 0, 2 * t.size(3), 2);
  v.copy_(t);
  return v;
}

std::pair<Tensor, Tensor> run_pool(const Tensor& x0, const Tensor& gy, const std::function<Tensor(const Tensor&)>& op) {
  Tensor x = x0.detach().requires_grad_(true);
  Tensor y = op(x);
  y.backward(gy);
  return {y.detach(), x.grad()};
}

void check_pool(const std::string& what, const Tensor& x_cpu, DType dt, int layout,
                const std::function<Tensor(const Tensor&)>& op, bool exact) {
  Tensor xg = in_layout(x_cpu.to(kGpu, dt), layout);
  Tensor yshape = op(x_cpu.to(dt));  // CPU forward for the output size
  Tensor gy = kiln::randn(yshape.sizes()).to(dt);
  auto [yg, gxg] = run_pool(xg, gy.to(kGpu), op);
  auto [yc, gxc] = run_pool(in_layout(x_cpu.to(dt), layout), gy, op);
  const std::string w = what + " " + kiln::dtype_name(dt) + " layout " + std::to_string(layout);
  REQUIRE(yg.dtype() == dt);
  if (layout == 1) {
    INFO(w << ": channels-last in, channels-last out");
    REQUIRE(kiln::kernels::has_layout(yg, MemoryFormat::ChannelsLast));
  }
  const double tol = dt == DType::F16 ? 1e-3 : dt == DType::BF16 ? 1e-2 : exact ? 0.0 : 1e-6;
  require_near(yg, yc, tol, w + ": forward");
  require_near(gxg, gxc, tol, w + ": backward");
}

}  // namespace

TEST_CASE("CUDA pooling matches the CPU: max, avg, adaptive avg", "[cuda][pool]") {
  kiln::manual_seed(31);
  for (const PoolCase& c : kPoolCases) {
    const Tensor x = kiln::randn({c.N, c.C, c.H, c.W});
    const std::string dims = std::to_string(c.H) + "x" + std::to_string(c.W) + " k" + std::to_string(c.k) + " s" +
                             std::to_string(c.s) + " p" + std::to_string(c.p);
    for (DType dt : {DType::F32, DType::F16, DType::BF16})
      for (int layout : {0, 1, 2}) {
        check_pool(
            "max_pool2d " + dims, x, dt, layout,
            [&](const Tensor& t) {
              return F::max_pool2d(t, {c.k, c.k}, {c.s, c.s}, {c.p, c.p});
            },
            true);
        check_pool(
            "avg_pool2d count_include_pad " + dims, x, dt, layout,
            [&](const Tensor& t) {
              return F::avg_pool2d(t, {c.k, c.k}, {c.s, c.s}, {c.p, c.p}, true);
            },
            false);
        check_pool(
            "avg_pool2d exclude pad " + dims, x, dt, layout,
            [&](const Tensor& t) {
              return F::avg_pool2d(t, {c.k, c.k}, {c.s, c.s}, {c.p, c.p}, false);
            },
            false);
      }
  }
  for (auto [H, W, OH, OW] :
       std::vector<std::array<int64_t, 4>>{{7, 7, 1, 1}, {7, 9, 3, 4}, {5, 3, 7, 4}, {56, 56, 7, 7}}) {
    const Tensor x = kiln::randn({3, 6, H, W});
    const std::string dims =
        std::to_string(H) + "x" + std::to_string(W) + " -> " + std::to_string(OH) + "x" + std::to_string(OW);
    for (DType dt : {DType::F32, DType::F16})
      for (int layout : {0, 1, 2})
        check_pool(
            "adaptive_avg_pool2d " + dims, x, dt, layout,
            [&](const Tensor& t) {
              return F::adaptive_avg_pool2d(t, {OH, OW});
            },
            false);
  }
}

TEST_CASE("CUDA max_pool2d: indices and backward are exact, also with ties and NaN", "[cuda][pool]") {
  // integer-valued input: many ties, so the first-maximum rule decides; a NaN propagates
  Tensor x = kiln::randint(0, 4, {2, 3, 9, 9}).to(DType::F32);
  Tensor xg = x.to(kGpu);
  for (int rep = 0; rep < 2; ++rep) {  // the gather backward is deterministic: run twice
    auto [yg, gxg] = run_pool(xg, kiln::ones({2, 3, 5, 5}).to(kGpu), [](const Tensor& t) {
      return F::max_pool2d(t, {3, 3}, {2, 2}, {1, 1});
    });
    auto [yc, gxc] = run_pool(x, kiln::ones({2, 3, 5, 5}), [](const Tensor& t) {
      return F::max_pool2d(t, {3, 3}, {2, 2}, {1, 1});
    });
    require_bitwise(yg, yc, "max_pool2d ties forward");
    require_bitwise(gxg, gxc, "max_pool2d ties backward");
  }
  Tensor xn = x.clone();
  static_cast<float*>(xn.data_ptr())[10] = NAN;
  Tensor yn = F::max_pool2d(xn.to(kGpu), {3, 3}, {2, 2}, {1, 1}).cpu();
  Tensor yr = F::max_pool2d(xn, {3, 3}, {2, 2}, {1, 1});
  REQUIRE(kiln::equal(kiln::isnan(yn), kiln::isnan(yr)));
  REQUIRE(kiln::isnan(yn).sum().to(DType::I64).item<int64_t>() > 0);
}
