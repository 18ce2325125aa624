// softmax / log_softmax along any dim and the losses built on them (cross_entropy with
// ignore_index, label smoothing and every reduction; nll_loss; mse_loss), against references
// computed here; gradchecks; error paths.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <kiln/kiln.h>
#include "tests/test_util.h"

using namespace kiln_test;

namespace {

// Reference (log-)softmax of row-major data with shape `sizes` along `dim`, in double.
std::vector<double> ref_softmax(const std::vector<double>& x, const IntList& sizes, int64_t dim, bool log) {
  int64_t outer = 1, inner = 1, n = sizes[dim];
  for (int64_t d = 0; d < dim; ++d) outer *= sizes[d];
  for (int64_t d = dim + 1; d < static_cast<int64_t>(sizes.size()); ++d) inner *= sizes[d];
  std::vector<double> y(x.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t j) { return (o * n + j) * inner + i; };
      double m = -INFINITY;
      for (int64_t j = 0; j < n; ++j) m = std::max(m, x[at(j)]);
      double s = 0;
      for (int64_t j = 0; j < n; ++j) s += std::exp(x[at(j)] - m);
      for (int64_t j = 0; j < n; ++j) y[at(j)] = log ? x[at(j)] - m - std::log(s) : std::exp(x[at(j)] - m) / s;
    }
  return y;
}

// Per-row log-softmax of [N, C] data.
std::vector<std::vector<double>> ref_logp_rows(const std::vector<double>& x, int64_t N, int64_t C) {
  auto lp = ref_softmax(x, {N, C}, 1, true);
  std::vector<std::vector<double>> rows(N);
  for (int64_t i = 0; i < N; ++i) rows[i].assign(lp.begin() + i * C, lp.begin() + (i + 1) * C);
  return rows;
}

// PyTorch's cross_entropy with class-index targets on [N, C] logits:
// per_i = (1-e) * (-logp_i[t_i]) + e * mean_c(-logp_i[c]); ignored rows are 0;
// Mean divides by the number of non-ignored rows.
struct CE {
  std::vector<double> per;
  double sum = 0;
  double mean = 0;
};
CE ref_cross_entropy(const std::vector<double>& x, const std::vector<int64_t>& t, int64_t N, int64_t C,
                     int64_t ignore_index, double eps) {
  auto lp = ref_logp_rows(x, N, C);
  CE r;
  int64_t valid = 0;
  for (int64_t i = 0; i < N; ++i) {
    if (t[i] == ignore_index) {
      r.per.push_back(0.0);
      continue;
    }
    ++valid;
    double nll = -lp[i][t[i]];
    double smooth = 0;
    for (int64_t c = 0; c < C; ++c) smooth += -lp[i][c];
    smooth /= static_cast<double>(C);
    double l = (1 - eps) * nll + eps * smooth;
    r.per.push_back(l);
    r.sum += l;
  }
  r.mean = r.sum / static_cast<double>(valid);
  return r;
}

Tensor targets(const std::vector<int64_t>& t) { return kiln::tensor(t); }

}  // namespace

// ---------------------------------------------------------------- softmax / log_softmax

TEST_CASE("softmax: softmax and log_softmax along every dim match the reference", "[softmax]") {
  kiln::manual_seed(61);
  const IntList sizes{3, 4, 5};
  for (DType dt : {DType::F64, DType::F32}) {
    INFO("dtype " << kiln::dtype_name(dt));
    const double tol = dt == DType::F64 ? 1e-13 : 2e-6;
    Tensor x = kiln::randn(sizes, dt) * 3.0;
    auto xv = values(x);
    for (int64_t dim : {0, 1, 2, -1, -2, -3}) {
      INFO("dim " << dim);
      const int64_t d = dim < 0 ? dim + 3 : dim;
      Tensor s = kiln::softmax(x, dim);
      Tensor l = kiln::log_softmax(x, dim);
      CHECK(s.sizes() == sizes);
      CHECK(s.dtype() == dt);
      check_close(s, ref_softmax(xv, sizes, d, false), tol, tol, "softmax");
      check_close(l, ref_softmax(xv, sizes, d, true), tol, tol, "log_softmax");
      check_close(x.softmax(dim), values(s), 0, 0, "method softmax");
      check_close(x.log_softmax(dim), values(l), 0, 0, "method log_softmax");
      // rows sum to one
      check_close(s.sum({dim}), std::vector<double>(s.numel() / sizes[d], 1.0), tol, tol, "sums to 1");
    }
  }
}

