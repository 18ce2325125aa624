// Fused batch norm and layer norm (kiln/kernels/cpu/norm.cpp) against the composite of kiln ops
// (mean, var, sub, div, mul, add) on the same data, forward and forward+backward; and the fused
// BatchNorm + ReLU (F::batch_norm_relu) against the fused batch_norm followed by kiln::relu, the
// unfused pair the Fashion-MNIST CNN ran before (one ReLU pass forward, one backward).
// Sizes: BatchNorm2d on [128, 32, 28, 28] (the Fashion-MNIST CNN's first conv output at batch
// 128) and LayerNorm on [4096, 768] (a transformer's activations). GB/s counts the minimal
// traffic: forward reads x and writes y; backward reads g and x and writes dx.
// And the CNN's two conv blocks (conv + BN + ReLU + pool, F::conv2d_batch_norm_relu_max_pool2d)
// against conv2d + batch_norm_relu_max_pool2d.
// Each fused result is validated against the composite one (exit 1 on a mismatch).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include <kiln/kiln.h>
#include <kiln/nn/functional.h>
#include <kiln/nn/fused/conv_block.h>

#include "../bench_util.h"

namespace {

namespace F = kiln::nn::functional;
using namespace kiln::bench;  // max_rel_err, the composites
using kiln::IntList;
using kiln::Tensor;

void row(const char* name, double fused, double composite, double bytes) {
  std::printf("%-48s fused %8.3f ms %7.2f GB/s | composite %8.3f ms %7.2f GB/s | %5.2fx\n", name, fused * 1e3,
              bytes / fused / 1e9, composite * 1e3, bytes / composite / 1e9, composite / fused);
}

template <class Fused, class Comp>
void run(const char* name, const Tensor& x0, const Tensor& w0, const Tensor& b0, Fused fused, Comp comp) {
  const double nbytes = static_cast<double>(x0.nbytes());
  // forward, no graph
  Tensor yf, yc;
  {
    kiln::NoGradGuard ng;
    yf = fused(x0, w0, b0);
    yc = comp(x0, w0, b0);
    double e = max_rel_err(yf, yc);
    kiln::bench::validate(e < 1e-4, name, e);
    double tf = kiln::bench::time_median([&] { yf = fused(x0, w0, b0); });
    double tc = kiln::bench::time_median([&] { yc = comp(x0, w0, b0); });
    std::string n = std::string(name) + " forward";
    row(n.c_str(), tf, tc, 2 * nbytes);
  }
  // forward + backward
  Tensor x = x0.detach().requires_grad_(), w = w0.detach().requires_grad_(), b = b0.detach().requires_grad_();
  Tensor g;
  {
    kiln::NoGradGuard ng;
    g = kiln::randn(fused(x0, w0, b0).sizes());  // pooled ops have a smaller output
  }
  auto step = [&](auto f) {
    x.set_grad(Tensor());
    w.set_grad(Tensor());
    b.set_grad(Tensor());
    f(x, w, b).backward(g);
  };
  step(fused);
  Tensor dxf = x.grad(), dwf = w.grad();
  step(comp);
  double e = std::max(max_rel_err(dxf, x.grad()), max_rel_err(dwf, w.grad()) / 100.0);
  std::string vn = std::string(name) + " backward";
  kiln::bench::validate(e < 1e-4, vn.c_str(), e);
  double tf = kiln::bench::time_median([&] { step(fused); });
  double tc = kiln::bench::time_median([&] { step(comp); });
  std::string n = std::string(name) + " forward+backward";
  row(n.c_str(), tf, tc, 5 * nbytes);
}

// run() on random data: x of sizes xs with an offset mean, as activations have, and w, b with one
// value per entry of dimension 1 (the channels of [N, C, H, W], the features of [rows, features]).
template <class Fused, class Comp> void run_random(const char* name, const IntList& xs, Fused fused, Comp comp) {
  Tensor x = kiln::randn(xs) * 2.0 + 0.5;
  Tensor w = kiln::randn({xs[1]}), b = kiln::randn({xs[1]});
  run(name, x, w, b, fused, comp);
}

// The CNN's conv blocks, conv 3x3 + BN + ReLU + 2x2 max pool: conv2d_batch_norm_relu_max_pool2d
// against conv2d followed by batch_norm_relu_max_pool2d, the pair the CNN ran before.
// First block, [128, 1, 28, 28] -> 32: the small-patch kernel (the conv output never written; the
// input is images and needs no gradient). Second block, [128, 32, 14, 14] -> 64 with an input that
// needs its gradient: conv with BN's statistics in its epilogue and the GEMM-fed backward.
// Outputs and all gradients are validated against each other.
void run_conv_block(const char* name, const IntList& xs, int64_t K, bool x_grad) {
  F::Conv2dParams p;
  p.padding = {1, 1};
  const double eps = 1e-5;
  Tensor x = kiln::randn(xs) * 0.35 + 0.29;  // Fashion-MNIST-like pixel statistics
  if (x_grad) x.requires_grad_();
  Tensor cw0 = kiln::randn({K, xs[1], 3, 3}) * (0.3 / std::sqrt(static_cast<double>(xs[1])));
  Tensor w0 = kiln::rand({K}) + 0.5, b0 = kiln::randn({K}) * 0.1;
  Tensor cw = cw0.detach().requires_grad_(), w = w0.detach().requires_grad_(), b = b0.detach().requires_grad_();
  auto fused = [&] {
    return F::conv2d_batch_norm_relu_max_pool2d(x, cw, Tensor(), p, Tensor(), Tensor(), w, b, true, 0.1, eps);
  };
  auto comp = [&] {
    return F::batch_norm_relu_max_pool2d(F::conv2d(x, cw, Tensor(), p), Tensor(), Tensor(), w, b, true, 0.1, eps);
  };
  {
    kiln::NoGradGuard ng;
    const double e = max_rel_err(fused(), comp());
    kiln::bench::validate(e < 1e-4, name, e);
    const double tf = kiln::bench::time_median([&] { fused(); });
    const double tc = kiln::bench::time_median([&] { comp(); });
    std::printf("%-48s fused %8.3f ms | conv2d + bn_relu_max_pool2d %8.3f ms | %5.2fx\n",
                (std::string(name) + " forward").c_str(), tf * 1e3, tc * 1e3, tc / tf);
  }
  Tensor g = kiln::randn({xs[0], K, xs[2] / 2, xs[3] / 2});
  auto step = [&](auto f) {
    for (Tensor* t : {&x, &cw, &w, &b}) t->set_grad(Tensor());
    f().backward(g);
  };
  step(fused);
  Tensor dx = x_grad ? x.grad() : Tensor(), dcw = cw.grad(), dw = w.grad(), db = b.grad();
  step(comp);
  double e = std::max({max_rel_err(dcw, cw.grad()), max_rel_err(dw, w.grad()), max_rel_err(db, b.grad())});
  if (x_grad) e = std::max(e, max_rel_err(dx, x.grad()));
  kiln::bench::validate(e < 1e-3, "conv block gradients", e);
  const double tf = kiln::bench::time_median([&] { step(fused); });
  const double tc = kiln::bench::time_median([&] { step(comp); });
  std::printf("%-48s fused %8.3f ms | conv2d + bn_relu_max_pool2d %8.3f ms | %5.2fx\n",
              (std::string(name) + " forward+backward").c_str(), tf * 1e3, tc * 1e3, tc / tf);
}

}  // namespace

