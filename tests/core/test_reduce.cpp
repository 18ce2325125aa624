// Reductions: sum/mean/max/min/amax/amin/argmax/argmin/var/std/logsumexp against loops written
// here, over all dims, chosen dims, negative dims and keepdim; integer sums; non-contiguous views;
// sizes large enough for the OpenMP paths (both the [reduced, kept] "bias gradient" path and the
// split-long-row path); gradchecks; and error paths.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <kiln/kiln.h>
#include "tests/test_util.h"

using namespace kiln_test;

namespace {

using kiln::DType;
using kiln::IntList;
using kiln::Tensor;
using kiln::TensorOptions;

// Reference reduction of row-major data `x` of shape `sizes` over `dims` (non-negative, any
// order). The result is in row-major order of the kept dims. `f` folds a group of values.
std::vector<double> ref_reduce(const std::vector<double>& x, const IntList& sizes, IntList dims,
                               const std::function<double(const std::vector<double>&)>& f) {
  const int64_t nd = static_cast<int64_t>(sizes.size());
  std::vector<bool> red(nd, false);
  for (int64_t d : dims) red[d] = true;
  int64_t nkept = 1;
  for (int64_t d = 0; d < nd; ++d)
    if (!red[d]) nkept *= sizes[d];
  std::vector<std::vector<double>> groups(nkept);
  for (size_t i = 0; i < x.size(); ++i) {
    int64_t rem = static_cast<int64_t>(i), kept_index = 0, kept_mult = 1;
    for (int64_t d = nd - 1; d >= 0; --d) {
      int64_t c = rem % sizes[d];
      rem /= sizes[d];
      if (!red[d]) {
        kept_index += c * kept_mult;
        kept_mult *= sizes[d];
      }
    }
    groups[kept_index].push_back(x[i]);
  }
  std::vector<double> out(nkept);
  for (int64_t k = 0; k < nkept; ++k) out[k] = f(groups[k]);
  return out;
}

double g_sum(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}
double g_mean(const std::vector<double>& v) { return g_sum(v) / static_cast<double>(v.size()); }
double g_max(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }
double g_min(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }
double g_argmax(const std::vector<double>& v) {
  return static_cast<double>(std::max_element(v.begin(), v.end()) - v.begin());  // first max
}
double g_argmin(const std::vector<double>& v) {
  return static_cast<double>(std::min_element(v.begin(), v.end()) - v.begin());
}
std::function<double(const std::vector<double>&)> g_var(int correction) {
  return [correction](const std::vector<double>& v) {
    double m = g_mean(v), ss = 0;
    for (double x : v) ss += (x - m) * (x - m);
    return ss / static_cast<double>(static_cast<int64_t>(v.size()) - correction);
  };
}
double g_lse(const std::vector<double>& v) {
  double m = g_max(v), s = 0;
  for (double x : v) s += std::exp(x - m);
  return m + std::log(s);
}

IntList keep_shape(const IntList& sizes, const IntList& dims) {
  IntList out = sizes;
  for (int64_t d : dims) out[d] = 1;
  return out;
}
IntList drop_shape(const IntList& sizes, const IntList& dims) {
  IntList out;
  for (int64_t d = 0; d < static_cast<int64_t>(sizes.size()); ++d)
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) out.push_back(sizes[d]);
  return out;
}

}  // namespace

// ---------------------------------------------------------------- sum / mean

TEST_CASE("reduce: sum and mean over everything", "[reduce]") {
  kiln::manual_seed(31);
  for (DType dt : {DType::F32, DType::F64}) {
    INFO("dtype " << kiln::dtype_name(dt));
    Tensor x = kiln::randn({3, 4, 5}, dt);
    auto xv = values(x);
    const double tol = dt == DType::F32 ? 1e-5 : 1e-12;
    Tensor s = x.sum(), m = x.mean();
    CHECK(s.dim() == 0);
    CHECK(s.dtype() == dt);
    CHECK(m.dim() == 0);
    CHECK(s.item<double>() == Approx(g_sum(xv)).epsilon(tol).margin(tol));
    CHECK(m.item<double>() == Approx(g_mean(xv)).epsilon(tol).margin(tol));
    CHECK(kiln::sum(x).item<double>() == Approx(g_sum(xv)).epsilon(tol).margin(tol));
    CHECK(kiln::mean(x).item<double>() == Approx(g_mean(xv)).epsilon(tol).margin(tol));
    // keepdim over all dims gives [1,1,1]
    Tensor sk = kiln::sum(x, {0, 1, 2}, true);
    CHECK(sk.sizes() == IntList{1, 1, 1});
    CHECK(sk.item<double>() == Approx(g_sum(xv)).epsilon(tol).margin(tol));
  }
  // a 0-dim tensor reduces to itself
  Tensor z = kiln::scalar_tensor(2.5, f64());
  CHECK(z.sum().item<double>() == 2.5);
  CHECK(z.mean().item<double>() == 2.5);
}

