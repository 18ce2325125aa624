// CUDA vs CPU for the normalisation, dropout and leaky-ReLU kernels (kiln/kernels/norm.h, dropout.h, activation.h):
// batch norm (train and eval, [N, C] and [N, C, S] layouts, channels-last input, running
// statistics; plain and with the fused ReLU), layer norm and RMS norm (warp-per-row and
// block-per-row sizes), forward and backward through the functional API and the raw kernels
// (optional gradients left undefined), dropout masks bit-identical to the CPU's, leaky ReLU,
// run-to-run determinism of the reductions.
// Inputs are random (never zeros). Tolerances per dtype are stated in tol_*() below: both backends
// accumulate in double and compute elementwise in f32 (f64 for f64), so f32 agrees to ~1e-6 and
// f16/bf16 to about one unit in the last place of the stored result.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include <kiln/kiln.h>
#include <kiln/kernels/dropout.h>
#include <kiln/kernels/norm.h>
#include <kiln/nn/functional.h>
#include <kiln/nn/fused/conv_block.h>
#include "cuda_test_util.h"

namespace F = kiln::nn::functional;
using kiln::DType;
using kiln::IntList;
using kiln::Tensor;
using namespace kiln_cuda_test;

namespace {

// Relative / absolute tolerances for values of magnitude ~1 (outputs, input gradients).
double rtol_of(DType dt) { return per_dtype(dt, 1e-10, 2e-5, 4e-3, 2e-2); }
double atol_of(DType dt) { return per_dtype(dt, 1e-10, 2e-5, 4e-3, 3e-2); }

std::string dname(DType dt) { return kiln::dtype_name(dt); }

void require_close(const Tensor& gpu, const Tensor& cpu, double rtol, double atol, const std::string& what) {
  INFO(what);
  REQUIRE(gpu.defined() == cpu.defined());
  if (!cpu.defined()) return;
  INFO(describe("", cpu));
  require_gpu_twin(gpu, cpu);
  Tensor g = gpu.cpu();
  if (!kiln::allclose(g, cpu, rtol, atol)) {
    Tensor diff = (g.to(DType::F64) - cpu.to(DType::F64)).abs();
    INFO("max |gpu - cpu| = " << diff.max().item<double>());
    REQUIRE(kiln::allclose(g, cpu, rtol, atol));
  }
}

Tensor on(const Tensor& t, kiln::Device d) { return t.defined() ? t.to(d) : Tensor(); }

// Leaf copy of t on device d that requires grad (undefined stays undefined).
Tensor leaf(const Tensor& t, kiln::Device d) {
  if (!t.defined()) return Tensor();
  return t.to(d).detach().requires_grad_(true);
}

// Random values around `center` with spread 1, stored in dt (both backends get the same values).
Tensor rnd(const IntList& sizes, DType dt, double center = 0.0) { return (kiln::randn(sizes) + center).to(dt); }

// ----------------------------------------------------------------- batch norm

struct BnOut {
  Tensor y, dx, dw, db, rm, rv;
};

BnOut run_bn(kiln::Device d, const Tensor& x0, const Tensor& w0, const Tensor& b0, const Tensor& g0, const Tensor& rm0,
             const Tensor& rv0, bool training, bool channels_last, bool relu) {
  Tensor x = leaf(x0, d), w = leaf(w0, d), b = leaf(b0, d);
  Tensor rm = on(rm0, d).clone(), rv = on(rv0, d).clone();
  Tensor xin = x;
  if (channels_last) {  // same values, channels-last strides
    IntList to_cl{0}, from_cl{0, x0.dim() - 1};
    for (int64_t i = 2; i < x0.dim(); ++i) to_cl.push_back(i);
    to_cl.push_back(1);
    for (int64_t i = 1; i < x0.dim() - 1; ++i) from_cl.push_back(i);
    xin = x.permute(to_cl).contiguous().permute(from_cl);
    REQUIRE(!xin.is_contiguous());
  }
  Tensor y = relu ? F::batch_norm_relu(xin, rm, rv, w, b, training, 0.1, 1e-5)
                  : F::batch_norm(xin, rm, rv, w, b, training, 0.1, 1e-5);
  y.backward(on(g0, d));
  BnOut o;
  o.y = y.contiguous();
  o.dx = x.grad();
  o.dw = w.defined() ? w.grad() : Tensor();
  o.db = b.defined() ? b.grad() : Tensor();
  o.rm = rm;
  o.rv = rv;
  return o;
}

// Moves the inputs whose batch-norm output lies within 1e-3 of zero by 0.05, so that one-ulp
// differences between the backends cannot flip the fused ReLU's mask (a flip changes that element's
// dx by about |g|, far beyond any tolerance). Repeated because in training the shift moves the
// batch statistics a little.
Tensor off_relu_kink(Tensor x, const Tensor& w, const Tensor& b, const Tensor& rm, const Tensor& rv, bool training) {
  auto f64 = [](const Tensor& t) { return t.defined() ? t.to(DType::F64) : Tensor(); };
  for (int it = 0; it < 8; ++it) {
    Tensor z = F::batch_norm(x.to(DType::F64), f64(rm).clone(), f64(rv).clone(), f64(w), f64(b), training, 0.1, 1e-5);
    Tensor near = z.abs().lt(1e-3);
    if (near.to(DType::F64).sum().item<double>() == 0) break;
    Tensor x32 = x.to(DType::F32);
    x = kiln::where(near, x32 + 0.05, x32).to(x.dtype());
  }
  return x;
}

void check_bn(const IntList& sizes, DType dt, bool affine, bool training, bool channels_last, double center,
              bool relu = false) {
  const int64_t C = sizes[1];
  Tensor x = rnd(sizes, dt, center);
  Tensor g = rnd(sizes, dt);
  Tensor w = affine ? rnd({C}, dt, 1.0) : Tensor();
  Tensor b = affine ? rnd({C}, dt) : Tensor();
  Tensor rm = kiln::randn({C}) * 0.5 + center;
  Tensor rv = kiln::rand({C}) + 0.5;
  if (relu) x = off_relu_kink(x, w, b, rm, rv, training);
  BnOut c = run_bn(kiln::Device::cpu(), x, w, b, g, rm, rv, training, channels_last, relu);
  BnOut gg = run_bn(kGpu, x, w, b, g, rm, rv, training, channels_last, relu);
  const std::string what = std::string(relu ? "batch_norm_relu " : "batch_norm ") + (training ? "train " : "eval ") +
                           dname(dt) + (affine ? " affine" : "") + (channels_last ? " channels-last" : "") +
                           " center " + std::to_string(center);
  // With |mean| >> std, y = x * a + b cancels: a one-ulp difference in the f32 mean (the double
  // sums are added in another order) moves y by ~|mean| * 1e-7; widen atol accordingly.
  const double rt = rtol_of(dt), at = atol_of(dt) + std::abs(center) * 1e-6;
  require_close(gg.y, c.y, rt, at, what + " y");
  // dx sums M terms through the batch statistics: allow 10x the output tolerance.
  require_close(gg.dx, c.dx, 10 * rt, 10 * at, what + " dx");
  // dweight/dbias are sums of M products (magnitude ~sqrt(M)): relative tolerance dominates.
  require_close(gg.dw, c.dw, rt, 10 * at, what + " dweight");
  require_close(gg.db, c.db, rt, 10 * at, what + " dbias");
  require_close(gg.rm, c.rm, 1e-5, 1e-6, what + " running_mean");
  require_close(gg.rv, c.rv, 1e-5, 1e-6, what + " running_var");
}

// ----------------------------------------------------------------- row norms

struct RowOut {
  Tensor y, dx, dw, db;
};

RowOut run_row(kiln::Device d, const Tensor& x0, const Tensor& w0, const Tensor& b0, const Tensor& g0, bool rms) {
  Tensor x = leaf(x0, d), w = leaf(w0, d), b = leaf(b0, d);
  const IntList shape{x0.size(-1)};
  Tensor y = rms ? F::rms_norm(x, shape, w, 1e-6) : F::layer_norm(x, shape, w, b, 1e-5);
  y.backward(on(g0, d));
  return RowOut{y, x.grad(), w.defined() ? w.grad() : Tensor(), b.defined() ? b.grad() : Tensor()};
}

void check_row(int64_t R, int64_t K, DType dt, bool rms, bool with_w, bool with_b, double center) {
  Tensor x = rnd({R, K}, dt, center), g = rnd({R, K}, dt);
  Tensor w = with_w ? rnd({K}, dt, 1.0) : Tensor();
  Tensor b = with_b && !rms ? rnd({K}, dt) : Tensor();
  RowOut c = run_row(kiln::Device::cpu(), x, w, b, g, rms);
  RowOut gg = run_row(kGpu, x, w, b, g, rms);
  const std::string what = std::string(rms ? "rms_norm " : "layer_norm ") + dname(dt) + " R=" + std::to_string(R) +
                           " K=" + std::to_string(K) + (with_w ? " w" : "") + (b.defined() ? " b" : "") + " center " +
                           std::to_string(center);
  const double rt = rtol_of(dt), at = atol_of(dt) + std::abs(center) * 1e-6;  // see check_bn
  require_close(gg.y, c.y, rt, at, what + " y");
  require_close(gg.dx, c.dx, 10 * rt, 10 * at, what + " dx");
  require_close(gg.dw, c.dw, rt, 10 * at, what + " dweight");
  require_close(gg.db, c.db, rt, 10 * at, what + " dbias");
}

}  // namespace

