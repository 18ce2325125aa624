// The fused softmax + cross-entropy (kiln/kernels/cross_entropy.h) behind kiln::cross_entropy:
// the shared per-row math (online max/sum merging, the row loss), the raw kernels, the op against
// a composite of kiln ops (log_softmax + gather + mean) for every dtype, reduction, ignore_index
// and label smoothing, f64 gradchecks (first and second order), autocast, and the CPU's error on
// an out-of-range target.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <kiln/kiln.h>
#include "kiln/kernels/cross_entropy.h"
#include "tests/test_util.h"

using namespace kiln_test;

namespace {

namespace xent = kiln::kernels::xent;

Tensor labels(const std::vector<int64_t>& t) { return kiln::tensor(t); }

// The unfused formula on [N, C] logits, in kiln ops: per-row (1-e)*nll + e*mean(-logp), ignored
// rows 0, Mean over the non-ignored rows.
Tensor composite_ce(const Tensor& x, const Tensor& t, int64_t ignore_index, double e, Reduction r) {
  Tensor logp = kiln::log_softmax(x, 1);
  Tensor ti = t.to(DType::I64);
  Tensor valid = ti != static_cast<double>(ignore_index);
  Tensor safe = kiln::where(valid, ti, kiln::zeros({}, ti.options()));
  Tensor nll = -kiln::gather(logp, 1, safe.unsqueeze(1)).squeeze(1);
  Tensor smooth = -kiln::sum(logp, {1}, false) / static_cast<double>(x.size(1));
  Tensor validf = valid.to(x.dtype());
  Tensor per = (nll * (1.0 - e) + smooth * e) * validf;
  if (r == Reduction::None) return per;
  if (r == Reduction::Sum) return per.sum();
  return per.sum() / validf.sum();
}

// Random labels in [0, C) with every `every`-th one replaced by ignore_index.
Tensor random_labels(int64_t N, int64_t C, int64_t every, int64_t ignore_index) {
  Tensor t = kiln::randint(0, C, {N});
  std::vector<int64_t> v(N);
  for (int64_t i = 0; i < N; ++i) v[i] = (every > 0 && i % every == every - 1) ? ignore_index : t[i].item<int64_t>();
  return kiln::tensor(v);
}

}  // namespace

// ---------------------------------------------------------------- shared per-row math

TEST_CASE("xent math: online max/sum merging matches the two-pass logsumexp", "[xent]") {
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<std::vector<double>> rows = {
      {0.5, -1.0, 3.0, 2.5, -7.0, 0.0, 1.25},
      {-1000.0, 1000.0, 0.0},
      {-inf, 2.0, -inf, 1.0},  // masked entries add nothing
      {4.0},
  };
  for (const auto& x : rows) {
    double m = -inf;
    for (double v : x) m = std::max(m, v);
    double s = 0;
    for (double v : x) s += std::exp(v - m);
    // one accumulator
    xent::MaxSum<double> a = xent::maxsum_init<double>();
    for (double v : x) xent::maxsum_push(a, v);
    CHECK(a.max == m);
    CHECK(a.sum == Approx(s).epsilon(1e-14));
    // every split into two halves, merged both ways (what the warp/block reductions do)
    for (size_t cut = 0; cut <= x.size(); ++cut) {
      xent::MaxSum<double> l = xent::maxsum_init<double>(), r = xent::maxsum_init<double>();
      for (size_t i = 0; i < cut; ++i) xent::maxsum_push(l, x[i]);
      for (size_t i = cut; i < x.size(); ++i) xent::maxsum_push(r, x[i]);
      xent::MaxSum<double> lr = xent::maxsum_merge(l, r), rl = xent::maxsum_merge(r, l);
      CHECK(lr.max == m);
      CHECK(lr.sum == Approx(s).epsilon(1e-14));
      CHECK(rl.sum == lr.sum);
    }
  }
  // an all -inf row stays (max -inf, sum 0); a NaN makes the sum NaN
  xent::MaxSum<float> a = xent::maxsum_init<float>();
  xent::maxsum_push(a, -std::numeric_limits<float>::infinity());
  CHECK(a.sum == 0.0f);
  xent::maxsum_push(a, 1.0f);
  xent::maxsum_push(a, std::nanf(""));
  CHECK(std::isnan(a.sum));
  CHECK(std::isnan(xent::maxsum_merge(xent::maxsum_init<float>(), a).sum));
  // floats: the fast exp keeps the pair within a few ulp
  xent::MaxSum<float> f = xent::maxsum_init<float>();
  for (double v : rows[0]) xent::maxsum_push(f, static_cast<float>(v));
  double s0 = 0;
  for (double v : rows[0]) s0 += std::exp(v - 3.0);
  CHECK(f.sum == Approx(s0).epsilon(1e-6));
}

