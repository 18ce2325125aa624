// The fused cross-entropy kernels on the GPU against the CPU kernels (which tests/core/test_xent.cpp
// checks against the composite formula and by gradcheck): odd class counts (1, 7, 1000 rows get
// a warp each; 50257 rows a block), f32/f64/f16/bf16 logits read natively, rows that start at any
// alignment, non-contiguous and [N, C, d] inputs, int32 targets, every reduction with
// ignore_index and label smoothing, and the NaN (not a host sync) for an out-of-range target.
//
// Tolerances: f32/f64 differ only by summation order and CUDA's expf vs the CPU's fast exp
// (a few ulp): rtol 2e-5 / 1e-12. 16-bit logits: both sides compute in f32 from the same
// values; the f32 loss may round to a neighbouring 16-bit value and so may each dx element:
// rtol 2e-3 (f16), 1.6e-2 (bf16), plus an absolute 1e-3 (f16) / 8e-3 (bf16) of the largest
// element for the smallest ones.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <kiln/kiln.h>
#include "kiln/kernels/cross_entropy.h"
#include "cuda_test_util.h"

using kiln::DType;
using kiln::Reduction;
using kiln::Tensor;
using namespace kiln_cuda_test;

namespace {

// The logits' dtypes: f64, f32, f16, bf16.
double rtol_of(DType dt) { return per_dtype(dt, 1e-12, 2e-5, 2e-3, 1.6e-2); }
double atol_of(DType dt) { return per_dtype(dt, 1e-14, 1e-7, 1e-3, 8e-3); }

bool all_true(const Tensor& b) { return b.numel() == 0 || b.to(DType::F64).min().item<double>() == 1.0; }

// GPU result close to the CPU one: |g - c| <= atol * max|c| + rtol * |c| elementwise.
void require_close(const Tensor& gpu, const Tensor& cpu, DType dt, const std::string& what) {
  INFO(what << " sizes " << kiln::detail::concat(cpu.sizes()) << " dtype " << kiln::dtype_name(dt));
  require_gpu_twin(gpu, cpu);
  Tensor c = cpu.to(DType::F64), g = gpu.cpu().to(DType::F64);
  REQUIRE(all_true(kiln::isfinite(g)));
  const double scale = c.numel() ? c.abs().max().item<double>() : 0.0;
  const double err = c.numel() ? ((g - c).abs() - c.abs() * rtol_of(dt)).max().item<double>() : 0.0;
  INFO("worst |gpu - cpu| - rtol |cpu| = " << err << ", allowed " << atol_of(dt) * std::max(scale, 1e-30));
  REQUIRE(err <= atol_of(dt) * std::max(scale, 1e-30));
}

// Labels in [0, C) with every third one ignore_index (so the mean divides by ~2/3 of the rows).
Tensor some_labels(int64_t R, int64_t C, int64_t ignore_index) {
  Tensor t = kiln::randint(0, C, {R}).to(DType::I64).contiguous();
  int64_t* p = t.data_ptr<int64_t>();
  for (int64_t i = 2; i < R; i += 3) p[i] = ignore_index;
  return t;
}

// Loss and input gradient of cross_entropy on x (any device) with upstream gradient gout.
std::pair<Tensor, Tensor> loss_and_grad(const Tensor& x0, const Tensor& t, double e, Reduction r, const Tensor& gout) {
  Tensor x = x0.detach().requires_grad_(true);
  Tensor l = kiln::cross_entropy(x, t, -100, e, r);
  l.backward(gout.to(x0.device(), l.dtype()));
  return {l.detach(), x.grad()};
}

}  // namespace

TEST_CASE("cuda xent: loss and gradient match the CPU (odd C, every dtype and reduction)", "[cuda][xent]") {
  kiln::manual_seed(400);
  for (int64_t C : {1, 7, 1000, 50257}) {
    const int64_t R = C > 10000 ? 9 : 37;
    Tensor base = kiln::randn({R, C}) * 3.0;
    Tensor t = some_labels(R, C, -100);
    for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::F64}) {
      Tensor x = base.to(dt);
      for (double e : {0.0, 0.1}) {
        for (Reduction r : {Reduction::None, Reduction::Sum, Reduction::Mean}) {
          const std::string what = "C " + std::to_string(C) + " e " + std::to_string(e) + " reduction " +
                                   std::to_string(static_cast<int>(r));
          Tensor gout = r == Reduction::None ? kiln::randn({R}) : kiln::full({}, 0.75);
          auto [lc, gc] = loss_and_grad(x, t, e, r, gout);
          auto [lg, gg] = loss_and_grad(x.to(kGpu), t.to(kGpu), e, r, gout);
          require_close(lg, lc, dt, "loss " + what);
          require_close(gg, gc, dt, "dx " + what);
        }
      }
    }
  }
}