TEST_CASE("batch norm forward and backward match the CPU", "[cuda][norm][batch_norm]") {
  kiln::manual_seed(40);
  const std::vector<IntList> shapes = {
      {4, 3, 7, 7},      // C = 3, S = 49: the [N, C, S] path with a partly filled warp per row
      {16, 5},           // [N, C]: the column path
      {1, 7, 3},         // N = 1, S = 3
      {2, 3, 4097},      // long planes
      {1023, 33},        // many rows on the column path (several row partials per channel)
      {64, 16, 32, 32},  // several partial blocks per channel on the planes path
  };
  for (const auto& sizes : shapes)
    for (DType dt : {DType::F32, DType::F64, DType::F16, DType::BF16})
      for (bool training : {true, false})
        for (bool affine : {true, false}) check_bn(sizes, dt, affine, training, false, 0.0);
  // |mean| >> std: the shifted sums must not cancel
  check_bn({8, 4, 5, 5}, DType::F32, true, true, false, 100.0);
  check_bn({257, 6}, DType::F32, true, true, false, -50.0);
  // channels-last input runs as [N*S, C] through the column path
  for (DType dt : {DType::F32, DType::F16})
    for (bool training : {true, false}) check_bn({3, 5, 4, 6}, dt, true, training, true, 0.0);
}