TEST_CASE("xent math: row loss and gradient element", "[xent]") {
  // logits [0, ln 3], target 1: p = 3/4, lse = ln 4
  const double l3 = std::log(3.0);
  xent::RowLoss<double> r = xent::row_loss(l3, 1.0 + 1.0 / 3.0, l3, l3, 2, 0.0);
  CHECK(r.lse == Approx(std::log(4.0)).epsilon(1e-15));
  CHECK(r.loss == Approx(-std::log(0.75)).epsilon(1e-15));
  // smoothing e: (1-e)(lse - x_t) + e(lse - mean x)
  const double e = 0.3;
  r = xent::row_loss(l3, 1.0 + 1.0 / 3.0, l3, l3, 2, e);
  CHECK(r.loss == Approx((1 - e) * (std::log(4.0) - l3) + e * (std::log(4.0) - l3 / 2)).epsilon(1e-15));
  // gradient: softmax - q, times g
  CHECK(xent::grad_elem(l3, std::log(4.0), 1.0, 2.0) == Approx(2.0 * (0.75 - 1.0)).epsilon(1e-15));
  CHECK(xent::grad_elem(0.0, std::log(4.0), 0.0, 2.0) == Approx(2.0 * 0.25).epsilon(1e-15));
  CHECK(xent::q_other(0.2, 4) == Approx(0.05));
  CHECK(xent::target_kind(3, 4, -100) == xent::kClass);
  CHECK(xent::target_kind(-100, 4, -100) == xent::kIgnored);
  CHECK(xent::target_kind(4, 4, -100) == xent::kOutOfRange);
  CHECK(xent::target_kind(-1, 4, -100) == xent::kOutOfRange);
}

// ---------------------------------------------------------------- raw kernels

TEST_CASE("xent kernels: forward writes loss and lse, backward the fused gradient", "[xent]") {
  kiln::manual_seed(300);
  const int64_t R = 9, C = 13;
  Tensor x = kiln::randn({R, C}, f64()) * 3.0;
  Tensor t = random_labels(R, C, 4, -100);
  Tensor loss = kiln::empty({R}, f64()), lse = kiln::empty({R}, f64());
  kiln::kernels::cross_entropy_forward(loss, lse, x, t, -100, 0.1);
  Tensor want_lse = (x - x.amax({1}, true)).exp().sum({1}).log() + x.amax({1});
  check_close(lse, values(want_lse), 1e-14, 1e-14, "lse");
  check_close(loss, values(composite_ce(x, t, -100, 0.1, Reduction::None)), 1e-13, 1e-13, "loss");
  // per-row gradient g_r
  Tensor g = kiln::randn({R}, f64());
  Tensor dx = kiln::empty({R, C}, f64());
  kiln::kernels::cross_entropy_backward(dx, g, x, lse, t, -100, 0.1);
  Tensor xg = x.detach().requires_grad_(true);
  composite_ce(xg, t, -100, 0.1, Reduction::None).backward(g);
  check_close(dx, values(xg.grad()), 1e-13, 1e-14, "dx per-row g");
  // one g for every row (a device scalar in the op)
  Tensor g1 = kiln::full({1}, 0.5, f64());
  kiln::kernels::cross_entropy_backward(dx, g1, x, lse, t, -100, 0.1);
  xg.set_grad(Tensor());
  (composite_ce(xg, t, -100, 0.1, Reduction::Sum) * 0.5).backward();
  check_close(dx, values(xg.grad()), 1e-13, 1e-14, "dx shared g");
  // bad operands are errors, not crashes
  Tensor l32 = kiln::empty({R});
  REQUIRE_THROWS_AS(kiln::kernels::cross_entropy_forward(l32, lse, x, t, -100, 0.0), kiln::Error);
  REQUIRE_THROWS_AS(kiln::kernels::cross_entropy_forward(loss, lse, x.t(), t, -100, 0.0), kiln::Error);
  REQUIRE_THROWS_AS(kiln::kernels::cross_entropy_forward(loss, lse, x, t.to(DType::F32), -100, 0.0), kiln::Error);
  REQUIRE_THROWS_AS(kiln::kernels::cross_entropy_backward(dx, kiln::empty({3}, f64()), x, lse, t, -100, 0.0),
                    kiln::Error);
}