TEST_CASE("reduce: sum and mean over dims, negative dims, keepdim", "[reduce]") {
  kiln::manual_seed(32);
  Tensor x = kiln::randn({3, 4, 5}, f64());
  auto xv = values(x);
  const IntList sizes{3, 4, 5};
  struct Case {
    IntList dims;       // as passed
    IntList canonical;  // wrapped
  };
  std::vector<Case> cases = {
      {{0}, {0}},       {{1}, {1}},        {{2}, {2}},       {{-1}, {2}},      {{-3}, {0}},           {{0, 2}, {0, 2}},
      {{2, 0}, {0, 2}}, {{-1, 0}, {0, 2}}, {{1, 2}, {1, 2}}, {{0, 1}, {0, 1}}, {{0, 1, 2}, {0, 1, 2}}};
  for (auto& c : cases) {
    INFO("dims " << c.dims.size() << " first " << c.dims[0]);
    for (bool keep : {false, true}) {
      INFO("keepdim " << keep);
      IntList want_shape = keep ? keep_shape(sizes, c.canonical) : drop_shape(sizes, c.canonical);
      Tensor s = x.sum(c.dims, keep);
      Tensor m = x.mean(c.dims, keep);
      CHECK(s.sizes() == want_shape);
      CHECK(m.sizes() == want_shape);
      check_close(s, ref_reduce(xv, sizes, c.canonical, g_sum), 1e-12, 1e-12, "sum");
      check_close(m, ref_reduce(xv, sizes, c.canonical, g_mean), 1e-12, 1e-12, "mean");
      check_close(kiln::sum(x, c.dims, keep), values(s), 0, 0, "free sum");
      check_close(kiln::mean(x, c.dims, keep), values(m), 0, 0, "free mean");
    }
  }
}

TEST_CASE("reduce: integer and bool sums return int64", "[reduce]") {
  Tensor i64 = kiln::arange(12, DType::I64).view({3, 4});
  Tensor s = i64.sum();
  CHECK(s.dtype() == DType::I64);
  CHECK(s.item<int64_t>() == 66);
  Tensor s0 = i64.sum({0});
  CHECK(s0.dtype() == DType::I64);
  check_close(s0, {12, 15, 18, 21}, 0, 0);
  check_close(i64.sum({1}), {6, 22, 38}, 0, 0);

  Tensor i32 = kiln::tensor(std::vector<int32_t>{2000000000, 2000000000, 2000000000});
  Tensor s32 = i32.sum();
  CHECK(s32.dtype() == DType::I64);  // no int32 overflow
  CHECK(s32.item<int64_t>() == 6000000000LL);

  Tensor b = kiln::tensor({1.0, -1.0, 2.0, 0.5}) > 0.0;
  Tensor sb = b.sum();
  CHECK(sb.dtype() == DType::I64);
  CHECK(sb.item<int64_t>() == 3);

  // large int64 values sum exactly (no trip through double)
  Tensor big = kiln::tensor(std::vector<int64_t>{(1LL << 53) + 1, 1, 1});
  CHECK(big.sum().data_ptr<int64_t>()[0] == (1LL << 53) + 3);
  // ...and item<int64_t>() reads it back exactly
  CHECK(big.sum().item<int64_t>() == (1LL << 53) + 3);
  CHECK(big.max().item<int64_t>() == (1LL << 53) + 1);

  // mean of an integer tensor is an error, as in PyTorch
  REQUIRE_THROWS_AS(i64.mean(), kiln::Error);
}