TEST_CASE("fused batch norm + ReLU forward and backward match the CPU", "[cuda][norm][batch_norm_relu]") {
  kiln::manual_seed(45);
  const std::vector<IntList> shapes = {
      {5, 3, 7, 9},      // odd sizes on the [N, C, S] path
      {17, 5},           // [N, C]: the column path
      {1, 7, 3},         // N = 1, S = 3
      {2, 3, 4097},      // long planes
      {1023, 33},        // several row partials per channel on the column path
      {64, 16, 32, 32},  // several partial blocks per channel on the planes path
  };
  for (const auto& sizes : shapes)
    for (DType dt : {DType::F32, DType::F16})
      for (bool training : {true, false})
        for (bool affine : {true, false}) check_bn(sizes, dt, affine, training, false, 0.0, true);
  check_bn({8, 4, 5, 5}, DType::F32, true, true, false, 100.0, true);  // |mean| >> std
  // channels-last input runs as [N*S, C] through the column path
  for (bool training : {true, false}) check_bn({3, 5, 4, 6}, DType::F32, true, training, true, 0.0, true);
}

// batch_norm_relu_max_pool2d: the CPU's fused kernel against the CUDA path (batch_norm_relu then
// max_pool2d), forward, gradients and running statistics. Inputs are moved off the ReLU kink as
// for the fused ReLU test; continuous random data leaves no near-ties inside a window.
TEST_CASE("fused batch norm + ReLU + max pool: the CPU kernel matches CUDA", "[cuda][norm][batch_norm_relu]") {
  kiln::manual_seed(46);
  for (const IntList& sizes : {IntList{4, 3, 6, 8}, IntList{2, 5, 9, 7}, IntList{16, 8, 28, 28}})
    for (bool training : {true, false}) {
      const int64_t C = sizes[1];
      Tensor w = rnd({C}, DType::F32, 1.0), b = rnd({C}, DType::F32);
      Tensor rm0 = kiln::randn({C}) * 0.5, rv0 = kiln::rand({C}) + 0.5;
      Tensor x0 = off_relu_kink(rnd(sizes, DType::F32), w, b, rm0, rv0, training);
      Tensor g0 = rnd({sizes[0], C, sizes[2] / 2, sizes[3] / 2}, DType::F32);
      BnOut r[2];
      for (int dev = 0; dev < 2; ++dev) {
        const kiln::Device d = dev ? kGpu : kiln::Device::cpu();
        Tensor x = leaf(x0, d), wd = leaf(w, d), bd = leaf(b, d);
        Tensor rm = on(rm0, d).clone(), rv = on(rv0, d).clone();
        Tensor y = F::batch_norm_relu_max_pool2d(x, rm, rv, wd, bd, training, 0.1, 1e-5);
        y.backward(on(g0, d));
        r[dev] = BnOut{y, x.grad(), wd.grad(), bd.grad(), rm, rv};
      }
      const std::string what = std::string("bn_relu_max_pool2d ") + (training ? "train " : "eval ") +
                               std::to_string(sizes[2]) + "x" + std::to_string(sizes[3]);
      const double rt = rtol_of(DType::F32), at = atol_of(DType::F32);
      require_close(r[1].y, r[0].y, rt, at, what + " y");
      require_close(r[1].dx, r[0].dx, 10 * rt, 10 * at, what + " dx");
      require_close(r[1].dw, r[0].dw, rt, 10 * at, what + " dweight");
      require_close(r[1].db, r[0].db, rt, 10 * at, what + " dbias");
      require_close(r[1].rm, r[0].rm, 1e-5, 1e-6, what + " running_mean");
      require_close(r[1].rv, r[0].rv, 1e-5, 1e-6, what + " running_var");
    }
}

