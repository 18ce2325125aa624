// Indexing and joining ops: cat, stack, index_select, gather, embedding, one_hot, and the raw
// index_add / scatter_add kernels their backward uses. Forward values are checked against
// hand-written references, gradients by finite differences in f64 and, for repeated indices,
// by exact expected values.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "kiln/core/autograd.h"
#include "kiln/core/error.h"
#include "kiln/core/tensor.h"
#include "kiln/kernels/indexing.h"
#include "tests/test_util.h"

#if __has_include("kiln/core/gradcheck.h")
#include "kiln/core/gradcheck.h"
#define KILN_TEST_HAVE_GRADCHECK 1
#endif

using kiln::DType;
using kiln::Tensor;
using kiln::TensorOptions;
using namespace kiln_test;

namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

Tensor i64(const std::vector<int64_t>& v) { return kiln::tensor(v); }
Tensor i32(const std::vector<int32_t>& v) { return kiln::tensor(v); }

Tensor randn64(const kiln::IntList& sizes) { return kiln::randn(sizes, f64(true)); }

// Finite-difference gradient check in f64: kiln::gradcheck when the core provides it, otherwise
// a central-difference Jacobian-vector check on contiguous leaf inputs.
bool check_grad(const Fn& fn, std::vector<Tensor> inputs) {
#ifdef KILN_TEST_HAVE_GRADCHECK
  return kiln::gradcheck(fn, inputs, 1e-6, 1e-5, 1e-3);
#else
  Tensor y = fn(inputs);
  Tensor w = kiln::randn(y.sizes(), TensorOptions().dtype(DType::F64));
  Tensor s = (y * w).sum();
  std::vector<Tensor> wanted;
  for (const Tensor& x : inputs)
    if (x.requires_grad()) wanted.push_back(x);
  std::vector<Tensor> analytic = kiln::autograd::grad({s}, wanted, {}, false, false, true);
  size_t k = 0;
  const double eps = 1e-6;
  for (Tensor& x : inputs) {
    if (!x.requires_grad()) continue;
    REQUIRE(x.is_contiguous());
    REQUIRE(x.dtype() == DType::F64);
    std::vector<double> a = analytic[k].defined() ? values(analytic[k]) : std::vector<double>(x.numel(), 0.0);
    ++k;
    double* p = x.data_ptr<double>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double orig = p[i];
      double plus, minus;
      {
        kiln::NoGradGuard ng;
        p[i] = orig + eps;
        plus = (fn(inputs) * w).sum().item<double>();
        p[i] = orig - eps;
        minus = (fn(inputs) * w).sum().item<double>();
        p[i] = orig;
      }
      const double num = (plus - minus) / (2 * eps);
      if (std::abs(num - a[i]) > 1e-5 + 1e-3 * std::abs(num)) {
        FAIL_CHECK("gradient mismatch at element " << i << ": numeric " << num << ", analytic " << a[i]);
        return false;
      }
    }
  }
  return true;
#endif
}

}  // namespace

// ================================================================ cat

TEST_CASE("cat: forward values along each dimension", "[indexing][cat]") {
  Tensor a = kiln::arange(6).reshape({2, 3});
  Tensor b = kiln::arange(6, 10).reshape({2, 2});
  Tensor c = kiln::cat({a, b}, 1);
  REQUIRE(c.sizes() == kiln::IntList{2, 5});
  REQUIRE(values(c) == std::vector<double>{0, 1, 2, 6, 7, 3, 4, 5, 8, 9});
  REQUIRE(values(kiln::cat({a, b}, -1)) == values(c));

  Tensor d = kiln::arange(10, 13).reshape({1, 3});
  Tensor e = kiln::cat({a, d, a}, 0);
  REQUIRE(e.sizes() == kiln::IntList{5, 3});
  REQUIRE(values(e) == std::vector<double>{0, 1, 2, 3, 4, 5, 10, 11, 12, 0, 1, 2, 3, 4, 5});

  // a single tensor is a copy
  Tensor f = kiln::cat({a}, 0);
  REQUIRE(values(f) == values(a));
  REQUIRE_FALSE(f.storage() == a.storage());
}

