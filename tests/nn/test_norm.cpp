// batch_norm, layer_norm, group_norm, rms_norm: forward against references computed here in
// double, running statistics, eval mode, channels-last inputs, f64 gradchecks, error paths.
#include <cmath>

#include "tests/nn/nn_test_util.h"

namespace {

// Reference batch norm on row-major [N, C, S] data; also returns the batch mean and biased var.
std::vector<double> ref_bn(const std::vector<double>& x, int64_t N, int64_t C, int64_t S, const std::vector<double>* w,
                           const std::vector<double>* b, double eps, std::vector<double>& mean,
                           std::vector<double>& var) {
  mean.assign(C, 0);
  var.assign(C, 0);
  for (int64_t c = 0; c < C; ++c) {
    double s = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < S; ++i) s += x[(n * C + c) * S + i];
    mean[c] = s / (N * S);
    double v = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < S; ++i) v += std::pow(x[(n * C + c) * S + i] - mean[c], 2);
    var[c] = v / (N * S);
  }
  std::vector<double> y(x.size());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < S; ++i) {
        double h = (x[(n * C + c) * S + i] - mean[c]) / std::sqrt(var[c] + eps);
        y[(n * C + c) * S + i] = h * (w ? (*w)[c] : 1.0) + (b ? (*b)[c] : 0.0);
      }
  return y;
}

// Reference normalisation of rows of K (layer norm, or RMS norm when rms), weight/bias per column.
std::vector<double> ref_rows(const std::vector<double>& x, int64_t K, const std::vector<double>* w,
                             const std::vector<double>* b, double eps, bool rms) {
  std::vector<double> y(x.size());
  for (size_t r = 0; r < x.size() / K; ++r) {
    double m = 0, v = 0;
    for (int64_t i = 0; i < K; ++i) m += x[r * K + i];
    m /= K;
    if (rms) m = 0;
    for (int64_t i = 0; i < K; ++i) v += std::pow(x[r * K + i] - m, 2);
    v /= K;
    for (int64_t i = 0; i < K; ++i)
      y[r * K + i] = (x[r * K + i] - m) / std::sqrt(v + eps) * (w ? (*w)[i] : 1.0) + (b ? (*b)[i] : 0.0);
  }
  return y;
}

}  // namespace

TEST_CASE("batch_norm: forward matches the PyTorch formula, [N, C] and [N, C, H, W]", "[norm]") {
  kiln::manual_seed(1);
  for (IntList shape : {IntList{16, 5}, IntList{4, 3, 5, 7}, IntList{3, 2, 11}}) {
    INFO("shape " << shape[0] << "x" << shape[1] << " dims " << shape.size());
    Tensor x = kiln::randn(shape, f64()) * 2.0 + 3.0;
    int64_t N = shape[0], C = shape[1], S = x.numel() / (N * C);
    Tensor w = kiln::randn({C}, f64()), b = kiln::randn({C}, f64());
    std::vector<double> wv = values(w), bv = values(b), m, v;
    auto want = ref_bn(values(x), N, C, S, &wv, &bv, 1e-5, m, v);
    check_close_rel(values(F::batch_norm(x, Tensor(), Tensor(), w, b, true)), want, 1e-12, "f64 affine");
    auto want_plain = ref_bn(values(x), N, C, S, nullptr, nullptr, 1e-5, m, v);
    check_close_rel(values(F::batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true)), want_plain, 1e-12,
                    "no affine");
    // float32 within float rounding of the double reference
    check_close_rel(
        values(F::batch_norm(x.to(DType::F32), Tensor(), Tensor(), w.to(DType::F32), b.to(DType::F32), true)), want,
        2e-5, "f32");
  }
}

TEST_CASE("batch_norm: running statistics after two steps, then eval mode uses them", "[norm]") {
  kiln::manual_seed(2);
  const int64_t N = 6, C = 3, S = 4;
  Tensor rm = kiln::zeros({C}, f64()), rv = kiln::ones({C}, f64());
  Tensor rm32 = kiln::zeros({C}), rv32 = kiln::ones({C});
  std::vector<double> em(C, 0.0), ev(C, 1.0);
  for (int step = 0; step < 2; ++step) {
    Tensor x = kiln::randn({N, C, 2, 2}, f64()) + static_cast<double>(step);
    std::vector<double> m, v;
    ref_bn(values(x), N, C, S, nullptr, nullptr, 1e-5, m, v);
    for (int64_t c = 0; c < C; ++c) {
      em[c] = 0.9 * em[c] + 0.1 * m[c];
      ev[c] = 0.9 * ev[c] + 0.1 * v[c] * (N * S) / (N * S - 1.0);  // unbiased
    }
    F::batch_norm(x, rm, rv, Tensor(), Tensor(), true, 0.1);
    F::batch_norm(x.to(DType::F32), rm32, rv32, Tensor(), Tensor(), true, 0.1);
  }
  check_close_rel(values(rm), em, 1e-12, "running_mean");
  check_close_rel(values(rv), ev, 1e-12, "running_var");
  check_close_rel(values(rm32), em, 1e-6, "running_mean f32");
  check_close_rel(values(rv32), ev, 1e-6, "running_var f32");

  Tensor x = kiln::randn({N, C, 2, 2}, f64());
  Tensor w = kiln::randn({C}, f64()), b = kiln::randn({C}, f64());
  std::vector<double> xv = values(x), wv = values(w), bv = values(b), want(xv.size());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < S; ++i) {
        size_t j = (n * C + c) * S + i;
        want[j] = (xv[j] - em[c]) / std::sqrt(ev[c] + 1e-5) * wv[c] + bv[c];
      }
  std::vector<double> rm_before = values(rm);
  check_close_rel(values(F::batch_norm(x, rm, rv, w, b, false)), want, 1e-12, "eval");
  check_close_rel(values(rm), rm_before, 0, "eval leaves running stats alone");
}