// conv2d_batch_norm_relu_max_pool2d: the CPU's fused first-block kernel (conv output never
// written, statistics from patch moments) against the CUDA path (conv2d, then batch_norm_relu and
// max_pool2d), forward, the conv weight's and BatchNorm's gradients, running statistics.
TEST_CASE("fused conv + batch norm + ReLU + max pool: the CPU kernel matches CUDA", "[cuda][norm][conv]") {
  kiln::manual_seed(47);
  F::Conv2dParams p;
  p.padding = {1, 1};
  for (bool training : {true, false}) {
    const int64_t K = 32;
    Tensor x0 = rnd({16, 1, 28, 28}, DType::F32), cw0 = rnd({K, 1, 3, 3}, DType::F32);
    Tensor w = rnd({K}, DType::F32, 1.0), b = rnd({K}, DType::F32);
    Tensor rm0 = kiln::randn({K}) * 0.5, rv0 = kiln::rand({K}) + 0.5;
    Tensor g0 = rnd({16, K, 14, 14}, DType::F32);
    Tensor r[2][6];
    for (int dev = 0; dev < 2; ++dev) {
      const kiln::Device d = dev ? kGpu : kiln::Device::cpu();
      Tensor x = on(x0, d), cw = leaf(cw0, d), wd = leaf(w, d), bd = leaf(b, d);
      Tensor rm = on(rm0, d).clone(), rv = on(rv0, d).clone();
      Tensor y = F::conv2d_batch_norm_relu_max_pool2d(x, cw, Tensor(), p, rm, rv, wd, bd, training, 0.1, 1e-5);
      y.backward(on(g0, d));
      Tensor got[6] = {y, cw.grad(), wd.grad(), bd.grad(), rm, rv};
      for (int i = 0; i < 6; ++i) r[dev][i] = got[i];
    }
    const std::string what = std::string("conv_bn_relu_max_pool2d ") + (training ? "train" : "eval");
    const double rt = rtol_of(DType::F32), at = atol_of(DType::F32);
    require_close(r[1][0], r[0][0], 10 * rt, 10 * at, what + " y");
    require_close(r[1][1], r[0][1], 10 * rt, 10 * at, what + " conv weight grad");
    require_close(r[1][2], r[0][2], 10 * rt, 10 * at, what + " dweight");
    require_close(r[1][3], r[0][3], 10 * rt, 10 * at, what + " dbias");
    require_close(r[1][4], r[0][4], 1e-5, 1e-6, what + " running_mean");
    require_close(r[1][5], r[0][5], 1e-5, 1e-6, what + " running_var");
  }
}