TEST_CASE("softmax: large logits stay finite and -inf entries get probability 0", "[softmax]") {
  for (DType dt : {DType::F64, DType::F32}) {
    INFO("dtype " << kiln::dtype_name(dt));
    Tensor x = kiln::tensor({1000.0, 1001.0, 999.0, -1000.0, -1001.0, -999.0}, dt).view({2, 3});
    auto s = values(kiln::softmax(x, 1));
    auto l = values(kiln::log_softmax(x, 1));
    for (double v : s) CHECK(std::isfinite(v));
    for (double v : l) CHECK(std::isfinite(v));
    auto want_s = ref_softmax({1000.0, 1001.0, 999.0, -1000.0, -1001.0, -999.0}, {2, 3}, 1, false);
    auto want_l = ref_softmax({1000.0, 1001.0, 999.0, -1000.0, -1001.0, -999.0}, {2, 3}, 1, true);
    check_close(s, want_s, 1e-6, 1e-7, "softmax 1000");
    // (x - max) - log(sum) keeps f32 accuracy near 1000; x - (max + log(sum)) loses ~ulp(1000)
    check_close(l, want_l, 1e-6, 2e-6, "log_softmax 1000");
    // along dim 0 (the transposed path) too
    auto s0 = values(kiln::softmax(x, 0));
    for (double v : s0) CHECK(std::isfinite(v));
    check_close(s0, ref_softmax({1000.0, 1001.0, 999.0, -1000.0, -1001.0, -999.0}, {2, 3}, 0, false), 1e-6, 1e-30,
                "softmax dim 0");
  }
  Tensor m = kiln::tensor({0.0, -INFINITY, 1.0}, f64());
  auto s = values(kiln::softmax(m, 0));
  CHECK(s[1] == 0.0);
  CHECK(s[0] == Approx(1.0 / (1.0 + std::exp(1.0))).epsilon(1e-14));
  CHECK(values(kiln::log_softmax(m, 0))[1] == -INFINITY);
}

TEST_CASE("softmax: non-contiguous inputs, 0-dim, empty and 16-bit", "[softmax]") {
  kiln::manual_seed(62);
  Tensor base = kiln::randn({5, 4}, f64());
  Tensor tr = base.t();  // [4,5]
  auto tv = values(tr);
  check_close(kiln::softmax(tr, 1), ref_softmax(tv, {4, 5}, 1, false), 1e-13, 1e-13, "transposed dim 1");
  check_close(kiln::log_softmax(tr, 0), ref_softmax(tv, {4, 5}, 0, true), 1e-13, 1e-13, "transposed dim 0");
  Tensor sl = kiln::randn({4, 9}, f64()).slice(1, 0, 9, 2);  // [4,5]
  check_close(kiln::softmax(sl, -1), ref_softmax(values(sl), {4, 5}, 1, false), 1e-13, 1e-13, "strided");
  // 0-dim: softmax is 1, log_softmax 0
  CHECK(kiln::softmax(kiln::scalar_tensor(3.0, f64()), 0).item<double>() == 1.0);
  CHECK(kiln::log_softmax(kiln::scalar_tensor(3.0, f64()), -1).item<double>() == 0.0);
  // empty
  CHECK(kiln::softmax(kiln::zeros({0, 3}), 1).sizes() == IntList{0, 3});
  // f16 / bf16: computed in float, result rounded (rel 2e-3 / 1e-2)
  Tensor x = kiln::randn({3, 7}) * 2.0;
  for (DType dt : {DType::F16, DType::BF16}) {
    INFO("dtype " << kiln::dtype_name(dt));
    Tensor xh = x.to(dt);
    auto xv = values(xh);
    const double rtol = dt == DType::F16 ? 2e-3 : 1e-2;
    check_close(kiln::softmax(xh, 1), ref_softmax(xv, {3, 7}, 1, false), rtol, rtol * 0.1, "softmax");
    check_close(kiln::log_softmax(xh, 1), ref_softmax(xv, {3, 7}, 1, true), rtol, rtol, "log_softmax");
    CHECK(kiln::softmax(xh, 1).dtype() == dt);
  }
}

