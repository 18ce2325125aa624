// CUDA vs CPU parity for sin, cos, tril, triu, masked_fill, cumsum, cumprod, sort, argsort, topk
// and multinomial: odd sizes, non-contiguous views, NaN ordering, gradients.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <set>

#include <kiln/kiln.h>
#include "cuda_test_util.h"

using kiln::DType;
using kiln::Tensor;
using namespace kiln_cuda_test;

namespace {

void same(const Tensor& gpu, const Tensor& cpu, double rtol, double atol, const std::string& what) {
  INFO(describe(what, cpu));
  require_gpu_twin(gpu, cpu);
  // allclose treats NaN as never close: compare the NaN masks, then the rest with NaN set to 0
  Tensor g = gpu.cpu();
  if (kiln::is_floating(cpu.dtype())) {
    REQUIRE(kiln::equal(kiln::isnan(g), kiln::isnan(cpu)));
    g = kiln::where(kiln::isnan(g), kiln::zeros({}, g.options()), g);
    Tensor c = kiln::where(kiln::isnan(cpu), kiln::zeros({}, cpu.options()), cpu);
    REQUIRE(kiln::allclose(g, c, rtol, atol));
  } else {
    REQUIRE(kiln::equal(g, cpu));
  }
}
}  // namespace

TEST_CASE("model ops: sin, cos, tril, triu, masked_fill match the CPU", "[cuda][model_ops]") {
  kiln::manual_seed(3);
  for (int64_t n : {1, 7, 1023, 4097}) {
    Tensor x = kiln::randn({n}, DType::F32) * 4.0;
    same(x.to(kGpu).sin(), x.sin(), 1e-5, 1e-6, "sin");
    same(x.to(kGpu).cos(), x.cos(), 1e-5, 1e-6, "cos");
  }
  Tensor a = kiln::randn({3, 37, 29}, DType::F64).transpose(1, 2);
  for (int64_t d : {-3, 0, 2}) {
    same(a.to(kGpu).tril(d), a.tril(d), 0, 0, "tril");
    same(a.to(kGpu).triu(d), a.triu(d), 0, 0, "triu");
  }
  Tensor mask = kiln::rand({37, 1}, DType::F32) > 0.5;
  same(a.to(kGpu).masked_fill(mask.to(kGpu).transpose(0, 1), -INFINITY), a.masked_fill(mask.transpose(0, 1), -INFINITY),
       0, 0, "masked_fill");
  Tensor w = a.to(kGpu).detach().requires_grad_(true);
  w.masked_fill(mask.to(kGpu).transpose(0, 1), 0.0).tril().sum().backward();
  Tensor wc = a.detach().requires_grad_(true);
  wc.masked_fill(mask.transpose(0, 1), 0.0).tril().sum().backward();
  same(w.grad(), wc.grad(), 0, 0, "masked_fill + tril backward");
}

TEST_CASE("model ops: cumsum and cumprod match the CPU", "[cuda][model_ops]") {
  kiln::manual_seed(4);
  Tensor a = kiln::randn({5, 33, 7}, DType::F64);
  for (int64_t dim : {0, 1, 2}) {
    same(a.to(kGpu).cumsum(dim), a.cumsum(dim), 1e-12, 1e-12, "cumsum f64");
    Tensor p = a.transpose(0, 2) * 0.1 + 1.0;
    same(p.to(kGpu).cumprod(dim), p.cumprod(dim), 1e-12, 1e-12, "cumprod f64");
    Tensor f = a.to(DType::F32);
    same(f.to(kGpu).cumsum(dim), f.cumsum(dim), 1e-5, 1e-5, "cumsum f32");
  }
  Tensor i = kiln::randint(-5, 5, {4, 9});
  same(i.to(kGpu).cumsum(1), i.cumsum(1), 0, 0, "cumsum i64");
  Tensor z = a.clone();
  z.select(1, 3).zero_();
  Tensor zg = z.to(kGpu).requires_grad_(true), zc = z.clone().requires_grad_(true);
  (zg.cumprod(1) * zg.detach()).sum().backward();
  (zc.cumprod(1) * zc.detach()).sum().backward();
  same(zg.grad(), zc.grad(), 1e-10, 1e-10, "cumprod backward with zeros");
  Tensor s = a.to(kGpu).requires_grad_(true), sc = a.clone().requires_grad_(true);
  (s.cumsum(2) * s.detach()).sum().backward();
  (sc.cumsum(2) * sc.detach()).sum().backward();
  same(s.grad(), sc.grad(), 1e-12, 1e-12, "cumsum backward");
}

TEST_CASE("model ops: sort, argsort, topk match the CPU (stable, NaN largest)", "[cuda][model_ops]") {
  kiln::manual_seed(5);
  for (int64_t n : {1, 7, 300, 2049}) {
    // ties (small integers as floats) and NaNs, so stability and the NaN order are exercised
    Tensor a = kiln::randint(-4, 4, {3, n}).to(DType::F32);
    a = a.masked_fill(kiln::rand({3, n}) > 0.9, NAN);
    for (bool desc : {false, true}) {
      auto [gv, gi] = kiln::sort(a.to(kGpu), 1, desc);
      auto [cv, ci] = kiln::sort(a, 1, desc);
      same(gv, cv, 0, 0, "sort values");
      same(gi, ci, 0, 0, "sort indices");
      same(kiln::argsort(a.t().to(kGpu), 0, desc), kiln::argsort(a.t(), 0, desc), 0, 0, "argsort dim 0, transposed");
    }
    const int64_t k = std::min<int64_t>(n, 5);
    auto [tv, ti] = kiln::topk(a.to(kGpu), k);
    auto [uv, ui] = kiln::topk(a, k);
    same(tv, uv, 0, 0, "topk values");
    same(ti, ui, 0, 0, "topk indices");
  }
  Tensor i = kiln::randint(-100, 100, {4, 33, 5});
  for (int64_t dim : {0, 1, 2}) {
    auto [gv, gi] = kiln::sort(i.to(kGpu), dim);
    auto [cv, ci] = kiln::sort(i, dim);
    same(gv, cv, 0, 0, "sort i64");
    same(gi, ci, 0, 0, "sort i64 indices");
  }
  Tensor x = kiln::randn({6, 11}, DType::F64);
  Tensor xg = x.to(kGpu).requires_grad_(true), xc = x.clone().requires_grad_(true);
  (std::get<0>(kiln::topk(xg, 4, 1, false)) * 3.0).sum().backward();
  (std::get<0>(kiln::topk(xc, 4, 1, false)) * 3.0).sum().backward();
  same(xg.grad(), xc.grad(), 0, 0, "topk backward");
}

TEST_CASE("model ops: multinomial on the GPU (host sampling, same draws as the CPU)", "[cuda][model_ops]") {
  Tensor w = kiln::rand({4, 10}, DType::F32) + 0.01;
  kiln::Generator g1(9), g2(9);
  Tensor a = kiln::multinomial(w.to(kGpu), 6, false, &g1);
  Tensor b = kiln::multinomial(w, 6, false, &g2);
  REQUIRE(a.device() == kGpu);
  REQUIRE(kiln::equal(a.cpu(), b));
  CHECK_THROWS_AS(kiln::multinomial(kiln::zeros({3}, kGpu), 1), kiln::Error);
}