// The same call with a 288-tap patch and an input that needs its gradient: on the CPU conv2d
// with BN's statistics in its epilogue and one node whose backward feeds the conv output's
// gradient to the conv's GEMMs sample by sample; on CUDA conv2d + batch_norm_relu + max_pool2d.
TEST_CASE("conv + batch norm + ReLU + max pool with a GEMM-fed backward: the CPU path matches CUDA",
          "[cuda][norm][conv]") {
  kiln::manual_seed(48);
  F::Conv2dParams p;
  p.padding = {1, 1};
  const int64_t K = 16;
  Tensor x0 = rnd({8, 32, 14, 14}, DType::F32), cw0 = rnd({K, 32, 3, 3}, DType::F32) * 0.1;
  Tensor w = rnd({K}, DType::F32, 1.0), b = rnd({K}, DType::F32);
  Tensor g0 = rnd({8, K, 7, 7}, DType::F32);
  Tensor r[2][7];
  for (int dev = 0; dev < 2; ++dev) {
    const kiln::Device d = dev ? kGpu : kiln::Device::cpu();
    Tensor x = leaf(x0, d), cw = leaf(cw0, d), wd = leaf(w, d), bd = leaf(b, d);
    Tensor rm = on(kiln::zeros({K}), d), rv = on(kiln::ones({K}), d);
    Tensor y = F::conv2d_batch_norm_relu_max_pool2d(x, cw, Tensor(), p, rm, rv, wd, bd, true, 0.1, 1e-5);
    y.backward(on(g0, d));
    Tensor got[7] = {y, x.grad(), cw.grad(), wd.grad(), bd.grad(), rm, rv};
    for (int i = 0; i < 7; ++i) r[dev][i] = got[i];
  }
  const double rt = rtol_of(DType::F32), at = atol_of(DType::F32);
  const char* what[7] = {"y", "input grad", "conv weight grad", "dweight", "dbias", "running_mean", "running_var"};
  for (int i = 0; i < 7; ++i)
    require_close(r[1][i], r[0][i], 10 * rt, 10 * at, std::string("gemm-fed block ") + what[i]);
}

TEST_CASE("batch norm statistics match the CPU", "[cuda][norm][batch_norm]") {
  kiln::manual_seed(41);
  for (const IntList& sizes : std::vector<IntList>{{4, 3, 7, 7}, {100, 9}, {2, 40, 3000}})
    for (DType dt : {DType::F32, DType::F64, DType::BF16}) {
      const int64_t C = sizes[1];
      Tensor x = rnd(sizes, dt, 3.0);
      const DType st = kiln::kernels::norm_stat_dtype(dt);
      auto run = [&](kiln::Device d) {
        Tensor xd = x.to(d), y = kiln::empty(sizes, kiln::TensorOptions().dtype(dt).device(d));
        Tensor m = kiln::empty({C}, kiln::TensorOptions().dtype(st).device(d));
        Tensor is = kiln::empty({C}, kiln::TensorOptions().dtype(st).device(d));
        Tensor v = kiln::empty({C}, kiln::TensorOptions().dtype(st).device(d));
        kiln::kernels::batch_norm_forward(y, xd, Tensor(), Tensor(), m, is, v, true, 1e-5, false);
        return std::vector<Tensor>{y, m, is, v};
      };
      auto c = run(kiln::Device::cpu());
      auto g = run(kGpu);
      const double r = dt == DType::F64 ? 1e-12 : 1e-6;
      require_close(g[1], c[1], r, r, "batch_norm mean " + dname(dt));
      require_close(g[2], c[2], r, r, "batch_norm invstd " + dname(dt));
      require_close(g[3], c[3], r, r, "batch_norm var " + dname(dt));
      require_close(g[0], c[0], rtol_of(dt), atol_of(dt), "batch_norm y " + dname(dt));
    }
}