TEST_CASE("softmax: gradchecks along every dim", "[softmax][gradcheck]") {
  kiln::manual_seed(63);
  Tensor x = kiln::randn({2, 3, 4}, f64(true));
  for (int64_t dim : {0, 1, 2, -1}) {
    INFO("dim " << dim);
    CHECK(kiln::gradcheck([dim](const TL& in) { return kiln::softmax(in[0], dim); }, {x}));
    CHECK(kiln::gradcheck([dim](const TL& in) { return kiln::log_softmax(in[0], dim); }, {x}));
  }
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::softmax(in[0].transpose(0, 2), 1); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::log_softmax(in[0] * 50.0, 2); }, {x}));
  // second order (create_graph path)
  Tensor y = kiln::randn({2, 3}, f64(true));
  for (int64_t dim : {0, 1}) {
    for (bool log : {false, true}) {
      INFO("dim " << dim << " log " << log);
      CHECK(kiln::gradcheck(
          [dim, log](const TL& in) {
            kiln::EnableGradGuard eg;
            Tensor w = kiln::arange(6, f64()).view({2, 3});  // non-uniform weights
            Tensor o = log ? kiln::log_softmax(in[0], dim) : kiln::softmax(in[0], dim);
            return kiln::autograd::grad({(o * w).sum()}, {in[0]}, {}, true, true)[0];
          },
          {y}));
    }
  }
}

TEST_CASE("softmax: integer input is an error; bad dim is an error", "[softmax][errors]") {
  REQUIRE_THROWS_AS(kiln::softmax(kiln::arange(4, DType::I64), 0), kiln::Error);
  REQUIRE_THROWS_AS(kiln::log_softmax(kiln::arange(4, DType::I64), 0), kiln::Error);
  REQUIRE_THROWS_AS(kiln::softmax(kiln::randn({2, 3}), 2), kiln::Error);
  REQUIRE_THROWS_AS(kiln::log_softmax(kiln::randn({2, 3}), -3), kiln::Error);
}

// ---------------------------------------------------------------- cross_entropy

TEST_CASE("cross_entropy: [N,C] matches the hand computation for every reduction", "[loss]") {
  kiln::manual_seed(64);
  const int64_t N = 6, C = 5;
  for (DType dt : {DType::F64, DType::F32}) {
    INFO("dtype " << kiln::dtype_name(dt));
    const double tol = dt == DType::F64 ? 1e-12 : 1e-5;
    Tensor x = kiln::randn({N, C}, dt) * 2.0;
    std::vector<int64_t> t{0, 4, 2, 2, 1, 3};
    auto ref = ref_cross_entropy(values(x), t, N, C, -100, 0.0);
    Tensor mean = kiln::cross_entropy(x, targets(t));
    CHECK(mean.dim() == 0);
    CHECK(mean.dtype() == dt);
    CHECK(mean.item<double>() == Approx(ref.mean).epsilon(tol));
    CHECK(kiln::cross_entropy(x, targets(t), -100, 0.0, Reduction::Sum).item<double>() == Approx(ref.sum).epsilon(tol));
    Tensor none = kiln::cross_entropy(x, targets(t), -100, 0.0, Reduction::None);
    CHECK(none.sizes() == IntList{N});
    check_close(none, ref.per, tol, tol, "none");
    // int32 targets work the same
    Tensor t32 = kiln::tensor(std::vector<int32_t>{0, 4, 2, 2, 1, 3});
    CHECK(kiln::cross_entropy(x, t32).item<double>() == Approx(ref.mean).epsilon(tol));
  }
  // a hand-worked case: logits [0, ln 3] with target 1: p = 3/4, loss = -ln(3/4)
  Tensor h = kiln::tensor({0.0, std::log(3.0)}, f64()).view({1, 2});
  CHECK(kiln::cross_entropy(h, targets({1})).item<double>() == Approx(-std::log(0.75)).epsilon(1e-14));
  // large logits stay finite
  Tensor big = kiln::tensor({1000.0, 0.0, -1000.0}).view({1, 3});
  double l = kiln::cross_entropy(big, targets({1})).item<double>();
  CHECK(std::isfinite(l));
  CHECK(l == Approx(1000.0).epsilon(1e-6));
}