int main() {
  kiln::manual_seed(0);
  std::printf("threads: %d (float32)\n", omp_get_max_threads());
  const double eps = 1e-5;
  run_random(
      "batch_norm [128,32,28,28]", {128, 32, 28, 28},
      [&](const Tensor& a, const Tensor& ww, const Tensor& bb) {
        return F::batch_norm(a, Tensor(), Tensor(), ww, bb, true, 0.1, eps);
      },
      [&](const Tensor& a, const Tensor& ww, const Tensor& bb) { return bn_composite(a, ww, bb, eps); });
  run_random(
      "batch_norm_relu [128,32,28,28]", {128, 32, 28, 28},
      [&](const Tensor& a, const Tensor& ww, const Tensor& bb) {
        return F::batch_norm_relu(a, Tensor(), Tensor(), ww, bb, true, 0.1, eps);
      },
      [&](const Tensor& a, const Tensor& ww, const Tensor& bb) {
        return kiln::relu(F::batch_norm(a, Tensor(), Tensor(), ww, bb, true, 0.1, eps));
      });
  // The CNN's conv-block tails: BN -> ReLU -> 2x2 max pool in one kernel, against the fused
  // BN + ReLU followed by max_pool2d.
  for (auto sz : {IntList{128, 32, 28, 28}, IntList{128, 64, 14, 14}}) {
    std::string name = "bn_relu_max_pool2d [128," + std::to_string(sz[1]) + "," + std::to_string(sz[2]) + "," +
                       std::to_string(sz[3]) + "]";
    run_random(
        name.c_str(), sz,
        [&](const Tensor& a, const Tensor& ww, const Tensor& bb) {
          return F::batch_norm_relu_max_pool2d(a, Tensor(), Tensor(), ww, bb, true, 0.1, eps);
        },
        [&](const Tensor& a, const Tensor& ww, const Tensor& bb) {
          return F::max_pool2d(F::batch_norm_relu(a, Tensor(), Tensor(), ww, bb, true, 0.1, eps), 2);
        });
  }
  run_conv_block("conv1+bn+relu+pool [128,1,28,28]->32", {128, 1, 28, 28}, 32, false);
  run_conv_block("conv2+bn+relu+pool [128,32,14,14]->64", {128, 32, 14, 14}, 64, true);
  run_random(
      "layer_norm [4096,768]", {4096, 768},
      [&](const Tensor& a, const Tensor& ww, const Tensor& bb) { return F::layer_norm(a, {768}, ww, bb, eps); },
      [&](const Tensor& a, const Tensor& ww, const Tensor& bb) { return ln_composite(a, ww, bb, eps); });
  return 0;
}