TEST_CASE("reduce: empty tensors", "[reduce]") {
  Tensor e = kiln::zeros({0, 3}, f64());
  CHECK(e.sum().item<double>() == 0.0);
  Tensor s0 = e.sum({0});
  CHECK(s0.sizes() == IntList{3});
  check_close(s0, {0, 0, 0}, 0, 0);
  CHECK(e.sum({1}).sizes() == IntList{0});
  CHECK(std::isnan(e.mean().item<double>()));  // 0/0, as in PyTorch
  REQUIRE_THROWS_AS(e.max(), kiln::Error);
  REQUIRE_THROWS_AS(e.min(), kiln::Error);
  REQUIRE_THROWS_AS(e.max(0), kiln::Error);
  REQUIRE_THROWS_AS(e.amax({0}), kiln::Error);
  CHECK(e.amax({1}).sizes() == IntList{0});  // reducing a non-empty dim of an empty tensor is fine
  // output [3, 0]: an empty output after a non-trivial dim
  Tensor e3 = kiln::zeros({3, 0, 2}, f64());
  CHECK(e3.sum({2}).sizes() == IntList{3, 0});
  CHECK(e3.sum({0}).sizes() == IntList{0, 2});
  CHECK(e3.mean({2}, true).sizes() == IntList{3, 0, 1});
  CHECK(kiln::zeros({3, 0}).is_contiguous());  // PyTorch: every empty tensor is contiguous
}

// ---------------------------------------------------------------- max / min / arg

TEST_CASE("reduce: max/min over everything", "[reduce]") {
  kiln::manual_seed(33);
  for (DType dt : {DType::F32, DType::F64, DType::I64}) {
    INFO("dtype " << kiln::dtype_name(dt));
    Tensor x = dt == DType::I64 ? kiln::randint(-1000, 1000, {4, 7}) : kiln::randn({4, 7}, dt);
    auto xv = values(x);
    Tensor mx = x.max(), mn = x.min();
    CHECK(mx.dim() == 0);
    CHECK(mx.dtype() == dt);
    CHECK(mx.item<double>() == g_max(xv));
    CHECK(mn.item<double>() == g_min(xv));
    CHECK(x.argmax().dtype() == DType::I64);
    CHECK(x.argmax().item<int64_t>() == static_cast<int64_t>(g_argmax(xv)));
  }
  // NaN wins (PyTorch propagates NaN)
  Tensor n = kiln::tensor({1.0, NAN, 3.0});
  CHECK(std::isnan(n.max().item<double>()));
  CHECK(std::isnan(n.min().item<double>()));
  // all -inf / +inf
  CHECK(kiln::tensor({-INFINITY, -INFINITY}).max().item<double>() == -INFINITY);
  CHECK(kiln::tensor({INFINITY, 2.0}).max().item<double>() == INFINITY);
}

TEST_CASE("reduce: max/min along a dim give values and first indices", "[reduce]") {
  kiln::manual_seed(34);
  Tensor x = kiln::randn({3, 4, 5}, f64());
  auto xv = values(x);
  const IntList sizes{3, 4, 5};
  for (int64_t dim : {0, 1, 2, -1, -2}) {
    const int64_t d = dim < 0 ? dim + 3 : dim;
    INFO("dim " << dim);
    for (bool keep : {false, true}) {
      INFO("keepdim " << keep);
      IntList want_shape = keep ? keep_shape(sizes, {d}) : drop_shape(sizes, {d});
      auto [vmax, imax] = x.max(dim, keep);
      auto [vmin, imin] = x.min(dim, keep);
      CHECK(vmax.sizes() == want_shape);
      CHECK(imax.sizes() == want_shape);
      CHECK(imax.dtype() == DType::I64);
      CHECK(imin.dtype() == DType::I64);
      check_close(vmax, ref_reduce(xv, sizes, {d}, g_max), 0, 0, "max values");
      check_close(imax, ref_reduce(xv, sizes, {d}, g_argmax), 0, 0, "max indices");
      check_close(vmin, ref_reduce(xv, sizes, {d}, g_min), 0, 0, "min values");
      check_close(imin, ref_reduce(xv, sizes, {d}, g_argmin), 0, 0, "min indices");
      check_close(x.argmax(dim, keep), values(imax), 0, 0, "argmax");
      check_close(x.argmin(dim, keep), values(imin), 0, 0, "argmin");
      CHECK(x.argmax(dim, keep).sizes() == want_shape);
    }
  }
  // ties: the first index wins
  Tensor t = kiln::tensor({1.0, 3.0, 3.0, 0.0, 0.0, 3.0}, f64()).view({2, 3});
  auto [tv, ti] = t.max(1);
  check_close(ti, {1, 2}, 0, 0, "tie max indices");
  check_close(t.argmin(1), {0, 0}, 0, 0, "tie argmin");  // row 0 min 1.0 at 0; row 1 min 0.0 at 0
  CHECK(t.argmax().item<int64_t>() == 1);
  // NaN along a dim: value NaN and its index
  Tensor n = kiln::tensor({1.0, NAN, 5.0, 2.0}, f64()).view({1, 4});
  auto [nv, ni] = n.max(1);
  CHECK(std::isnan(nv.item<double>()));
  CHECK(ni.item<int64_t>() == 1);
}