TEST_CASE("cuda xent: raw kernels, lse, rows at every alignment, int32 targets", "[cuda][xent]") {
  kiln::manual_seed(401);
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    for (int64_t C : {7, 1000, 2053}) {
      const int64_t R = 11;
      // offset 1..3 elements into a buffer: the rows start off any 16-byte boundary
      for (int64_t off : {0, 1, 3}) {
        INFO("dtype " << kiln::dtype_name(dt) << " C " << C << " offset " << off);
        Tensor buf = (kiln::randn({R * C + off}) * 2.0).to(dt);
        Tensor x = buf.narrow(0, off, R * C).view({R, C});
        Tensor t = kiln::randint(0, C, {R}).to(DType::I32);
        const DType sd = kiln::kernels::xent_stat_dtype(dt);
        auto run = [&](const Tensor& xx, const Tensor& tt) {
          Tensor loss = kiln::empty({R}, kiln::TensorOptions().dtype(sd).device(xx.device()));
          Tensor lse = kiln::empty({R}, kiln::TensorOptions().dtype(sd).device(xx.device()));
          kiln::kernels::cross_entropy_forward(loss, lse, xx, tt, -100, 0.05);
          Tensor g = kiln::full({R}, 0.5, kiln::TensorOptions().dtype(sd)).to(xx.device());
          // dx also at an offset, aligned differently from x when off != 0
          Tensor dbuf = kiln::empty({R * C + 2}, kiln::TensorOptions().dtype(dt).device(xx.device()));
          Tensor dx = dbuf.narrow(0, 2, R * C).view({R, C});
          kiln::kernels::cross_entropy_backward(dx, g, xx, lse, tt, -100, 0.05);
          return std::vector<Tensor>{loss, lse, dx};
        };
        auto c = run(x, t);
        auto g = run(x.to(kGpu), t.to(kGpu));
        require_close(g[0], c[0], DType::F32, "loss");
        require_close(g[1], c[1], DType::F32, "lse");
        require_close(g[2], c[2], dt, "dx");
      }
    }
  }
}

TEST_CASE("cuda xent: non-contiguous, [N,C,d] and unbatched inputs; autocast", "[cuda][xent]") {
  kiln::manual_seed(402);
  Tensor xt = kiln::randn({1000, 24});  // used transposed: [24, 1000]
  Tensor t = some_labels(24, 1000, -100);
  for (Reduction r : {Reduction::Mean, Reduction::None}) {
    Tensor gout = r == Reduction::None ? kiln::randn({24}) : kiln::full({}, 1.0);
    auto [lc, gc] = loss_and_grad(xt.t(), t, 0.2, r, gout);
    Tensor xg = xt.to(kGpu).detach().requires_grad_(true);
    Tensor lg = kiln::cross_entropy(xg.t(), t.to(kGpu), -100, 0.2, r);
    lg.backward(gout.to(kGpu));
    require_close(lg.detach(), lc, DType::F32, "transposed loss");
    require_close(xg.grad().t(), gc, DType::F32, "transposed dx");
  }
  // [N, C, d1, d2]
  Tensor x4 = kiln::randn({3, 9, 5, 2});
  Tensor t4 = kiln::randint(0, 9, {3, 5, 2});
  Tensor gout4 = kiln::randn({3, 5, 2});
  auto [l4c2, g4c2] = loss_and_grad(x4, t4, 0.1, Reduction::None, gout4);
  auto [l4g, g4g] = loss_and_grad(x4.to(kGpu), t4.to(kGpu), 0.1, Reduction::None, gout4);
  require_close(l4g, l4c2, DType::F32, "[N,C,d1,d2] loss");
  require_close(g4g, g4c2, DType::F32, "[N,C,d1,d2] dx");
  // unbatched [C]
  Tensor v = kiln::randn({50257});
  Tensor t0 = kiln::scalar_tensor(123.0, DType::I64);
  require_close(kiln::cross_entropy(v.to(kGpu), t0.to(kGpu)), kiln::cross_entropy(v, t0), DType::F32, "[C]");
  // autocast: f16 logits read natively, f32 loss, f16 gradient
  Tensor xh = (kiln::randn({64, 1000}) * 2.0).to(DType::F16);
  Tensor th = some_labels(64, 1000, -100);
  auto under_autocast = [&](const Tensor& x0, const Tensor& tt) {
    Tensor x = x0.detach().requires_grad_(true);
    Tensor l;
    {
      kiln::amp::Autocast ac(DType::F16);
      l = kiln::cross_entropy(x, tt, -100, 0.1);
    }
    l.backward();
    return std::pair<Tensor, Tensor>{l.detach(), x.grad()};
  };
  auto [lac, gac] = under_autocast(xh, th);
  auto [lag, gag] = under_autocast(xh.to(kGpu), th.to(kGpu));
  REQUIRE(lag.dtype() == DType::F32);
  REQUIRE(gag.dtype() == DType::F16);
  require_close(lag, lac, DType::F32, "autocast loss");
  require_close(gag, gac, DType::F16, "autocast dx");
}

TEST_CASE("cuda xent: an out-of-range target gives NaN for its row, without a sync or an error", "[cuda][xent]") {
  kiln::manual_seed(403);
  for (int64_t C : {10, 5000}) {  // warp and block kernels
    INFO("C " << C);
    Tensor x = kiln::randn({4, C}).to(kGpu);
    Tensor t = kiln::tensor(std::vector<int64_t>{1, C, -100, -5}).to(kGpu);
    Tensor none = kiln::cross_entropy(x, t, -100, 0.0, Reduction::None).cpu();
    CHECK(std::isfinite(none[0].item<double>()));
    CHECK(std::isnan(none[1].item<double>()));
    CHECK(none[2].item<double>() == 0.0);
    CHECK(std::isnan(none[3].item<double>()));
    CHECK(std::isnan(kiln::cross_entropy(x, t).item<double>()));  // the mean is NaN too
    Tensor xg = x.detach().requires_grad_(true);
    kiln::cross_entropy(xg, t, -100, 0.0, Reduction::Sum).backward();
    Tensor g = xg.grad().cpu();
    CHECK(all_true(kiln::isfinite(g[0])));
    CHECK(all_true(kiln::isnan(g[1])));
    CHECK(all_true(g[2] == 0.0));
    CHECK(all_true(kiln::isnan(g[3])));
  }
}