TEST_CASE("batch norm backward with optional gradients left undefined", "[cuda][norm][batch_norm]") {
  kiln::manual_seed(42);
  const IntList sizes{6, 4, 5, 3};
  const int64_t C = 4;
  Tensor x = kiln::randn(sizes), g = kiln::randn(sizes), w = kiln::randn({C}) + 1.0, b = kiln::randn({C});
  Tensor mean = x.mean({0, 2, 3}), invstd = (x.var({0, 2, 3}, 0) + 1e-5).rsqrt();
  // (want dx, want dw, want db, training)
  const std::vector<std::tuple<bool, bool, bool, bool>> cases = {
      {true, false, false, true},  {false, true, false, true}, {false, false, true, true},
      {true, false, false, false}, {false, true, true, false}, {true, true, true, false}};
  for (auto [want_dx, want_dw, want_db, training] : cases)
    for (bool with_w : {true, false})
      for (bool relu : {false, true}) {
        auto run = [&](kiln::Device d) {
          auto mk = [&](bool want, const IntList& s) {
            return want ? kiln::full(s, 7.0, kiln::TensorOptions().device(d)) : Tensor();
          };
          Tensor dx = mk(want_dx, sizes), dw = mk(want_dw, {C}), db = mk(want_db, {C});
          kiln::kernels::batch_norm_backward(dx, dw, db, g.to(d), x.to(d), with_w ? w.to(d) : Tensor(), mean.to(d),
                                             invstd.to(d), training, relu, relu ? b.to(d) : Tensor());
          return std::vector<Tensor>{dx, dw, db};
        };
        auto c = run(kiln::Device::cpu());
        auto gg = run(kGpu);
        const std::string what = std::string(relu ? "batch_norm_relu_backward " : "batch_norm_backward ") +
                                 (training ? "train" : "eval") + (with_w ? " w" : "") +
                                 " dx/dw/db=" + std::to_string(want_dx) + std::to_string(want_dw) +
                                 std::to_string(want_db);
        for (int i = 0; i < 3; ++i) require_close(gg[i], c[i], 1e-4, 1e-5, what + " output " + std::to_string(i));
      }
}

TEST_CASE("layer norm and RMS norm forward and backward match the CPU", "[cuda][norm][layer_norm]") {
  kiln::manual_seed(43);
  // K <= 1024: one warp per row; above: one block per row.
  for (int64_t K : {1, 7, 33, 1023, 1024, 1025, 4097})
    for (int64_t R : {1, 5, 300})
      for (DType dt : {DType::F32, DType::F64, DType::F16, DType::BF16}) {
        if (K == 1 && dt != DType::F32) continue;
        for (bool rms : {false, true}) check_row(R, K, dt, rms, true, true, 0.0);
      }
  // optional weight / bias, and a large mean
  for (bool rms : {false, true}) {
    check_row(37, 515, DType::F32, rms, false, false, 0.0);
    check_row(37, 515, DType::F32, rms, true, false, 0.0);
    check_row(37, 2000, DType::F32, rms, false, true, 0.0);
    check_row(9, 700, DType::F32, rms, true, true, 50.0);
  }
  // many rows: several row partials per column in the weight-gradient reduction
  check_row(4099, 64, DType::F32, false, true, true, 0.0);
  check_row(3000, 768, DType::BF16, false, true, true, 0.0);
}

// A small subset for compute-sanitizer's racecheck (scripts/gpu-verdict.sh): each kernel shape
// that shares memory between warps (block-per-row layer norm, the batch-norm partial reductions)
// once, f32 and f64; racecheck over the whole group does not finish in a device window.
TEST_CASE("norm kernels, racecheck subset", "[cuda][norm][racecheck]") {
  kiln::manual_seed(44);
  check_row(5, 1025, DType::F32, false, true, true, 0.0);
  check_row(3, 2000, DType::F64, true, true, true, 0.0);
  check_bn({4, 3, 7, 7}, DType::F32, true, true, false, 0.0);
  check_bn({257, 6}, DType::F64, true, true, false, 0.0);
}