TEST_CASE("cat: non-contiguous inputs and dtype promotion", "[indexing][cat]") {
  Tensor a = kiln::arange(12).reshape({3, 4});
  Tensor at = a.t();                   // [4, 3], transposed
  Tensor s = a.slice(1, 0, 4, 2).t();  // [2, 3] with step
  Tensor c = kiln::cat({at, s}, 0);
  REQUIRE(c.sizes() == kiln::IntList{6, 3});
  REQUIRE(values(c) == std::vector<double>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11, 0, 4, 8, 2, 6, 10});

  Tensor i = kiln::tensor(std::vector<int64_t>{1, 2});
  Tensor f = kiln::tensor({0.5, 1.5}, DType::F32);
  Tensor p = kiln::cat({i, f});
  REQUIRE(p.dtype() == DType::F32);
  REQUIRE(values(p) == std::vector<double>{1, 2, 0.5, 1.5});
}

TEST_CASE("cat: empty inputs", "[indexing][cat]") {
  Tensor a = kiln::arange(6).reshape({2, 3});
  // legacy rule: 1-D tensors of size 0 are skipped whatever the other shapes
  Tensor c = kiln::cat({kiln::empty({0}), a, kiln::empty({0})}, 1);
  REQUIRE(c.sizes() == kiln::IntList{2, 3});
  REQUIRE(values(c) == values(a));
  Tensor all_empty = kiln::cat({kiln::empty({0}), kiln::empty({0})});
  REQUIRE(all_empty.sizes() == kiln::IntList{0});
  // an empty slab along dim is fine
  Tensor z = kiln::cat({a, kiln::empty({2, 0})}, 1);
  REQUIRE(values(z) == values(a));
  Tensor z0 = kiln::cat({kiln::empty({0, 3}), a}, 0);
  REQUIRE(z0.sizes() == kiln::IntList{2, 3});
}

TEST_CASE("cat: gradients", "[indexing][cat][grad]") {
  kiln::manual_seed(11);
  Tensor a = randn64({2, 3, 2}), b = randn64({2, 1, 2}), c = randn64({2, 4, 2});
  REQUIRE(check_grad([](const std::vector<Tensor>& x) { return kiln::cat(x, 1); }, {a, b, c}));
  REQUIRE(check_grad([](const std::vector<Tensor>& x) { return kiln::cat({x[0], x[0]}, -1); }, {a}));
  // a transposed input (the view is taken inside so the leaf stays contiguous)
  Tensor t = randn64({3, 2});
  REQUIRE(check_grad(
      [](const std::vector<Tensor>& x) {
        return kiln::cat({x[0].t(), x[1]}, 0);
      },
      {t, randn64({1, 3})}));

  // exact slices, and an input that needs no grad
  Tensor p = kiln::arange(4, f64(true)).reshape({2, 2}).detach().requires_grad_();
  Tensor q = kiln::arange(4, 6, 1, TensorOptions().dtype(DType::F64)).reshape({2, 1});
  Tensor y = kiln::cat({p, q}, 1);
  Tensor w = kiln::arange(6, TensorOptions().dtype(DType::F64)).reshape({2, 3}) + 1.0;
  (y * w).sum().backward();
  REQUIRE(values(p.grad()) == std::vector<double>{1, 2, 4, 5});
  REQUIRE_FALSE(q.grad().defined());

  // an f32 input concatenated with f64 gets an f32 gradient
  Tensor h = kiln::ones({2}, TensorOptions().dtype(DType::F32).requires_grad(true));
  Tensor g = kiln::ones({3}, f64(true));
  (kiln::cat({h, g}) * 2.0).sum().backward();
  REQUIRE(h.grad().dtype() == DType::F32);
  REQUIRE(values(h.grad()) == std::vector<double>{2, 2});
  REQUIRE(values(g.grad()) == std::vector<double>{2, 2, 2});
}