TEST_CASE("batch_norm: a channels-last input gives the same values and keeps its layout", "[norm]") {
  kiln::manual_seed(3);
  Tensor base = kiln::randn({4, 5, 3, 6}, f64());  // NHWC storage
  Tensor x = base.permute({0, 3, 1, 2});           // logical [4, 6, 5, 3]
  REQUIRE_FALSE(x.is_contiguous());
  Tensor w = kiln::randn({6}, f64()), b = kiln::randn({6}, f64());
  Tensor y = F::batch_norm(x, Tensor(), Tensor(), w, b, true);
  Tensor yref = F::batch_norm(x.contiguous(), Tensor(), Tensor(), w, b, true);
  check_close_rel(values(y), values(yref), 1e-12);
  CHECK(y.permute({0, 2, 3, 1}).is_contiguous());
  CHECK(kiln::gradcheck(
      [&](const TL& in) {
        return F::batch_norm(in[0].permute({0, 3, 1, 2}), Tensor(), Tensor(), in[1], in[2], true);
      },
      {kiln::randn({2, 3, 2, 3}, f64(true)), kiln::randn({3}, f64(true)), kiln::randn({3}, f64(true))}));
}

TEST_CASE("batch_norm: gradchecks (train with and without affine, eval, [N, C])", "[norm]") {
  kiln::manual_seed(4);
  check_batch_norm_gradchecks([](const auto&... args) { return F::batch_norm(args...); });
}

TEST_CASE("batch_norm: second derivative through create_graph matches finite differences", "[norm]") {
  kiln::manual_seed(5);
  Tensor x = kiln::randn({4, 2, 3}, f64(true));
  Tensor w = kiln::randn({2}, f64(true));
  Tensor gy = kiln::randn({4, 2, 3}, f64());
  // f(x, w) = <d(batch_norm)/dx . gy, gy>: its gradient needs the second derivative.
  CHECK(kiln::gradcheck(
      [&](const TL& in) {
        Tensor y = F::batch_norm(in[0], Tensor(), Tensor(), in[1], Tensor(), true);
        TL g = kiln::autograd::grad({y}, {in[0]}, {gy}, true, true);
        return (g[0] * gy).sum();
      },
      {x, w}));
}

TEST_CASE("layer_norm and rms_norm: forward against references, gradchecks", "[norm]") {
  kiln::manual_seed(6);
  Tensor x = kiln::randn({3, 4, 5}, f64()) * 3.0 + 1.0;
  Tensor w = kiln::randn({4, 5}, f64()), b = kiln::randn({4, 5}, f64());
  std::vector<double> wv = values(w), bv = values(b);
  check_close_rel(values(F::layer_norm(x, {4, 5}, w, b)), ref_rows(values(x), 20, &wv, &bv, 1e-5, false), 1e-12,
                  "ln 2-d shape");
  check_close_rel(values(F::layer_norm(x, {5})), ref_rows(values(x), 5, nullptr, nullptr, 1e-5, false), 1e-12,
                  "ln plain");
  check_close_rel(values(F::rms_norm(x, {4, 5}, w)), ref_rows(values(x), 20, &wv, nullptr, 1e-6, true), 1e-12, "rms");
  check_close_rel(values(F::layer_norm(x.to(DType::F32), {4, 5}, w.to(DType::F32), b.to(DType::F32))),
                  ref_rows(values(x), 20, &wv, &bv, 1e-5, false), 2e-5, "ln f32");
  // a non-contiguous input
  Tensor xt = x.transpose(0, 1);
  check_close_rel(values(F::layer_norm(xt, {5})), ref_rows(values(xt.contiguous()), 5, nullptr, nullptr, 1e-5, false),
                  1e-12, "ln strided");

  Tensor xs = kiln::randn({3, 2, 4}, f64(true));
  Tensor ws = kiln::randn({2, 4}, f64(true)), bs = kiln::randn({2, 4}, f64(true));
  CHECK(kiln::gradcheck([](const TL& in) { return F::layer_norm(in[0], {2, 4}, in[1], in[2]); }, {xs, ws, bs}));
  CHECK(kiln::gradcheck([](const TL& in) { return F::layer_norm(in[0], {4}); }, {xs}));
  CHECK(kiln::gradcheck([](const TL& in) { return F::rms_norm(in[0], {2, 4}, in[1]); }, {xs, ws}));
  CHECK(kiln::gradcheck([](const TL& in) { return F::rms_norm(in[0], {4}); }, {xs}));
  // second derivative (create_graph path)
  Tensor gy = kiln::randn({3, 2, 4}, f64());
  CHECK(kiln::gradcheck(
      [&](const TL& in) {
        TL g = kiln::autograd::grad({F::layer_norm(in[0], {4}, in[1].select(0, 0))}, {in[0]}, {gy}, true, true);
        return (g[0] * gy).sum();
      },
      {xs, ws}));
}