TEST_CASE("row norm statistics and optional gradients through the raw kernels", "[cuda][norm][layer_norm]") {
  kiln::manual_seed(44);
  for (bool rms : {false, true})
    for (int64_t K : {100, 3000}) {
      const int64_t R = 13;
      Tensor x = kiln::randn({R, K}) + 2.0, g = kiln::randn({R, K}), w = kiln::randn({K}), b = kiln::randn({K});
      auto fwd = [&](kiln::Device d) {
        auto o = kiln::TensorOptions().device(d);
        Tensor y = kiln::empty({R, K}, o), m = rms ? Tensor() : kiln::empty({R}, o), is = kiln::empty({R}, o);
        kiln::kernels::row_norm_forward(y, m, is, x.to(d), w.to(d), b.to(d), rms, 1e-5);
        return std::vector<Tensor>{y, m, is};
      };
      auto c = fwd(kiln::Device::cpu());
      auto gg = fwd(kGpu);
      const std::string what = std::string(rms ? "rms_norm" : "layer_norm") + " K=" + std::to_string(K);
      require_close(gg[0], c[0], 1e-5, 1e-5, what + " y");
      require_close(gg[1], c[1], 1e-6, 1e-6, what + " mean");
      require_close(gg[2], c[2], 1e-6, 1e-6, what + " invstd");
      // each gradient alone
      for (int which = 0; which < 3; ++which) {
        auto bwd = [&](kiln::Device d, const std::vector<Tensor>& st) {
          auto o = kiln::TensorOptions().device(d);
          Tensor dx = which == 0 ? kiln::empty({R, K}, o) : Tensor();
          Tensor dw = which == 1 ? kiln::empty({K}, o) : Tensor();
          Tensor db = which == 2 ? kiln::full({K}, 7.0, o) : Tensor();
          kiln::kernels::row_norm_backward(dx, dw, db, g.to(d), x.to(d), w.to(d), st[1], st[2], rms);
          return std::vector<Tensor>{dx, dw, db};
        };
        auto cb = bwd(kiln::Device::cpu(), c);
        auto gb = bwd(kGpu, gg);
        const std::string w2 = what + " gradient " + std::to_string(which);
        if (which == 2 && rms) {  // RMS norm has no bias: the buffer is left as it was
          require_close(gb[2], cb[2], 0, 0, w2 + " (untouched)");
          continue;
        }
        require_close(gb[which], cb[which], 1e-4, 1e-5, w2);
      }
    }
}

TEST_CASE("norm reductions are deterministic run to run", "[cuda][norm]") {
  kiln::manual_seed(45);
  Tensor x = kiln::randn({4096, 512}).to(kGpu), g = kiln::randn({4096, 512}).to(kGpu);
  Tensor w = kiln::randn({512}).to(kGpu), b = kiln::randn({512}).to(kGpu);
  auto ln_grads = [&] {
    Tensor wl = w.detach().requires_grad_(true), bl = b.detach().requires_grad_(true);
    F::layer_norm(x, {512}, wl, bl).backward(g);
    return std::vector<Tensor>{wl.grad().cpu(), bl.grad().cpu()};
  };
  auto a1 = ln_grads(), a2 = ln_grads();
  REQUIRE(kiln::equal(a1[0], a2[0]));
  REQUIRE(kiln::equal(a1[1], a2[1]));
  Tensor xb = kiln::randn({32, 64, 16, 16}).to(kGpu), gb = kiln::randn({32, 64, 16, 16}).to(kGpu);
  Tensor wb = kiln::randn({64}).to(kGpu);
  auto bn_grads = [&] {
    Tensor xl = xb.detach().requires_grad_(true), wl = wb.detach().requires_grad_(true);
    F::batch_norm(xl, Tensor(), Tensor(), wl, Tensor(), true).backward(gb);
    return std::vector<Tensor>{xl.grad().cpu(), wl.grad().cpu()};
  };
  auto b1 = bn_grads(), b2 = bn_grads();
  REQUIRE(kiln::equal(b1[0], b2[0]));
  REQUIRE(kiln::equal(b1[1], b2[1]));
}

TEST_CASE("dropout masks are bit-identical to the CPU's", "[cuda][norm][dropout]") {
  for (int64_t n : {1, 7, 1023, 4097, 1 << 20})
    for (double p : {0.1, 0.5, 0.9})
      for (DType dt : {DType::F32, DType::F64, DType::F16, DType::BF16}) {
        kiln::manual_seed(46);
        Tensor x = (kiln::rand({n}) + 0.5).to(dt);  // never zero: a zero in the output is a drop
        const uint64_t seed = 1234567, offset = 99 + static_cast<uint64_t>(n);
        Tensor yc = kiln::empty({n}, dt);
        Tensor yg = kiln::empty({n}, kiln::TensorOptions().dtype(dt).device(kGpu));
        kiln::kernels::dropout(yc, x, p, seed, offset);
        kiln::kernels::dropout(yg, x.to(kGpu), p, seed, offset);
        INFO("dropout n=" << n << " p=" << p << " " << dname(dt));
        Tensor ygc = yg.cpu();
        REQUIRE(kiln::equal(ygc == 0.0, yc == 0.0));  // same zeros
        REQUIRE(kiln::equal(ygc, yc));                // and the same kept values, bit for bit
      }
  // the functional op: same mask from the same generator state on both devices, and the
  // backward regenerates it
  kiln::manual_seed(47);
  Tensor x = kiln::rand({33, 129}) + 0.5, gout = kiln::rand({33, 129}) + 0.5;
  auto run = [&](kiln::Device d) {
    kiln::manual_seed(48);
    Tensor xl = x.to(d).detach().requires_grad_(true);
    Tensor y = F::dropout(xl, 0.3, true);
    y.backward(gout.to(d));
    return std::vector<Tensor>{y.cpu(), xl.grad().cpu()};
  };
  auto c = run(kiln::Device::cpu());
  auto g = run(kGpu);
  REQUIRE(kiln::equal(g[0], c[0]));
  REQUIRE(kiln::equal(g[1], c[1]));
  REQUIRE(kiln::equal(g[0] == 0.0, g[1] == 0.0));  // forward and backward drop the same elements
}