TEST_CASE("cat: errors", "[indexing][cat][errors]") {
  Tensor a = kiln::zeros({2, 3}), b = kiln::zeros({3, 2});
  REQUIRE_THROWS_AS(kiln::cat({}, 0), kiln::Error);
  REQUIRE_THROWS_AS(kiln::cat({a, b}, 0), kiln::Error);
  REQUIRE_THROWS_WITH(kiln::cat({a, b}, 0),
                      Catch::Contains("cat") && Catch::Contains("[2, 3]") && Catch::Contains("[3, 2]"));
  REQUIRE_THROWS_AS(kiln::cat({a, kiln::zeros({2, 3, 1})}, 0), kiln::Error);
  REQUIRE_THROWS_AS(kiln::cat({a, a}, 2), kiln::Error);
  REQUIRE_THROWS_AS(kiln::cat({a, a}, -3), kiln::Error);
  REQUIRE_THROWS_AS(kiln::cat({kiln::scalar_tensor(1.0), kiln::scalar_tensor(2.0)}), kiln::Error);
  REQUIRE_THROWS_AS(kiln::cat({a, Tensor()}), kiln::Error);
}

// ================================================================ stack

TEST_CASE("stack: forward values and gradients", "[indexing][stack]") {
  Tensor a = kiln::arange(6).reshape({2, 3});
  Tensor b = kiln::arange(10, 16).reshape({2, 3});
  Tensor s0 = kiln::stack({a, b});
  REQUIRE(s0.sizes() == kiln::IntList{2, 2, 3});
  REQUIRE(values(s0) == std::vector<double>{0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15});
  Tensor s2 = kiln::stack({a, b}, -1);
  REQUIRE(s2.sizes() == kiln::IntList{2, 3, 2});
  REQUIRE(values(s2) == std::vector<double>{0, 10, 1, 11, 2, 12, 3, 13, 4, 14, 5, 15});
  Tensor s1 = kiln::stack({a, b.t().t()}, 1);
  REQUIRE(s1.sizes() == kiln::IntList{2, 2, 3});
  REQUIRE(values(s1) == std::vector<double>{0, 1, 2, 10, 11, 12, 3, 4, 5, 13, 14, 15});
  // 0-dim tensors stack into a vector
  Tensor v = kiln::stack({kiln::scalar_tensor(3.0), kiln::scalar_tensor(4.0)});
  REQUIRE(v.sizes() == kiln::IntList{2});
  REQUIRE(values(v) == std::vector<double>{3, 4});

  kiln::manual_seed(12);
  REQUIRE(check_grad([](const std::vector<Tensor>& x) { return kiln::stack(x, 1); },
                     {randn64({3, 2}), randn64({3, 2}), randn64({3, 2})}));
  REQUIRE(check_grad(
      [](const std::vector<Tensor>& x) {
        return kiln::stack({x[0].t(), x[1]}, -1);
      },
      {randn64({2, 3}), randn64({3, 2})}));

  REQUIRE_THROWS_AS(kiln::stack({a, kiln::zeros({3, 2})}), kiln::Error);
  REQUIRE_THROWS_AS(kiln::stack({}), kiln::Error);
  REQUIRE_THROWS_AS(kiln::stack({a, b}, 3), kiln::Error);
}

// ================================================================ index_select