TEST_CASE("reduce: amax/amin over several dims", "[reduce]") {
  kiln::manual_seed(35);
  Tensor x = kiln::randn({3, 4, 5}, f64());
  auto xv = values(x);
  const IntList sizes{3, 4, 5};
  for (IntList dims : {IntList{0}, IntList{2}, IntList{0, 2}, IntList{1, 2}, IntList{0, 1, 2}}) {
    for (bool keep : {false, true}) {
      INFO("keepdim " << keep << " ndims " << dims.size());
      Tensor a = x.amax(dims, keep), b = x.amin(dims, keep);
      IntList want_shape = keep ? keep_shape(sizes, dims) : drop_shape(sizes, dims);
      CHECK(a.sizes() == want_shape);
      check_close(a, ref_reduce(xv, sizes, dims, g_max), 0, 0, "amax");
      check_close(b, ref_reduce(xv, sizes, dims, g_min), 0, 0, "amin");
    }
  }
  check_close(x.amax({-1}), ref_reduce(xv, sizes, {2}, g_max), 0, 0, "amax -1");
  check_close(x.amin({-3, -1}), ref_reduce(xv, sizes, {0, 2}, g_min), 0, 0, "amin -3,-1");
}

TEST_CASE("reduce: max/amax gradients go to the selected element (ties split for full/amax)", "[reduce]") {
  Tensor x = kiln::tensor({1.0, 5.0, 5.0, 2.0, 0.0, 3.0}, f64()).view({2, 3}).detach();
  x.requires_grad_(true);
  std::get<0>(x.max(1)).sum().backward();
  check_close(x.grad(), {0, 1, 0, 0, 0, 1}, 0, 0, "max(dim): first index gets it all");

  Tensor y = kiln::tensor({1.0, 5.0, 5.0, 2.0}, f64(true));
  y.max().backward();
  check_close(y.grad(), {0, 0.5, 0.5, 0}, 0, 0, "max(): split between ties");

  Tensor z = kiln::tensor({1.0, 5.0, 5.0, 2.0, 7.0, 7.0}, f64()).view({2, 3}).detach();
  z.requires_grad_(true);
  (z.amax({1}) * kiln::tensor({1.0, 10.0}, f64())).sum().backward();
  check_close(z.grad(), {0, 0.5, 0.5, 0, 5, 5}, 0, 0, "amax: split between ties");

  Tensor w = kiln::tensor({3.0, -1.0, -1.0}, f64(true));
  w.min().backward();
  check_close(w.grad(), {0, 0.5, 0.5}, 0, 0, "min(): split between ties");
}

// ---------------------------------------------------------------- var / std