TEST_CASE("cross_entropy: ignore_index excludes rows and the mean divides by the rest", "[loss]") {
  kiln::manual_seed(65);
  const int64_t N = 6, C = 4;
  Tensor x = kiln::randn({N, C}, f64());
  auto xv = values(x);
  {
    INFO("default ignore_index -100");
    std::vector<int64_t> t{1, -100, 3, -100, 0, 2};
    auto ref = ref_cross_entropy(xv, t, N, C, -100, 0.0);
    CHECK(kiln::cross_entropy(x, targets(t)).item<double>() == Approx(ref.mean).epsilon(1e-12));
    CHECK(kiln::cross_entropy(x, targets(t), -100, 0.0, Reduction::Sum).item<double>() ==
          Approx(ref.sum).epsilon(1e-12));
    check_close(kiln::cross_entropy(x, targets(t), -100, 0.0, Reduction::None), ref.per, 1e-12, 1e-12);
    // the mean is over 4 rows, not 6
    CHECK(ref.mean == Approx(ref.sum / 4.0));
  }
  {
    INFO("ignore_index = 2, a real class");
    std::vector<int64_t> t{2, 1, 2, 3, 0, 2};
    auto ref = ref_cross_entropy(xv, t, N, C, 2, 0.0);
    CHECK(kiln::cross_entropy(x, targets(t), 2).item<double>() == Approx(ref.mean).epsilon(1e-12));
    check_close(kiln::cross_entropy(x, targets(t), 2, 0.0, Reduction::None), ref.per, 1e-12, 1e-12);
  }
  {
    INFO("ignored rows get no gradient");
    Tensor xg = x.detach().clone();
    xg.requires_grad_(true);
    kiln::cross_entropy(xg, targets({1, -100, 3, -100, 0, 2})).backward();
    auto g = values(xg.grad());
    for (int64_t c = 0; c < C; ++c) {
      CHECK(g[1 * C + c] == 0.0);
      CHECK(g[3 * C + c] == 0.0);
    }
    // non-ignored rows: (softmax - onehot) / 4
    auto p = ref_softmax(xv, {N, C}, 1, false);
    CHECK(g[0 * C + 1] == Approx((p[0 * C + 1] - 1.0) / 4.0).epsilon(1e-12));
    CHECK(g[0 * C + 0] == Approx(p[0 * C + 0] / 4.0).epsilon(1e-12));
  }
  {
    INFO("all rows ignored: mean is NaN (0/0), sum is 0");
    std::vector<int64_t> t(N, -100);
    CHECK(std::isnan(kiln::cross_entropy(x, targets(t)).item<double>()));
    CHECK(kiln::cross_entropy(x, targets(t), -100, 0.0, Reduction::Sum).item<double>() == 0.0);
  }
}

TEST_CASE("cross_entropy: label smoothing follows PyTorch's formula", "[loss]") {
  kiln::manual_seed(66);
  const int64_t N = 5, C = 4;
  Tensor x = kiln::randn({N, C}, f64()) * 2.0;
  auto xv = values(x);
  for (double e : {0.1, 0.3, 1.0}) {
    INFO("label_smoothing " << e);
    for (int64_t ign : {int64_t{-100}, int64_t{3}}) {
      INFO("ignore_index " << ign);
      std::vector<int64_t> t{0, 3, 1, 3, 2};
      auto ref = ref_cross_entropy(xv, t, N, C, ign, e);
      CHECK(kiln::cross_entropy(x, targets(t), ign, e).item<double>() == Approx(ref.mean).epsilon(1e-12));
      CHECK(kiln::cross_entropy(x, targets(t), ign, e, Reduction::Sum).item<double>() ==
            Approx(ref.sum).epsilon(1e-12));
      check_close(kiln::cross_entropy(x, targets(t), ign, e, Reduction::None), ref.per, 1e-12, 1e-12);
    }
  }
  // uniform logits: every -logp is ln C, so the loss is ln C whatever the smoothing
  Tensor u = kiln::zeros({2, C}, f64());
  CHECK(kiln::cross_entropy(u, targets({0, 1}), -100, 0.25).item<double>() ==
        Approx(std::log(static_cast<double>(C))).epsilon(1e-14));
  // out-of-range smoothing
  REQUIRE_THROWS_AS(kiln::cross_entropy(x, targets({0, 1, 2, 3, 0}), -100, -0.1), kiln::Error);
  REQUIRE_THROWS_AS(kiln::cross_entropy(x, targets({0, 1, 2, 3, 0}), -100, 1.5), kiln::Error);
}