TEST_CASE("index_select: forward values", "[indexing][index_select]") {
  Tensor a = kiln::arange(12).reshape({3, 4});
  Tensor r = kiln::index_select(a, 0, i64({2, 0}));
  REQUIRE(r.sizes() == kiln::IntList{2, 4});
  REQUIRE(values(r) == std::vector<double>{8, 9, 10, 11, 0, 1, 2, 3});

  Tensor c = a.index_select(1, i32({3, 1, 1}));  // int32 index, repeated
  REQUIRE(c.sizes() == kiln::IntList{3, 3});
  REQUIRE(values(c) == std::vector<double>{3, 1, 1, 7, 5, 5, 11, 9, 9});
  REQUIRE(values(a.index_select(-1, i32({3, 1, 1}))) == values(c));

  // transposed input, strided index
  Tensor at = a.t();                                    // [4, 3]
  Tensor idx = i64({2, 9, 0, 9, 3}).slice(0, 0, 5, 2);  // {2, 0, 3}
  Tensor t = at.index_select(0, idx);
  REQUIRE(values(t) == std::vector<double>{2, 6, 10, 0, 4, 8, 3, 7, 11});

  // 3-D, middle dim, integer dtype preserved
  Tensor b = kiln::arange(24, DType::I64).reshape({2, 3, 4});
  Tensor m = b.index_select(1, i64({1, 1}));
  REQUIRE(m.dtype() == DType::I64);
  REQUIRE(m.sizes() == kiln::IntList{2, 2, 4});
  REQUIRE(values(m) == std::vector<double>{4, 5, 6, 7, 4, 5, 6, 7, 16, 17, 18, 19, 16, 17, 18, 19});

  // empty index, 0-dim index, 0-dim input
  Tensor e = a.index_select(0, kiln::empty({0}, DType::I64));
  REQUIRE(e.sizes() == kiln::IntList{0, 4});
  Tensor s = a.index_select(1, kiln::scalar_tensor(2, DType::I64));
  REQUIRE(s.sizes() == kiln::IntList{3, 1});
  REQUIRE(values(s) == std::vector<double>{2, 6, 10});
  Tensor sc = kiln::scalar_tensor(7.5).index_select(0, i64({0}));
  REQUIRE(sc.dim() == 0);
  REQUIRE(sc.item<double>() == 7.5);
}

TEST_CASE("index_select: repeated indices accumulate gradients", "[indexing][index_select][grad]") {
  Tensor x = kiln::arange(6, f64(true)).reshape({3, 2}).detach().requires_grad_();
  Tensor y = kiln::index_select(x, 0, i64({0, 0, 2}));
  y.sum().backward();
  REQUIRE(values(x.grad()) == std::vector<double>{2, 2, 0, 0, 1, 1});

  // weighted upstream gradient: row 0 gets w0 + w1
  Tensor x2 = kiln::zeros({3, 2}, f64(true));
  Tensor w = kiln::tensor({1.0, 2.0, 10.0, 20.0, 100.0, 200.0}, DType::F64).reshape({3, 2});
  (kiln::index_select(x2, 0, i32({0, 2, 0})) * w).sum().backward();
  REQUIRE(values(x2.grad()) == std::vector<double>{101, 202, 0, 0, 10, 20});

  // along the last dim of a transposed view
  Tensor x3 = kiln::zeros({2, 3}, f64(true));
  x3.t().index_select(1, i64({1, 1, 1, 0})).sum().backward();  // x3.t() is [3, 2]
  REQUIRE(values(x3.grad()) == std::vector<double>{1, 1, 1, 3, 3, 3});
}

TEST_CASE("index_select: gradcheck", "[indexing][index_select][grad]") {
  kiln::manual_seed(21);
  Tensor idx = i64({3, 0, 3, 1});
  REQUIRE(
      check_grad([&](const std::vector<Tensor>& x) { return kiln::index_select(x[0], 0, idx); }, {randn64({4, 3})}));
  REQUIRE(check_grad([&](const std::vector<Tensor>& x) { return x[0].index_select(-1, idx); }, {randn64({2, 3, 4})}));
  REQUIRE(check_grad(
      [&](const std::vector<Tensor>& x) {
        return x[0].transpose(0, 2).index_select(1, i32({2, 2, 0}));
      },
      {randn64({4, 3, 2})}));
}

TEST_CASE("index_select: double backward", "[indexing][index_select][grad]") {
  // f = sum(index_select(x)^2) -> df/dx = 2 x count(row); d/dx sum(df/dx) = 2 count(row)
  Tensor x = kiln::arange(1, 7, 1, f64(true)).reshape({3, 2}).detach().requires_grad_();
  Tensor y = kiln::index_select(x, 0, i64({0, 0, 2}));
  Tensor g = kiln::autograd::grad({(y * y).sum()}, {x}, {}, true, true)[0];
  REQUIRE(values(g) == std::vector<double>{4, 8, 0, 0, 10, 12});
  g.sum().backward();
  REQUIRE(values(x.grad()) == std::vector<double>{4, 4, 0, 0, 2, 2});
}