// ---------------------------------------------------------------- the op against the composite

TEST_CASE("cross_entropy (fused): matches the composite for every dtype, reduction, smoothing", "[xent]") {
  kiln::manual_seed(301);
  for (int64_t C : {1, 7, 100, 1000}) {
    const int64_t N = 37;
    Tensor x64 = kiln::randn({N, C}, f64()) * 3.0;
    Tensor t = random_labels(N, C, 5, -100);
    for (DType dt : {DType::F64, DType::F32, DType::F16, DType::BF16}) {
      // f32 math on both sides; the composite rounds log-probs to the 16-bit dtype, the fused
      // kernel only the final loss
      const double tol = dt == DType::F64 ? 1e-12 : dt == DType::F32 ? 2e-5 : dt == DType::F16 ? 4e-3 : 3e-2;
      Tensor x = x64.to(dt);
      for (double e : {0.0, 0.1}) {
        for (Reduction r : {Reduction::None, Reduction::Sum, Reduction::Mean}) {
          INFO("C " << C << " dtype " << kiln::dtype_name(dt) << " smoothing " << e << " reduction "
                    << static_cast<int>(r));
          Tensor got = kiln::cross_entropy(x, t, -100, e, r);
          CHECK(got.dtype() == dt);
          // reference in f64 on the same (rounded) logits
          Tensor want = composite_ce(x.to(DType::F64), t, -100, e, r);
          CHECK(got.sizes() == want.sizes());
          check_close_rel(got, values(want), tol * (r == Reduction::Sum ? 4 : 1));
        }
      }
    }
  }
}

TEST_CASE("cross_entropy (fused): gradients match the composite, ignored rows get zero", "[xent]") {
  kiln::manual_seed(302);
  for (int64_t C : {1, 5, 1000, 50257}) {
    const int64_t N = C > 10000 ? 6 : 33;
    for (DType dt : {DType::F64, DType::F32, DType::BF16}) {
      if (C > 10000 && dt != DType::F32) continue;  // the GPT-2 vocabulary once is enough here
      const double tol = dt == DType::F64 ? 1e-12 : dt == DType::F32 ? 1e-5 : 2e-2;
      Tensor x0 = (kiln::randn({N, C}) * 2.0).to(dt);
      Tensor t = random_labels(N, C, 3, -100);
      for (double e : {0.0, 0.2}) {
        for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
          INFO("C " << C << " dtype " << kiln::dtype_name(dt) << " smoothing " << e << " reduction "
                    << static_cast<int>(r));
          Tensor xf = x0.detach().requires_grad_(true);
          Tensor lf = kiln::cross_entropy(xf, t, -100, e, r);
          Tensor gout = r == Reduction::None ? kiln::randn({N}).to(lf.dtype())
                                             : kiln::full({}, 1.5, kiln::TensorOptions().dtype(lf.dtype()));
          lf.backward(gout);
          REQUIRE(xf.grad().dtype() == dt);
          Tensor xc = x0.to(DType::F64).detach().requires_grad_(true);
          composite_ce(xc, t, -100, e, r).backward(gout.to(DType::F64));
          // gradients are O(1/N): compare against the largest one
          auto want = values(xc.grad());
          double scale = 0;
          for (double v : want) scale = std::max(scale, std::abs(v));
          check_close(xf.grad(), want, tol, tol * scale, "dx");
          auto got = values(xf.grad());
          for (int64_t i = 0; i < N; ++i)
            if (t[i].item<int64_t>() == -100)
              for (int64_t c = 0; c < C; c += std::max<int64_t>(1, C / 7)) CHECK(got[i * C + c] == 0.0);
        }
      }
    }
  }
}