TEST_CASE("cross_entropy: [N,C,d] input and unbatched [C] input", "[loss]") {
  kiln::manual_seed(67);
  const int64_t N = 2, C = 3, D = 4;
  Tensor x = kiln::randn({N, C, D}, f64());
  auto xv = values(x);
  std::vector<int64_t> t{0, 2, 1, -100, 2, 2, 0, 1};  // [N, D]
  // move classes last by hand: rows[n*D+d][c] = x[n][c][d]
  std::vector<double> rows(N * D * C);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t d = 0; d < D; ++d) rows[(n * D + d) * C + c] = xv[(n * C + c) * D + d];
  for (double e : {0.0, 0.2}) {
    INFO("label_smoothing " << e);
    auto ref = ref_cross_entropy(rows, t, N * D, C, -100, e);
    Tensor tt = targets(t).view({N, D});
    CHECK(kiln::cross_entropy(x, tt, -100, e).item<double>() == Approx(ref.mean).epsilon(1e-12));
    CHECK(kiln::cross_entropy(x, tt, -100, e, Reduction::Sum).item<double>() == Approx(ref.sum).epsilon(1e-12));
    Tensor none = kiln::cross_entropy(x, tt, -100, e, Reduction::None);
    CHECK(none.sizes() == IntList{N, D});
    check_close(none, ref.per, 1e-12, 1e-12, "none [N,d]");
  }
  // [N, C, d1, d2]
  Tensor x4 = kiln::randn({2, 3, 2, 2}, f64());
  Tensor t4 = kiln::tensor(std::vector<int64_t>{0, 1, 2, 0, 2, 2, 1, 0}).view({2, 2, 2});
  Tensor none4 = kiln::cross_entropy(x4, t4, -100, 0.0, Reduction::None);
  CHECK(none4.sizes() == IntList{2, 2, 2});
  CHECK(kiln::cross_entropy(x4, t4).item<double>() == Approx(values(none4.mean())[0]).epsilon(1e-12));
  // unbatched: [C] logits with a 0-dim target
  Tensor v = kiln::tensor({0.5, -1.0, 2.0}, f64());
  Tensor t0 = kiln::scalar_tensor(2.0, DType::I64);
  auto lp = ref_softmax({0.5, -1.0, 2.0}, {3}, 0, true);
  CHECK(kiln::cross_entropy(v, t0).item<double>() == Approx(-lp[2]).epsilon(1e-14));
  CHECK(kiln::cross_entropy(v, t0, -100, 0.0, Reduction::None).dim() == 0);
}

TEST_CASE("cross_entropy: gradchecks", "[loss][gradcheck]") {
  kiln::manual_seed(68);
  Tensor x = kiln::randn({4, 3}, f64(true));
  Tensor t = targets({2, 0, -100, 1});
  for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    for (double e : {0.0, 0.2}) {
      INFO("reduction " << static_cast<int>(r) << " smoothing " << e);
      CHECK(kiln::gradcheck([t, r, e](const TL& in) { return kiln::cross_entropy(in[0], t, -100, e, r); }, {x}));
    }
  }
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::cross_entropy(in[0], targets({2, 0, 1, 1}), 1); }, {x}));
  Tensor x3 = kiln::randn({2, 3, 2}, f64(true));
  Tensor t3 = kiln::tensor(std::vector<int64_t>{0, 2, -100, 1}).view({2, 2});
  CHECK(kiln::gradcheck([t3](const TL& in) { return kiln::cross_entropy(in[0], t3); }, {x3}));
  CHECK(
      kiln::gradcheck([t3](const TL& in) { return kiln::cross_entropy(in[0], t3, -100, 0.1, Reduction::None); }, {x3}));
  // non-contiguous logits
  Tensor xt = kiln::randn({3, 4}, f64(true));
  CHECK(kiln::gradcheck([t](const TL& in) { return kiln::cross_entropy(in[0].t(), t); }, {xt}));
}