TEST_CASE("index_select: errors", "[indexing][index_select][errors]") {
  Tensor a = kiln::arange(12).reshape({3, 4});
  REQUIRE_THROWS_AS(a.index_select(0, i64({0, 3})), kiln::Error);
  REQUIRE_THROWS_WITH(a.index_select(0, i64({0, 3})),
                      Catch::Contains("index_select") && Catch::Contains("index 3") && Catch::Contains("size 3"));
  REQUIRE_THROWS_WITH(a.index_select(1, i32({-1})), Catch::Contains("index -1") && Catch::Contains("size 4"));
  REQUIRE_THROWS_WITH(a.index_select(0, kiln::tensor({0.0, 1.0})),
                      Catch::Contains("index_select") && Catch::Contains("float32"));
  REQUIRE_THROWS_AS(a.index_select(0, i64({0, 1}).reshape({1, 2})), kiln::Error);
  REQUIRE_THROWS_AS(a.index_select(2, i64({0})), kiln::Error);
  REQUIRE_THROWS_AS(kiln::index_select(Tensor(), 0, i64({0})), kiln::Error);
}

// ================================================================ gather

namespace {
// out[i][j][k] = a[i|idx][j|idx][k|idx] with idx replacing the coordinate along dim.
std::vector<double> gather_ref(const Tensor& a, int64_t dim, const Tensor& index) {
  std::vector<double> av = values(a), iv = values(index);
  const auto& as = a.sizes();
  const auto& is = index.sizes();
  std::vector<double> out;
  for (int64_t i = 0; i < is[0]; ++i)
    for (int64_t j = 0; j < is[1]; ++j)
      for (int64_t k = 0; k < is[2]; ++k) {
        int64_t c[3] = {i, j, k};
        c[dim] = static_cast<int64_t>(iv[(i * is[1] + j) * is[2] + k]);
        out.push_back(av[(c[0] * as[1] + c[1]) * as[2] + c[2]]);
      }
  return out;
}
}  // namespace

TEST_CASE("gather: forward values", "[indexing][gather]") {
  Tensor a = kiln::arange(12).reshape({3, 4});
  // dim 0: out[i][j] = a[idx[i][j]][j]
  Tensor i0 = i64({0, 1, 2, 0, 2, 2, 1, 0}).reshape({2, 4});
  REQUIRE(values(kiln::gather(a, 0, i0)) == std::vector<double>{0, 5, 10, 3, 8, 9, 6, 3});
  // dim 1 with an index smaller than the input in dim 0: out[i][j] = a[i][idx[i][j]]
  Tensor i1 = i32({3, 0, 1, 1}).reshape({2, 2});
  Tensor g1 = a.gather(1, i1);
  REQUIRE(g1.sizes() == kiln::IntList{2, 2});
  REQUIRE(values(g1) == std::vector<double>{3, 0, 5, 5});
  REQUIRE(values(a.gather(-1, i1)) == values(g1));
  // index larger than the input along dim
  Tensor i2 = i64({0, 1, 2, 3, 3, 3}).reshape({1, 6});
  REQUIRE(values(a.gather(1, i2)) == std::vector<double>{0, 1, 2, 3, 3, 3});

  // random 3-D, every dim, non-contiguous input and index
  kiln::manual_seed(31);
  Tensor x = kiln::randn({4, 5, 6});
  Tensor xt = x.permute({2, 0, 1});  // [6, 4, 5]
  for (int64_t dim = 0; dim < 3; ++dim) {
    Tensor idx = kiln::randint(0, xt.size(dim), {5, 3, 4});
    REQUIRE(values(xt.gather(dim, idx)) == gather_ref(xt, dim, idx));
    Tensor idx_t = kiln::randint(0, xt.size(dim), {3, 4, 4}).permute({1, 2, 0});  // [4, 4, 3]
    REQUIRE(values(xt.gather(dim, idx_t)) == gather_ref(xt, dim, idx_t));
  }

  // empty index, 0-dim
  REQUIRE(a.gather(0, kiln::empty({0, 4}, DType::I64)).sizes() == kiln::IntList{0, 4});
  Tensor s = kiln::scalar_tensor(2.5).gather(0, kiln::scalar_tensor(0, DType::I64));
  REQUIRE(s.dim() == 0);
  REQUIRE(s.item<double>() == 2.5);
}