TEST_CASE("group_norm: forward against a reference, gradchecks", "[norm]") {
  kiln::manual_seed(7);
  const int64_t N = 2, C = 6, G = 3, S = 5;
  Tensor x = kiln::randn({N, C, S}, f64()) * 2.0 - 1.0;
  Tensor w = kiln::randn({C}, f64()), b = kiln::randn({C}, f64());
  std::vector<double> xv = values(x), wv = values(w), bv = values(b);
  std::vector<double> want = ref_rows(xv, C / G * S, nullptr, nullptr, 1e-5, false);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < S; ++i) {
        size_t j = (n * C + c) * S + i;
        want[j] = want[j] * wv[c] + bv[c];
      }
  check_close_rel(values(F::group_norm(x, G, w, b)), want, 1e-12);
  Tensor xs = kiln::randn({2, 4, 3}, f64(true));
  Tensor ws = kiln::randn({4}, f64(true)), bs = kiln::randn({4}, f64(true));
  CHECK(kiln::gradcheck([](const TL& in) { return F::group_norm(in[0], 2, in[1], in[2]); }, {xs, ws, bs}));
  CHECK(kiln::gradcheck([](const TL& in) { return F::group_norm(in[0], 4); }, {xs}));
}

TEST_CASE("norms: bad arguments throw kiln::Error naming the op and shapes", "[norm]") {
  Tensor x = kiln::randn({4, 6, 3});
  CHECK_THROWS_AS(F::layer_norm(x, {4}), kiln::Error);
  CHECK_THROWS_AS(F::layer_norm(x, {6, 4}), kiln::Error);
  CHECK_THROWS_AS(F::layer_norm(x, {3}, kiln::ones({4})), kiln::Error);
  CHECK_THROWS_AS(F::rms_norm(x, {7}), kiln::Error);
  CHECK_THROWS_AS(F::group_norm(x, 4), kiln::Error);
  CHECK_THROWS_AS(F::group_norm(x, 3, kiln::ones({5})), kiln::Error);
  CHECK_THROWS_AS(F::batch_norm(x, kiln::zeros({5}), kiln::ones({5}), Tensor(), Tensor(), true), kiln::Error);
  CHECK_THROWS_AS(F::batch_norm(x, kiln::zeros({6}), kiln::ones({4}), Tensor(), Tensor(), true), kiln::Error);
  CHECK_THROWS_AS(F::batch_norm(x, Tensor(), Tensor(), kiln::ones({3}), Tensor(), true), kiln::Error);
  CHECK_THROWS_AS(F::batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), false), kiln::Error);
  CHECK_THROWS_AS(F::batch_norm(kiln::randn({1, 3}), Tensor(), Tensor(), Tensor(), Tensor(), true), kiln::Error);
  const std::string group = error_of([&] { F::group_norm(x, 4); });
  CHECK(group.find("group_norm") != std::string::npos);
  CHECK(group.find("[4, 6, 3]") != std::string::npos);
  const std::string batch =
      error_of([&] { F::batch_norm(x, kiln::zeros({5}), kiln::ones({5}), Tensor(), Tensor(), true); });
  CHECK(batch.find("batch_norm") != std::string::npos);
  CHECK(batch.find("running_mean") != std::string::npos);
  CHECK(batch.find("[5]") != std::string::npos);
}

TEST_CASE("norms: float16 / bfloat16 inputs compute in float32 (tolerance 1e-2 relative)", "[norm]") {
  kiln::manual_seed(8);
  Tensor x = kiln::randn({8, 4, 3, 3});
  Tensor w = kiln::randn({4}), b = kiln::randn({4});
  for (DType dt : {DType::F16, DType::BF16}) {
    INFO(kiln::dtype_name(dt));
    Tensor xh = x.to(dt);
    Tensor ref = F::batch_norm(xh.to(DType::F32), Tensor(), Tensor(), w, b, true);
    Tensor got = F::batch_norm(xh, Tensor(), Tensor(), w.to(dt), b.to(dt), true);
    CHECK(got.dtype() == dt);
    check_close_rel(values(got), values(ref), 2e-2, "batch_norm");
    Tensor lref = F::layer_norm(xh.to(DType::F32), {3, 3});
    check_close_rel(values(F::layer_norm(xh, {3, 3})), values(lref), 2e-2, "layer_norm");
  }
}