// ---------------------------------------------------------------- nll_loss

TEST_CASE("nll_loss: picks -logp[target] with ignore_index and every reduction", "[loss]") {
  kiln::manual_seed(69);
  const int64_t N = 5, C = 4;
  Tensor lp = kiln::log_softmax(kiln::randn({N, C}, f64()), 1);
  auto v = values(lp);
  std::vector<int64_t> t{3, 0, -100, 1, 3};
  std::vector<double> per;
  double sum = 0;
  for (int64_t i = 0; i < N; ++i) {
    double l = t[i] == -100 ? 0.0 : -v[i * C + t[i]];
    per.push_back(l);
    sum += l;
  }
  CHECK(kiln::nll_loss(lp, targets(t)).item<double>() == Approx(sum / 4.0).epsilon(1e-14));
  CHECK(kiln::nll_loss(lp, targets(t), -100, Reduction::Sum).item<double>() == Approx(sum).epsilon(1e-14));
  Tensor none = kiln::nll_loss(lp, targets(t), -100, Reduction::None);
  CHECK(none.sizes() == IntList{N});
  check_close(none, per, 1e-14, 0, "none");
  // nll_loss does not normalise: arbitrary inputs are just picked
  Tensor raw = kiln::tensor({1.0, 2.0, 3.0, 4.0}, f64()).view({2, 2});
  CHECK(kiln::nll_loss(raw, targets({1, 0}), -100, Reduction::Sum).item<double>() == -5.0);
  // ignore_index that is a class
  CHECK(kiln::nll_loss(raw, targets({1, 0}), 0).item<double>() == -2.0);
  // [N, C, d]
  Tensor lp3 = kiln::randn({2, 3, 2}, f64());
  auto v3 = values(lp3);
  Tensor t3 = kiln::tensor(std::vector<int64_t>{2, 0, 1, 1}).view({2, 2});
  Tensor n3 = kiln::nll_loss(lp3, t3, -100, Reduction::None);
  CHECK(n3.sizes() == IntList{2, 2});
  // element [n][d] = -lp3[n][t[n][d]][d]
  check_close(n3,
              {-v3[(0 * 3 + 2) * 2 + 0], -v3[(0 * 3 + 0) * 2 + 1], -v3[(1 * 3 + 1) * 2 + 0], -v3[(1 * 3 + 1) * 2 + 1]},
              0, 0, "[N,C,d]");
  // gradients
  Tensor x = kiln::randn({N, C}, f64(true));
  for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    CHECK(kiln::gradcheck([t, r](const TL& in) { return kiln::nll_loss(in[0], targets(t), -100, r); }, {x}));
  }
  Tensor xg = kiln::randn({2, 3}, f64(true));
  kiln::nll_loss(xg, targets({2, 0}), -100, Reduction::Sum).backward();
  check_close(xg.grad(), {0, 0, -1, -1, 0, 0}, 0, 0, "nll grad");
}

// ---------------------------------------------------------------- mse_loss

TEST_CASE("mse_loss: values, reductions and gradients", "[loss]") {
  kiln::manual_seed(70);
  Tensor a = kiln::randn({3, 4}, f64(true));
  Tensor b = kiln::randn({3, 4}, f64(true));
  auto av = values(a), bv = values(b);
  std::vector<double> per;
  double s = 0;
  for (size_t i = 0; i < av.size(); ++i) {
    per.push_back((av[i] - bv[i]) * (av[i] - bv[i]));
    s += per.back();
  }
  CHECK(kiln::mse_loss(a, b).item<double>() == Approx(s / 12.0).epsilon(1e-14));
  CHECK(kiln::mse_loss(a, b, Reduction::Sum).item<double>() == Approx(s).epsilon(1e-14));
  Tensor none = kiln::mse_loss(a, b, Reduction::None);
  CHECK(none.sizes() == IntList{3, 4});
  check_close(none, per, 1e-14, 1e-14);
  // f32
  CHECK(kiln::mse_loss(a.detach().to(DType::F32), b.detach().to(DType::F32)).item<double>() ==
        Approx(s / 12.0).epsilon(1e-5));
  // closed-form gradient: 2 (a - b) / n
  kiln::mse_loss(a, b).backward();
  std::vector<double> ga, gb;
  for (size_t i = 0; i < av.size(); ++i) {
    ga.push_back(2.0 * (av[i] - bv[i]) / 12.0);
    gb.push_back(-2.0 * (av[i] - bv[i]) / 12.0);
  }
  check_close(a.grad(), ga, 1e-14, 1e-14, "d/da");
  check_close(b.grad(), gb, 1e-14, 1e-14, "d/db");
  for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    CHECK(kiln::gradcheck([r](const TL& in) { return kiln::mse_loss(in[0], in[1], r); }, {a, b}));
  }
  // non-contiguous operands
  Tensor c = kiln::randn({4, 3}, f64(true));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::mse_loss(in[0].t(), in[1]); }, {c, a}));
}