TEST_CASE("gather: repeated indices accumulate gradients", "[indexing][gather][grad]") {
  Tensor x = kiln::zeros({2, 3}, f64(true));
  Tensor idx = i64({0, 0, 0, 1, 2, 1}).reshape({2, 3});
  Tensor w = kiln::tensor({1.0, 2.0, 4.0, 10.0, 20.0, 40.0}, DType::F64).reshape({2, 3});
  (x.gather(1, idx) * w).sum().backward();
  REQUIRE(values(x.grad()) == std::vector<double>{7, 0, 0, 0, 50, 20});

  // dim 0 with the index taller than the input
  Tensor y = kiln::zeros({2, 2}, f64(true));
  y.gather(0, i32({1, 0, 1, 0, 1, 1}).reshape({3, 2})).sum().backward();
  REQUIRE(values(y.grad()) == std::vector<double>{0, 2, 3, 1});
}

TEST_CASE("gather: gradcheck", "[indexing][gather][grad]") {
  kiln::manual_seed(32);
  for (int64_t dim : {0, 1, 2, -1}) {
    int64_t d = dim < 0 ? dim + 3 : dim;
    kiln::IntList isz = {2, 3, 2};
    isz[d] = 5;  // more positions than the input along dim: repeated indices
    Tensor idx = kiln::randint(0, 3, isz);
    REQUIRE(
        check_grad([&](const std::vector<Tensor>& x) { return kiln::gather(x[0], dim, idx); }, {randn64({3, 3, 3})}));
  }
  Tensor idx = kiln::randint(0, 4, {3, 2});
  REQUIRE(check_grad([&](const std::vector<Tensor>& x) { return x[0].t().gather(0, idx); }, {randn64({2, 4})}));
}

TEST_CASE("gather: errors", "[indexing][gather][errors]") {
  Tensor a = kiln::arange(12).reshape({3, 4});
  REQUIRE_THROWS_WITH(a.gather(1, i64({0, 4}).reshape({1, 2})),
                      Catch::Contains("gather") && Catch::Contains("index 4") && Catch::Contains("size 4"));
  REQUIRE_THROWS_WITH(a.gather(0, i64({0, -2}).reshape({1, 2})), Catch::Contains("index -2"));
  REQUIRE_THROWS_WITH(a.gather(0, kiln::zeros({1, 2})), Catch::Contains("gather") && Catch::Contains("float32"));
  REQUIRE_THROWS_AS(a.gather(0, i64({0, 1})), kiln::Error);                      // rank mismatch
  REQUIRE_THROWS_AS(a.gather(0, kiln::zeros({2, 5}, DType::I64)), kiln::Error);  // too wide in dim 1
  REQUIRE_THROWS_AS(a.gather(2, kiln::zeros({2, 2}, DType::I64)), kiln::Error);
}

// ================================================================ kernels used by backward