TEST_CASE("leaky ReLU forward and backward match the CPU", "[cuda][norm][leaky_relu]") {
  kiln::manual_seed(49);
  for (int64_t n : {1, 7, 1023, 4097})
    for (DType dt : {DType::F32, DType::F64, DType::F16, DType::BF16}) {
      Tensor x = kiln::randn({n}).to(dt), g = kiln::randn({n}).to(dt);
      auto run = [&](kiln::Device d) {
        Tensor xl = x.to(d).detach().requires_grad_(true);
        Tensor y = F::leaky_relu(xl, 0.2);
        y.backward(g.to(d));
        return std::vector<Tensor>{y, xl.grad()};
      };
      auto c = run(kiln::Device::cpu());
      auto gg = run(kGpu);
      // one multiply per element, rounded once: identical on both backends
      require_close(gg[0], c[0], 0, 0, "leaky_relu n=" + std::to_string(n) + " " + dname(dt));
      require_close(gg[1], c[1], 0, 0, "leaky_relu grad n=" + std::to_string(n) + " " + dname(dt));
    }
  // a non-contiguous input (the functional makes it contiguous for the kernel)
  Tensor x = kiln::randn({64, 48});
  require_close(F::leaky_relu(x.to(kGpu).t(), 0.01), F::leaky_relu(x.t(), 0.01), 0, 0, "leaky_relu transposed");
}

TEST_CASE("bad operands to the CUDA norm kernels are clear errors", "[cuda][norm]") {
  auto o = kiln::TensorOptions().device(kGpu);
  Tensor x = kiln::randn({4, 8}, o), y = kiln::empty({4, 8}, o), m = kiln::empty({4}, o), is = kiln::empty({4}, o);
  // weight of the wrong length
  REQUIRE_THROWS_AS(kiln::kernels::row_norm_forward(y, m, is, x, kiln::randn({7}, o), Tensor(), false, 1e-5),
                    kiln::Error);
  // non-contiguous input
  Tensor xt = kiln::randn({8, 4}, o).t();
  REQUIRE_THROWS_AS(kiln::kernels::row_norm_forward(y, m, is, xt, Tensor(), Tensor(), false, 1e-5), kiln::Error);
  // statistics in the wrong dtype
  Tensor m64 = kiln::empty({4}, kiln::TensorOptions().dtype(DType::F64).device(kGpu));
  REQUIRE_THROWS_AS(kiln::kernels::row_norm_forward(y, m64, is, x, Tensor(), Tensor(), false, 1e-5), kiln::Error);
  // batch norm: mean with the wrong number of channels
  Tensor xb = kiln::randn({2, 3, 5}, o), yb = kiln::empty({2, 3, 5}, o);
  REQUIRE_THROWS_AS(kiln::kernels::batch_norm_forward(yb, xb, Tensor(), Tensor(), kiln::empty({4}, o),
                                                      kiln::empty({3}, o), kiln::empty({3}, o), true, 1e-5, false),
                    kiln::Error);
  // fused BN + ReLU backward: a bias (for the mask) with the wrong number of channels
  REQUIRE_THROWS_AS(kiln::kernels::batch_norm_backward(kiln::empty({2, 3, 5}, o), Tensor(), Tensor(),
                                                       kiln::randn({2, 3, 5}, o), xb, Tensor(), kiln::zeros({3}, o),
                                                       kiln::ones({3}, o), true, true, kiln::randn({4}, o)),
                    kiln::Error);
  // dropout with p = 1 (the functional handles p = 1 itself)
  REQUIRE_THROWS_AS(kiln::kernels::dropout(y, x, 1.0, 1, 0), kiln::Error);
}