// ---------------------------------------------------------------- errors

TEST_CASE("losses: error paths", "[loss][errors]") {
  Tensor x = kiln::randn({3, 4});
  SECTION("target out of range") {
    REQUIRE_THROWS_AS(kiln::cross_entropy(x, targets({0, 4, 1})), kiln::Error);
    REQUIRE_THROWS_AS(kiln::cross_entropy(x, targets({0, -1, 1})), kiln::Error);
    REQUIRE_THROWS_AS(kiln::nll_loss(x, targets({0, 1, 7})), kiln::Error);
    REQUIRE_THROWS_AS(kiln::cross_entropy(x, targets({0, 1, 5}), -100, 0.1), kiln::Error);
    REQUIRE_THROWS_AS(kiln::cross_entropy(x, targets({0, 1, 4}), -100, 0.0, Reduction::None), kiln::Error);
    REQUIRE_THROWS_AS(kiln::cross_entropy(kiln::randn({3}), kiln::scalar_tensor(3.0, DType::I64)), kiln::Error);
    try {
      kiln::cross_entropy(x, targets({0, 9, 1}));
      FAIL("no exception");
    } catch (const kiln::Error& e) {
      CHECK(std::string(e.what()).find("9") != std::string::npos);
    }
  }
  SECTION("float target") {
    REQUIRE_THROWS_AS(kiln::cross_entropy(x, kiln::tensor({0.0, 1.0, 2.0})), kiln::Error);
    REQUIRE_THROWS_AS(kiln::nll_loss(x, kiln::tensor({0.0, 1.0, 2.0}, f64())), kiln::Error);
    REQUIRE_THROWS_AS(kiln::cross_entropy(x, kiln::tensor({0.0, 1.0, 2.0}) > 0.5), kiln::Error);
  }
  SECTION("mismatched shapes") {
    REQUIRE_THROWS_AS(kiln::cross_entropy(x, targets({0, 1})), kiln::Error);
    REQUIRE_THROWS_AS(kiln::cross_entropy(x, targets({0, 1, 2, 3})), kiln::Error);
    REQUIRE_THROWS_AS(kiln::cross_entropy(x, targets({0, 1, 2}).view({3, 1})), kiln::Error);
    REQUIRE_THROWS_AS(kiln::cross_entropy(kiln::randn({2, 3, 4}), targets({0, 1})), kiln::Error);
    REQUIRE_THROWS_AS(kiln::cross_entropy(kiln::randn({4}), targets({0})), kiln::Error);  // needs 0-dim
    REQUIRE_THROWS_AS(kiln::nll_loss(x, targets({0, 1})), kiln::Error);
    REQUIRE_THROWS_AS(kiln::mse_loss(x, kiln::randn({4, 3})), kiln::Error);
    REQUIRE_THROWS_AS(kiln::mse_loss(x, kiln::randn({4})), kiln::Error);  // no broadcasting
  }
  SECTION("integer logits") {
    REQUIRE_THROWS_AS(kiln::cross_entropy(kiln::ones({3, 4}, DType::I64), targets({0, 1, 2})), kiln::Error);
  }
  SECTION("undefined") {
    REQUIRE_THROWS_AS(kiln::cross_entropy(Tensor(), targets({0})), kiln::Error);
    REQUIRE_THROWS_AS(kiln::mse_loss(x, Tensor()), kiln::Error);
  }
}