TEST_CASE("reduce: var and std with correction 0 and 1", "[reduce]") {
  kiln::manual_seed(36);
  Tensor x = kiln::randn({4, 6, 3}, f64()) * 3.0 + 1.0;
  auto xv = values(x);
  const IntList sizes{4, 6, 3};
  for (int corr : {0, 1}) {
    INFO("correction " << corr);
    CHECK(x.var({}, corr).item<double>() == Approx(g_var(corr)(xv)).epsilon(1e-12));
    for (IntList dims : {IntList{0}, IntList{1}, IntList{2}, IntList{0, 2}, IntList{-1}}) {
      IntList canon;
      for (int64_t d : dims) canon.push_back(d < 0 ? d + 3 : d);
      std::sort(canon.begin(), canon.end());
      auto want_var = ref_reduce(xv, sizes, canon, g_var(corr));
      check_close(x.var(dims, corr), want_var, 1e-12, 1e-12, "var");
      check_close(
          x.std(dims, corr),
          [&] {
            std::vector<double> s;
            for (double v : want_var) s.push_back(std::sqrt(v));
            return s;
          }(),
          1e-12, 1e-12, "std");
      CHECK(x.var(dims, corr, true).sizes() == keep_shape(sizes, canon));
      CHECK(x.std(dims, corr, false).sizes() == drop_shape(sizes, canon));
    }
  }
  // default correction is 1 (unbiased)
  Tensor v = kiln::tensor({1.0, 2.0, 3.0, 4.0}, f64());
  CHECK(v.var().item<double>() == Approx(5.0 / 3.0).epsilon(1e-14));
  CHECK(v.var({}, 0).item<double>() == Approx(1.25).epsilon(1e-14));
  CHECK(v.std({0}).item<double>() == Approx(std::sqrt(5.0 / 3.0)).epsilon(1e-14));
  // one element with correction 1: n - 1 = 0 gives NaN (0/0), as in PyTorch
  CHECK(std::isnan(kiln::tensor({2.0}, f64()).var({}, 1).item<double>()));
  REQUIRE_THROWS_AS(kiln::arange(4, DType::I64).var(), kiln::Error);
}

// ---------------------------------------------------------------- logsumexp

TEST_CASE("reduce: logsumexp matches the stable formula, also for huge values", "[reduce]") {
  kiln::manual_seed(37);
  Tensor x = kiln::randn({3, 4, 5}, f64()) * 4.0;
  auto xv = values(x);
  const IntList sizes{3, 4, 5};
  for (IntList dims : {IntList{0}, IntList{2}, IntList{-1}, IntList{0, 2}, IntList{0, 1, 2}}) {
    IntList canon;
    for (int64_t d : dims) canon.push_back(d < 0 ? d + 3 : d);
    std::sort(canon.begin(), canon.end());
    for (bool keep : {false, true}) {
      INFO("keepdim " << keep);
      Tensor l = kiln::logsumexp(x, dims, keep);
      CHECK(l.sizes() == (keep ? keep_shape(sizes, canon) : drop_shape(sizes, canon)));
      check_close(l, ref_reduce(xv, sizes, canon, g_lse), 1e-12, 1e-12, "logsumexp");
    }
  }
  Tensor big = kiln::tensor({1000.0, 1000.0, 999.0, -1000.0}, f64()).view({2, 2});
  check_close(kiln::logsumexp(big, {1}), {1000.0 + std::log(2.0), 999.0}, 1e-14, 1e-12, "huge");
  Tensor big32 = kiln::tensor({1000.0, 1000.0});
  check_close(kiln::logsumexp(big32, {0}), {1000.0 + std::log(2.0)}, 1e-6, 0, "huge f32");
  // a row of -inf gives -inf (no NaN), as in PyTorch
  Tensor ninf = kiln::tensor({-INFINITY, -INFINITY, 0.0, 1.0}, f64()).view({2, 2});
  check_close(kiln::logsumexp(ninf, {1}), {-INFINITY, g_lse({0.0, 1.0})}, 1e-14, 1e-14, "-inf row");
}

// ---------------------------------------------------------------- non-contiguous