TEST_CASE("index_add / scatter_add kernels: strided targets and repeated indices", "[indexing][kernels]") {
  // index_add into a transposed target, int32 index with repeats
  Tensor base = kiln::zeros({3, 2}, DType::F64);
  Tensor out = base.t();  // [2, 3]
  Tensor src = kiln::arange(1, 9, 1, DType::F64).reshape({2, 4});
  kiln::kernels::index_add(out, 1, i32({2, 0, 2, 2}), src);
  REQUIRE(values(out) == std::vector<double>{2, 0, 1 + 3 + 4, 6, 0, 5 + 7 + 8});

  // scatter_add with a source larger than the index
  Tensor t = kiln::zeros({2, 3}, DType::F32);
  Tensor s = kiln::arange(1, 13, 1, DType::F32).reshape({3, 4});
  kiln::kernels::scatter_add(t, 1, i64({0, 0, 2, 1, 1, 1}).reshape({2, 3}), s);
  REQUIRE(values(t) == std::vector<double>{3, 0, 3, 0, 5 + 6 + 7, 0});

  // gather / index_select into transposed outputs
  Tensor a = kiln::arange(12, DType::F64).reshape({3, 4});
  Tensor gbase = kiln::zeros({2, 2}, DType::F64);
  Tensor gout = gbase.t();  // out[i][j] = a[i][idx[i][j]]
  kiln::kernels::gather(gout, a, 1, i32({3, 0, 2, 2}).reshape({2, 2}));
  REQUIRE(values(gout) == std::vector<double>{3, 0, 6, 6});
  REQUIRE(values(gbase) == std::vector<double>{3, 6, 0, 6});
  Tensor sbase = kiln::zeros({4, 2}, DType::F64);
  kiln::kernels::index_select(sbase.t(), a, 0, i64({2, 0}));
  REQUIRE(values(sbase) == std::vector<double>{8, 0, 9, 1, 10, 2, 11, 3});

  // range errors leave the target untouched
  Tensor u = kiln::zeros({2, 2}, DType::F32);
  REQUIRE_THROWS_WITH(kiln::kernels::index_add(u, 0, i64({0, 2}), kiln::ones({2, 2})),
                      Catch::Contains("index_add") && Catch::Contains("index 2") && Catch::Contains("size 2"));
  REQUIRE(values(u) == std::vector<double>{0, 0, 0, 0});
  REQUIRE_THROWS_AS(kiln::kernels::scatter_add(u, 0, i64({0, 1}).reshape({1, 2}), kiln::ones({1, 2}, DType::F64)),
                    kiln::Error);  // dtype mismatch
}

TEST_CASE("indexing: large sizes match a serial reference (parallel paths)", "[indexing][kernels]") {
  kiln::manual_seed(41);
  const int64_t N = 4096, D = 48, V = 37;
  Tensor src = kiln::randn({N, D}, DType::F64);
  Tensor idx = kiln::randint(0, V, {N});
  std::vector<double> sv = values(src), iv = values(idx);

  // index_add (embedding backward): many repeats per row
  Tensor acc = kiln::zeros({V, D}, DType::F64);
  kiln::kernels::index_add(acc, 0, idx, src);
  std::vector<double> ref(V * D, 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t d = 0; d < D; ++d) ref[static_cast<int64_t>(iv[n]) * D + d] += sv[n * D + d];
  std::vector<double> got = values(acc);
  double max_err = 0;
  for (size_t i = 0; i < ref.size(); ++i) max_err = std::max(max_err, std::abs(got[i] - ref[i]));
  REQUIRE(max_err <= 1e-12);

  // index_select (embedding forward) back out of it
  Tensor sel = acc.index_select(0, idx);
  std::vector<double> selv = values(sel);
  int64_t bad = 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t d = 0; d < D; ++d) bad += selv[n * D + d] != got[static_cast<int64_t>(iv[n]) * D + d];
  REQUIRE(bad == 0);

  // scatter_add / gather along dim 1 of a wide tensor
  Tensor gi = kiln::randint(0, D, {N, 20});
  std::vector<double> giv = values(gi);
  Tensor gat = src.gather(1, gi);
  std::vector<double> gv = values(gat);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < 20; ++j) bad += gv[n * 20 + j] != sv[n * D + static_cast<int64_t>(giv[n * 20 + j])];
  REQUIRE(bad == 0);
  Tensor sc = kiln::zeros({N, D}, DType::F64);
  kiln::kernels::scatter_add(sc, 1, gi, gat);
  std::vector<double> scref(N * D, 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < 20; ++j) scref[n * D + static_cast<int64_t>(giv[n * 20 + j])] += gv[n * 20 + j];
  std::vector<double> scv = values(sc);
  max_err = 0;
  for (size_t i = 0; i < scv.size(); ++i) max_err = std::max(max_err, std::abs(scv[i] - scref[i]));
  REQUIRE(max_err <= 1e-12);
}