TEST_CASE("cross_entropy (fused): layouts [N,C,d...], [C], non-contiguous, int32 targets", "[xent]") {
  kiln::manual_seed(303);
  // [N, C, d1, d2] with smoothing and an ignore_index that is a real class
  Tensor x = kiln::randn({3, 5, 2, 3}, f64());
  Tensor t = kiln::randint(0, 5, {3, 2, 3});
  Tensor rows = x.permute({0, 2, 3, 1}).reshape({-1, 5});
  for (Reduction r : {Reduction::None, Reduction::Sum, Reduction::Mean}) {
    Tensor got = kiln::cross_entropy(x, t, 2, 0.15, r);
    Tensor want = composite_ce(rows, t.reshape({-1}), 2, 0.15, r);
    if (r == Reduction::None) {
      CHECK(got.sizes() == IntList{3, 2, 3});
      want = want.reshape({3, 2, 3});
    }
    check_close(got, values(want), 1e-12, 1e-13);
  }
  // unbatched [C] with a 0-dim target
  Tensor v = kiln::randn({6}, f64());
  Tensor t0 = kiln::scalar_tensor(4.0, DType::I64);
  Tensor l0 = kiln::cross_entropy(v, t0, -100, 0.0, Reduction::None);
  CHECK(l0.dim() == 0);
  CHECK(l0.item<double>() == Approx(-kiln::log_softmax(v, 0)[4].item<double>()).epsilon(1e-14));
  // non-contiguous logits and int32 targets
  Tensor xt = kiln::randn({7, 4}, f64());
  Tensor t32 = kiln::tensor(std::vector<int32_t>{0, 3, 1, 1});
  CHECK(kiln::cross_entropy(xt.t(), t32, -100, 0.05).item<double>() ==
        Approx(composite_ce(xt.t().contiguous(), t32, -100, 0.05, Reduction::Mean).item<double>()).epsilon(1e-13));
  // masked (-inf) logits stay finite without smoothing
  Tensor m = kiln::tensor({0.0, -INFINITY, 1.0, -INFINITY}, f64()).view({1, 4});
  const double lm = kiln::cross_entropy(m, labels({2})).item<double>();
  CHECK(lm == Approx(std::log(1.0 + std::exp(-1.0))).epsilon(1e-14));
  // all rows ignored: mean is NaN (0/0), sum 0, and the gradient is zero
  Tensor xa = kiln::randn({3, 4}, f64(true));
  CHECK(std::isnan(kiln::cross_entropy(xa, labels({-100, -100, -100})).item<double>()));
  Tensor ls = kiln::cross_entropy(xa, labels({-100, -100, -100}), -100, 0.0, Reduction::Sum);
  CHECK(ls.item<double>() == 0.0);
  ls.backward();
  for (double g : values(xa.grad())) CHECK(g == 0.0);
}

TEST_CASE("cross_entropy (fused): f64 gradchecks with ignore_index and label smoothing", "[xent][gradcheck]") {
  kiln::manual_seed(304);
  Tensor x = kiln::randn({6, 5}, f64(true));
  Tensor t = labels({4, -100, 0, 2, -100, 1});
  for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    for (double e : {0.0, 0.1, 1.0}) {
      INFO("reduction " << static_cast<int>(r) << " smoothing " << e);
      CHECK(kiln::gradcheck([t, r, e](const TL& in) { return kiln::cross_entropy(in[0], t, -100, e, r); }, {x}));
    }
  }
  // ignore_index = a class, int32 targets, [N, C, d]
  Tensor t32 = kiln::tensor(std::vector<int32_t>{4, 1, 0, 2, 1, 1});
  CHECK(kiln::gradcheck([t32](const TL& in) { return kiln::cross_entropy(in[0], t32, 1, 0.3); }, {x}));
  Tensor x3 = kiln::randn({2, 4, 3}, f64(true));
  Tensor t3 = kiln::tensor(std::vector<int64_t>{0, 3, -100, 1, 2, 2}).view({2, 3});
  CHECK(
      kiln::gradcheck([t3](const TL& in) { return kiln::cross_entropy(in[0], t3, -100, 0.2, Reduction::None); }, {x3}));
}