TEST_CASE("reduce: reductions on non-contiguous views", "[reduce][strided]") {
  kiln::manual_seed(38);
  Tensor base = kiln::randn({5, 8}, f64());
  Tensor tr = base.t();                                          // [8,5]
  Tensor sl = base.slice(1, 1, 8, 3);                            // [5,3] columns 1,4,7
  Tensor p3 = kiln::randn({3, 4, 5}, f64()).permute({2, 0, 1});  // [5,3,4]
  auto trv = values(tr), slv = values(sl), p3v = values(p3);
  check_close(tr.sum({0}), ref_reduce(trv, {8, 5}, {0}, g_sum), 1e-12, 1e-12, "t sum 0");
  check_close(tr.sum({1}), ref_reduce(trv, {8, 5}, {1}, g_sum), 1e-12, 1e-12, "t sum 1");
  check_close(tr.mean({0}, true), ref_reduce(trv, {8, 5}, {0}, g_mean), 1e-12, 1e-12, "t mean 0");
  CHECK(tr.sum().item<double>() == Approx(g_sum(trv)).epsilon(1e-12));
  check_close(sl.sum({0}), ref_reduce(slv, {5, 3}, {0}, g_sum), 1e-12, 1e-12, "slice sum 0");
  check_close(sl.amax({1}), ref_reduce(slv, {5, 3}, {1}, g_max), 0, 0, "slice amax 1");
  check_close(std::get<1>(sl.max(0)), ref_reduce(slv, {5, 3}, {0}, g_argmax), 0, 0, "slice argmax 0");
  check_close(std::get<0>(tr.min(1)), ref_reduce(trv, {8, 5}, {1}, g_min), 0, 0, "t min 1");
  check_close(std::get<1>(tr.min(1)), ref_reduce(trv, {8, 5}, {1}, g_argmin), 0, 0, "t argmin 1");
  CHECK(sl.argmax().item<int64_t>() == static_cast<int64_t>(g_argmax(slv)));
  check_close(p3.sum({0, 2}), ref_reduce(p3v, {5, 3, 4}, {0, 2}, g_sum), 1e-12, 1e-12, "permuted sum");
  check_close(p3.var({1}, 0), ref_reduce(p3v, {5, 3, 4}, {1}, g_var(0)), 1e-12, 1e-12, "permuted var");
  check_close(kiln::logsumexp(p3, {0}), ref_reduce(p3v, {5, 3, 4}, {0}, g_lse), 1e-12, 1e-12, "permuted logsumexp");
  // expanded (stride-0) input
  Tensor ex = kiln::tensor({1.0, 2.0, 3.0}, f64()).view({1, 3}).expand({4, 3});
  check_close(ex.sum({0}), {4, 8, 12}, 0, 0, "expanded sum 0");
  check_close(ex.sum({1}), {6, 6, 6, 6}, 0, 0, "expanded sum 1");
}

// ---------------------------------------------------------------- large (parallel paths)

TEST_CASE("reduce: large sums over leading dims (bias-gradient path) and the last dim", "[reduce][parallel]") {
  kiln::manual_seed(39);
  const int64_t N = 300, C = 257;
  for (DType dt : {DType::F32, DType::F64}) {
    INFO("dtype " << kiln::dtype_name(dt));
    Tensor x = kiln::randn({N, C}, dt);
    auto xv = values(x);
    std::vector<double> col(C, 0.0), row(N, 0.0), colmax(C, -INFINITY);
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; j < C; ++j) {
        col[j] += xv[i * C + j];
        row[i] += xv[i * C + j];
        colmax[j] = std::max(colmax[j], xv[i * C + j]);
      }
    std::vector<double> colmean(C), rowmean(N);
    for (int64_t j = 0; j < C; ++j) colmean[j] = col[j] / N;
    for (int64_t i = 0; i < N; ++i) rowmean[i] = row[i] / C;
    // both kernels accumulate in double, so f32 results are the rounded exact sums
    const double tol = dt == DType::F32 ? 1e-6 : 1e-12;
    check_close(x.sum({0}), col, tol, tol, "sum over N");
    check_close(x.sum({0}, true), col, tol, tol, "sum over N keepdim");
    check_close(x.mean({0}), colmean, tol, tol, "mean over N");
    check_close(x.sum({1}), row, tol, tol, "sum over C");
    check_close(x.sum({-1}), row, tol, tol, "sum over -1");
    check_close(x.mean({1}), rowmean, tol, tol, "mean over C");
    check_close(x.amax({0}), colmax, 0, 0, "amax over N");
    // [N, C, 1] over leading dims {0}: the same fast path with a trailing 1
    check_close(x.view({N, C, 1}).sum({0}), col, tol, tol, "sum [N,C,1] over 0");
    // 3-D: reduce the two leading dims of [3, 100, 257]
    Tensor x3 = kiln::randn({3, 100, C}, dt);
    auto x3v = values(x3);
    check_close(x3.sum({0, 1}), ref_reduce(x3v, {3, 100, C}, {0, 1}, g_sum), tol, tol, "sum {0,1}");
    // the gradient of a broadcast bias goes through this path
    Tensor b = kiln::zeros({C}, TensorOptions().dtype(dt).requires_grad(true));
    (x.detach() + b).sum().backward();
    check_close(b.grad(), std::vector<double>(C, static_cast<double>(N)), 0, 0, "bias grad");
    Tensor b2 = kiln::zeros({C}, TensorOptions().dtype(dt).requires_grad(true));
    ((x.detach() + b2) * x.detach()).sum().backward();
    check_close(b2.grad(), col, tol, tol, "bias grad weighted");
  }
  // integer leading-dim sum
  Tensor xi = kiln::randint(-50, 50, {N, C});
  auto xiv = values(xi);
  std::vector<double> coli(C, 0.0);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < C; ++j) coli[j] += xiv[i * C + j];
  Tensor si = xi.sum({0});
  CHECK(si.dtype() == DType::I64);
  check_close(si, coli, 0, 0, "int sum over N");
}