// ================================================================ embedding

TEST_CASE("embedding: forward, repeated-row gradients, gradcheck", "[indexing][embedding]") {
  Tensor w = kiln::arange(15).reshape({5, 3});
  Tensor ix = i64({1, 4, 0, 1}).reshape({2, 2});
  Tensor e = kiln::embedding(w, ix);
  REQUIRE(e.sizes() == kiln::IntList{2, 2, 3});
  REQUIRE(values(e) == std::vector<double>{3, 4, 5, 12, 13, 14, 0, 1, 2, 3, 4, 5});
  // 0-dim indices give one row; non-contiguous indices
  REQUIRE(kiln::embedding(w, kiln::scalar_tensor(2, DType::I32)).sizes() == kiln::IntList{3});
  REQUIRE(values(kiln::embedding(w, ix.t())) == std::vector<double>{3, 4, 5, 0, 1, 2, 12, 13, 14, 3, 4, 5});
  REQUIRE(kiln::embedding(w, kiln::empty({0}, DType::I64)).sizes() == kiln::IntList{0, 3});

  Tensor wg = kiln::zeros({5, 3}, f64(true));
  kiln::embedding(wg, ix).sum().backward();
  REQUIRE(values(wg.grad()) == std::vector<double>{1, 1, 1, 2, 2, 2, 0, 0, 0, 0, 0, 0, 1, 1, 1});

  kiln::manual_seed(51);
  Tensor idx = kiln::randint(0, 6, {3, 4});
  REQUIRE(check_grad([&](const std::vector<Tensor>& x) { return kiln::embedding(x[0], idx); }, {randn64({6, 4})}));

  REQUIRE_THROWS_WITH(kiln::embedding(w, i64({5})),
                      Catch::Contains("embedding") && Catch::Contains("index 5") && Catch::Contains("5 embeddings"));
  REQUIRE_THROWS_AS(kiln::embedding(w, i64({-1})), kiln::Error);
  REQUIRE_THROWS_WITH(kiln::embedding(kiln::zeros({5}), i64({0})),
                      Catch::Contains("embedding") && Catch::Contains("2-D"));
  REQUIRE_THROWS_AS(kiln::embedding(w, kiln::zeros({2})), kiln::Error);
}

// ================================================================ one_hot

TEST_CASE("one_hot: values, inferred classes and errors", "[indexing][one_hot]") {
  Tensor o = kiln::one_hot(i64({0, 2, 1}));
  REQUIRE(o.dtype() == DType::I64);
  REQUIRE(o.sizes() == kiln::IntList{3, 3});
  REQUIRE(values(o) == std::vector<double>{1, 0, 0, 0, 0, 1, 0, 1, 0});

  Tensor o2 = kiln::one_hot(i32({3, 0, 3, 1}).reshape({2, 2}), 5);
  REQUIRE(o2.sizes() == kiln::IntList{2, 2, 5});
  REQUIRE(values(o2) == std::vector<double>{0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0});
  REQUIRE(values(kiln::one_hot(i64({2, 0}).slice(0, 0, 2, 1), -1)) == std::vector<double>{0, 0, 1, 1, 0, 0});
  REQUIRE(kiln::one_hot(kiln::empty({0}, DType::I64), 4).sizes() == kiln::IntList{0, 4});
  REQUIRE(kiln::one_hot(kiln::scalar_tensor(1, DType::I64)).sizes() == kiln::IntList{2});

  REQUIRE_THROWS_WITH(kiln::one_hot(i64({0, -1})), Catch::Contains("one_hot") && Catch::Contains("-1"));
  REQUIRE_THROWS_WITH(kiln::one_hot(i64({0, 3}), 3), Catch::Contains("one_hot") && Catch::Contains("3"));
  REQUIRE_THROWS_AS(kiln::one_hot(kiln::empty({0}, DType::I64)), kiln::Error);
  REQUIRE_THROWS_AS(kiln::one_hot(kiln::tensor({1.0})), kiln::Error);
}