TEST_CASE("cross_entropy (fused): second derivatives through create_graph", "[xent][gradcheck]") {
  kiln::manual_seed(305);
  Tensor x = kiln::randn({4, 5}, f64(true));
  Tensor t = labels({1, -100, 4, 0});
  for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    for (double e : {0.0, 0.25}) {
      INFO("reduction " << static_cast<int>(r) << " smoothing " << e);
      CHECK(kiln::gradcheck(
          [t, r, e](const TL& in) {
            kiln::EnableGradGuard eg;
            Tensor l = kiln::cross_entropy(in[0], t, -100, e, r);
            if (r == Reduction::None) l = (l * kiln::arange(4, f64())).sum();  // non-uniform weights
            Tensor w = kiln::arange(20, f64()).view({4, 5});
            Tensor g = kiln::autograd::grad({l}, {in[0]}, {}, true, true)[0];
            return (g * w).sum();
          },
          {x}));
    }
  }
  // the create_graph first derivative equals the fused one
  Tensor xa = x.detach().requires_grad_(true);
  Tensor g1;
  {
    kiln::EnableGradGuard eg;
    g1 = kiln::autograd::grad({kiln::cross_entropy(xa, t, -100, 0.1)}, {xa}, {}, false, true)[0];
  }
  Tensor g2 = kiln::autograd::grad({kiln::cross_entropy(xa, t, -100, 0.1)}, {xa})[0];
  check_close(g1, values(g2), 1e-14, 1e-15, "create_graph vs fused");
}

TEST_CASE("cross_entropy (fused): autocast reads 16-bit logits and returns f32", "[xent][amp]") {
  kiln::manual_seed(306);
  Tensor x = (kiln::randn({8, 11}) * 2.0).to(DType::BF16).requires_grad_(true);
  Tensor t = random_labels(8, 11, 3, -100);
  Tensor l;
  {
    kiln::amp::Autocast ac(DType::BF16);
    l = kiln::cross_entropy(x, t, -100, 0.1);
  }
  CHECK(l.dtype() == DType::F32);
  Tensor want = composite_ce(x.detach().to(DType::F64), t, -100, 0.1, Reduction::Mean);
  CHECK(l.item<double>() == Approx(want.item<double>()).epsilon(1e-5));
  l.backward();
  REQUIRE(x.grad().dtype() == DType::BF16);
  Tensor xc = x.detach().to(DType::F64).requires_grad_(true);
  composite_ce(xc, t, -100, 0.1, Reduction::Mean).backward();
  check_close(x.grad(), values(xc.grad()), 1e-2, 1e-3, "bf16 grad");
}

TEST_CASE("cross_entropy (fused): an out-of-range target is a clear error on the CPU", "[xent][errors]") {
  Tensor x = kiln::randn({3, 4});
  for (int64_t bad : {4, -1, 100}) {
    INFO("target " << bad);
    try {
      kiln::cross_entropy(x, labels({0, bad, 2}));
      FAIL("no error");
    } catch (const kiln::Error& err) {
      const std::string msg = err.what();
      CHECK(msg.find("cross_entropy") != std::string::npos);
      CHECK(msg.find("target " + std::to_string(bad) + " at position 1") != std::string::npos);
      CHECK(msg.find("4 classes") != std::string::npos);
    }
  }
  // ignore_index itself may be out of range
  CHECK(std::isfinite(kiln::cross_entropy(x, labels({0, 7, 2}), 7).item<double>()));
  REQUIRE_THROWS_AS(kiln::cross_entropy(x, labels({0, 1})), kiln::Error);                    // size mismatch
  REQUIRE_THROWS_AS(kiln::cross_entropy(x, labels({0, 1, 2}).to(DType::F32)), kiln::Error);  // float target
}