TEST_CASE("reduce: 100000-element reductions (one long row split across threads)", "[reduce][parallel]") {
  kiln::manual_seed(40);
  const int64_t n = 100000;
  for (DType dt : {DType::F32, DType::F64}) {
    INFO("dtype " << kiln::dtype_name(dt));
    Tensor x = kiln::randn({n}, dt) + 0.25;
    auto xv = values(x);
    double s = 0, mx = -INFINITY, mn = INFINITY;
    int64_t amx = 0;
    for (int64_t i = 0; i < n; ++i) {
      s += xv[i];
      if (xv[i] > mx) {
        mx = xv[i];
        amx = i;
      }
      mn = std::min(mn, xv[i]);
    }
    const double tol = dt == DType::F32 ? 1e-6 : 1e-11;
    CHECK(x.sum().item<double>() == Approx(s).epsilon(tol));
    CHECK(x.mean().item<double>() == Approx(s / n).epsilon(tol));
    CHECK(x.sum({0}).item<double>() == Approx(s).epsilon(tol));
    CHECK(x.view({1, n}).sum({1}).item<double>() == Approx(s).epsilon(tol));
    CHECK(x.view({1, n}).sum({-1}, true).sizes() == IntList{1, 1});
    CHECK(x.max().item<double>() == mx);
    CHECK(x.min().item<double>() == mn);
    CHECK(x.amax({0}).item<double>() == mx);
    CHECK(x.argmax().item<int64_t>() == amx);
    CHECK(std::get<1>(x.view({1, n}).max(1)).item<int64_t>() == amx);
    // two long rows
    auto r2 = values(x.view({2, n / 2}).sum({1}));
    double s0 = 0, s1 = 0;
    for (int64_t i = 0; i < n / 2; ++i) s0 += xv[i];
    for (int64_t i = n / 2; i < n; ++i) s1 += xv[i];
    CHECK(r2[0] == Approx(s0).epsilon(tol));
    CHECK(r2[1] == Approx(s1).epsilon(tol));
    // var of a long vector
    double m = s / n, ss = 0;
    for (double v : xv) ss += (v - m) * (v - m);
    CHECK(x.var({}, 1).item<double>() == Approx(ss / (n - 1)).epsilon(dt == DType::F32 ? 1e-5 : 1e-10));
  }
  // integer: 100000 ones
  CHECK(kiln::ones({n}, DType::I64).sum().item<int64_t>() == n);
  CHECK(kiln::ones({n}, DType::I32).sum().item<int64_t>() == n);
  // a long strided row
  Tensor base = kiln::randn({2 * n}, f64());
  Tensor every2 = base.slice(0, 0, 2 * n, 2);
  auto ev = values(every2);
  CHECK(every2.sum().item<double>() == Approx(g_sum(ev)).epsilon(1e-11));
}

// ---------------------------------------------------------------- gradchecks

TEST_CASE("reduce: gradchecks", "[reduce][gradcheck]") {
  kiln::manual_seed(41);
  Tensor x = kiln::randn({3, 4, 2}, f64(true));  // distinct values: no ties for max/min
  CHECK(kiln::gradcheck([](const TL& in) { return in[0].sum(); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return in[0].sum({1}); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return in[0].sum({0, -1}, true); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return in[0].mean(); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return in[0].mean({2}); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return in[0].mean({0, 1}, true); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return in[0].max(); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return in[0].min(); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return std::get<0>(in[0].max(1)); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return std::get<0>(in[0].max(-1, true)); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return std::get<0>(in[0].min(0)); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return in[0].amax({0, 2}); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return in[0].amin({1}, true); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return in[0].var({1}, 1); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return in[0].var({0, 2}, 0, true); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return in[0].var({}, 1); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return in[0].std({2}, 1); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return in[0].std({0, 1}, 0, true); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::logsumexp(in[0], {1}); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::logsumexp(in[0], {0, 2}, true); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::logsumexp(in[0] * 300.0, {-1}); }, {x}));
  // through non-contiguous views
  CHECK(kiln::gradcheck([](const TL& in) { return in[0].transpose(0, 2).sum({0}); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return in[0].permute({2, 0, 1}).amax({1}); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return std::get<0>(in[0].slice(1, 0, 4, 2).max(1)); }, {x}));
}

TEST_CASE("reduce: sum/mean gradient (an expanded view) fans in correctly with another use", "[reduce][gradcheck]") {
  // sum/mean backward hands out a stride-0 expanded gradient; when the same tensor also feeds
  // another op, the two gradients must be added without writing through the aliased view.
  Tensor x = kiln::tensor({0.1, 0.5, -0.3, 1.0, 0.2, 0.0}, f64()).view({2, 3}).detach();
  x.requires_grad_(true);
  Tensor a = x * 1.0;
  (a.sum({1}) * 2.0 + a.select(1, 0)).sum().backward();
  check_close(x.grad(), {3, 2, 2, 3, 2, 2}, 0, 0, "sum path first, select second");
  Tensor y = x.detach().clone();
  y.requires_grad_(true);
  Tensor b = y * 1.0;
  (b.select(1, 0) + b.sum({1}) * 2.0).sum().backward();
  check_close(y.grad(), {3, 2, 2, 3, 2, 2}, 0, 0, "select first, sum second");
  Tensor z = x.detach().clone();
  z.requires_grad_(true);
  Tensor c = z * 1.0;
  (c.mean({0}) * 4.0 + c.select(0, 1)).sum().backward();
  check_close(z.grad(), {2, 2, 2, 3, 3, 3}, 0, 0, "mean path first");
  CHECK(kiln::gradcheck(
      [](const TL& in) {
        Tensor t = in[0] * 1.0;
        return t.sum({1}) * 2.0 + t.select(1, 0);
      },
      {x}));
}

// ---------------------------------------------------------------- errors

TEST_CASE("reduce: error paths", "[reduce][errors]") {
  Tensor x = kiln::randn({3, 4, 5});
  REQUIRE_THROWS_AS(x.sum({3}), kiln::Error);
  REQUIRE_THROWS_AS(x.sum({-4}), kiln::Error);
  REQUIRE_THROWS_AS(x.mean({7}), kiln::Error);
  REQUIRE_THROWS_AS(x.sum({1, 1}), kiln::Error);
  REQUIRE_THROWS_AS(x.sum({1, -2}), kiln::Error);  // -2 is 1 again
  REQUIRE_THROWS_AS(x.mean({0, 2, -3}), kiln::Error);
  REQUIRE_THROWS_AS(x.amax({5}), kiln::Error);
  REQUIRE_THROWS_AS(x.amin({0, 0}), kiln::Error);
  REQUIRE_THROWS_AS(x.max(3), kiln::Error);
  REQUIRE_THROWS_AS(x.min(-4), kiln::Error);
  REQUIRE_THROWS_AS(x.argmax(3), kiln::Error);
  REQUIRE_THROWS_AS(x.argmin(-5), kiln::Error);
  REQUIRE_THROWS_AS(x.var(IntList{3}), kiln::Error);  // dim out of range
  REQUIRE_THROWS_AS(x.var({2, 2}), kiln::Error);
  REQUIRE_THROWS_AS(x.std({-4}), kiln::Error);
  REQUIRE_THROWS_AS(kiln::logsumexp(x, {3}), kiln::Error);
  REQUIRE_THROWS_AS(kiln::logsumexp(x, {0, 0}), kiln::Error);
  Tensor u;
  REQUIRE_THROWS_AS(kiln::sum(u), kiln::Error);
  REQUIRE_THROWS_AS(u.max(), kiln::Error);
  // the error names the op
  try {
    x.sum({9});
    FAIL("no exception");
  } catch (const kiln::Error& e) {
    CHECK(std::string(e.what()).find("sum") != std::string::npos);
  }
}
