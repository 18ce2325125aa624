// cumsum, cumprod, sort, argsort, topk: forward against hand-written values, f64 gradcheck
// (cumprod with and without zeros), odd sizes and non-contiguous inputs, NaN ordering as PyTorch
// (NaN sorts as the largest), stability, and the errors for bad input.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include <kiln/kiln.h>
#include "tests/test_util.h"

using namespace kiln_test;

namespace {

Tensor d64(const std::vector<double>& v) { return kiln::tensor(v); }

}  // namespace

TEST_CASE("scan: cumsum exact values, dims, dtypes", "[scan]") {
  Tensor a = kiln::arange(1, 7, 1, DType::F64).view({2, 3});  // [[1,2,3],[4,5,6]]
  check_close(kiln::cumsum(a, 1), {1, 3, 6, 4, 9, 15}, 0, 0);
  check_close(a.cumsum(0), {1, 2, 3, 5, 7, 9}, 0, 0);
  check_close(a.cumsum(-1), {1, 3, 6, 4, 9, 15}, 0, 0);
  // non-contiguous: the transpose's rows are a's columns
  check_close(a.t().cumsum(1), {1, 5, 2, 7, 3, 9}, 0, 0);
  check_close(a.t().cumsum(0), {1, 4, 3, 9, 6, 15}, 0, 0);
  // integers and bool scan in int64
  Tensor i = kiln::tensor(std::vector<int32_t>{3, -1, 4});
  CHECK(i.cumsum(0).dtype() == DType::I64);
  check_close(i.cumsum(0), {3, 2, 6}, 0, 0);
  Tensor b = d64({1, 0, 1, 1}) > 0.5;
  CHECK(b.cumsum(0).dtype() == DType::I64);
  check_close(b.cumsum(0), {1, 1, 2, 3}, 0, 0);
  // f32 keeps its dtype; a 0-dim tensor is its own cumsum
  CHECK(a.to(DType::F32).cumsum(0).dtype() == DType::F32);
  check_close(kiln::cumsum(kiln::scalar_tensor(2.5, DType::F64), 0), {2.5}, 0, 0);
  // a 3-D middle dim, odd sizes
  Tensor c = kiln::arange(0, 2 * 3 * 5, 1, DType::F64).view({2, 3, 5});
  std::vector<double> want(30);
  for (int n = 0; n < 2; ++n)
    for (int k = 0; k < 5; ++k) {
      double acc = 0;
      for (int j = 0; j < 3; ++j) {
        acc += n * 15 + j * 5 + k;
        want[n * 15 + j * 5 + k] = acc;
      }
    }
  check_close(c.cumsum(1), want, 0, 0);
}

TEST_CASE("scan: NaN and inf propagate forward from where they appear", "[scan][nan]") {
  check_close(d64({1, NAN, 2}).cumsum(0), {1, NAN, NAN}, 0, 0);
  check_close(d64({1, INFINITY, -INFINITY}).cumsum(0), {1, INFINITY, NAN}, 0, 0);
  check_close(d64({2, NAN, 3}).cumprod(0), {2, NAN, NAN}, 0, 0);
  check_close(d64({0, INFINITY}).cumprod(0), {0, NAN}, 0, 0);
}

TEST_CASE("scan: cumprod exact values", "[scan]") {
  Tensor a = d64({1, 2, 3, 4, 5, 6}).view({2, 3});
  check_close(kiln::cumprod(a, 1), {1, 2, 6, 4, 20, 120}, 0, 0);
  check_close(a.cumprod(0), {1, 2, 3, 4, 10, 18}, 0, 0);
  check_close(a.t().cumprod(1), {1, 4, 2, 10, 3, 18}, 0, 0);
  check_close(d64({2, 0, 5}).cumprod(0), {2, 0, 0}, 0, 0);
  Tensor i = kiln::tensor(std::vector<int64_t>{2, -3, 4});
  CHECK(i.cumprod(0).dtype() == DType::I64);
  check_close(i.cumprod(0), {2, -6, -24}, 0, 0);
}

TEST_CASE("scan: gradcheck of cumsum and cumprod (with zeros too)", "[scan][gradcheck]") {
  Tensor x = kiln::randn({3, 5}, f64(true));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::cumsum(in[0], 0); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::cumsum(in[0].t(), 1); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::cumprod(in[0], 1); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::cumprod(in[0].t(), 0); }, {x}));
  // zeros: one, two in a row, a zero first and last
  Tensor z = d64({0.5, 0, 1.5, -2, 0, 0, 3, 0.7, 0, 1.2, -0.4, 2, 0, 1.1, 0.9}).view({3, 5}).requires_grad_(true);
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::cumprod(in[0], 1); }, {z}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::cumprod(in[0], 0); }, {z}));
  // exact: d/dx of sum(cumprod([2, 0, 5])) = [1 + 0 + 0, 2 + 2*5, 0]
  Tensor y = d64({2, 0, 5}).requires_grad_(true);
  y.cumprod(0).sum().backward();
  check_close(y.grad(), {1, 12, 0}, 0, 0);
  // second derivative of cumsum through create_graph
  Tensor w = kiln::randn({4}, f64(true));
  Tensor g = kiln::autograd::grad({(w.cumsum(0) * w.cumsum(0)).sum()}, {w}, {}, true, true)[0];
  CHECK(kiln::gradcheck(
      [](const TL& in) {
        return kiln::autograd::grad({(in[0].cumsum(0) * in[0].cumsum(0)).sum()}, {in[0]}, {}, true, true)[0];
      },
      {w}));
  CHECK(g.defined());
}

TEST_CASE("scan: errors", "[scan][errors]") {
  CHECK_THROWS_WITH(kiln::cumsum(kiln::zeros({2, 3}), 2), Catch::Contains("cumsum: dimension 2 out of range"));
  CHECK_THROWS_WITH(kiln::cumprod(kiln::zeros({2, 3}), -3), Catch::Contains("cumprod: dimension -3 out of range"));
  CHECK(kiln::cumsum(kiln::zeros({0, 3}), 0).sizes() == IntList{0, 3});
}

TEST_CASE("sort: values and stable indices, ascending and descending", "[sort]") {
  Tensor a = d64({3, 1, 2, 1, 3, 0, 2});
  auto [v, i] = kiln::sort(a);
  check_close(v, {0, 1, 1, 2, 2, 3, 3}, 0, 0);
  CHECK(i.dtype() == DType::I64);
  check_close(i, {5, 1, 3, 2, 6, 0, 4}, 0, 0);
  auto [vd, id] = a.sort(0, true);
  check_close(vd, {3, 3, 2, 2, 1, 1, 0}, 0, 0);
  check_close(id, {0, 4, 2, 6, 1, 3, 5}, 0, 0);
  check_close(kiln::argsort(a), {5, 1, 3, 2, 6, 0, 4}, 0, 0);
  check_close(a.argsort(-1, true), {0, 4, 2, 6, 1, 3, 5}, 0, 0);
  // integers keep their dtype
  Tensor n = kiln::tensor(std::vector<int64_t>{5, -2, 9});
  auto [nv, ni] = n.sort();
  CHECK(nv.dtype() == DType::I64);
  check_close(nv, {-2, 5, 9}, 0, 0);
  check_close(ni, {1, 0, 2}, 0, 0);
}

TEST_CASE("sort: NaN sorts as the largest, inf below it", "[sort][nan]") {
  Tensor a = d64({3, NAN, -INFINITY, NAN, INFINITY, 1});
  auto [v, i] = kiln::sort(a);
  check_close(v, {-INFINITY, 1, 3, INFINITY, NAN, NAN}, 0, 0);
  check_close(i, {2, 5, 0, 4, 1, 3}, 0, 0);
  auto [vd, id] = kiln::sort(a, 0, true);
  check_close(vd, {NAN, NAN, INFINITY, 3, 1, -INFINITY}, 0, 0);
  check_close(id, {1, 3, 4, 0, 5, 2}, 0, 0);
  auto [tv, ti] = kiln::topk(a, 2);
  check_close(tv, {NAN, NAN}, 0, 0);
  check_close(ti, {1, 3}, 0, 0);
  auto [sv, si] = kiln::topk(a, 2, 0, false);
  check_close(sv, {-INFINITY, 1}, 0, 0);
  check_close(si, {2, 5}, 0, 0);
  // f32 too
  auto [fv, fi] = kiln::sort(a.to(DType::F32), 0, true);
  check_close(fi, {1, 3, 4, 0, 5, 2}, 0, 0);
}

TEST_CASE("sort: dims, odd sizes and non-contiguous input", "[sort]") {
  Tensor a = kiln::randn({5, 3, 7}, DType::F64);
  for (int64_t dim = 0; dim < 3; ++dim) {
    for (bool desc : {false, true}) {
      Tensor x = a.transpose(0, 2);  // [7, 3, 5], not contiguous
      auto [v, i] = kiln::sort(x, dim, desc);
      CHECK(v.sizes() == x.sizes());
      // gathering x at the indices gives the values, and the values are ordered along dim
      CHECK(kiln::equal(kiln::gather(x, dim, i), v));
      Tensor lo = v.narrow(dim, 0, x.size(dim) - 1), hi = v.narrow(dim, 1, x.size(dim) - 1);
      Tensor ok = desc ? lo >= hi : lo <= hi;
      CHECK(kiln::equal(ok, kiln::ones(ok.sizes(), DType::Bool)));
      // each row's indices are a permutation: sorting them gives 0..n-1
      auto [si, unused] = kiln::sort(i, dim);
      Tensor want = kiln::arange(static_cast<double>(x.size(dim)), DType::I64);
      IntList shape(3, 1);
      shape[dim] = x.size(dim);
      CHECK(kiln::equal(si, want.view(shape).expand(x.sizes())));
    }
  }
  // 2-D exact, along dim 0
  Tensor b = d64({4, 1, 2, 3, 0, 5}).view({3, 2});  // columns [4,2,0] and [1,3,5]
  auto [bv, bi] = b.sort(0);
  check_close(bv, {0, 1, 2, 3, 4, 5}, 0, 0);
  check_close(bi, {2, 0, 1, 1, 0, 2}, 0, 0);
  // 0-dim
  auto [zv, zi] = kiln::sort(kiln::scalar_tensor(4.0, DType::F64));
  CHECK(zv.dim() == 0);
  CHECK(zv.item<double>() == 4.0);
  CHECK(zi.item<int64_t>() == 0);
}

TEST_CASE("sort: topk values, indices, k = 0 and k = size", "[sort][topk]") {
  Tensor a = d64({1, 5, 3, 5, 2, 4, 0}).view({1, 7});
  auto [v, i] = kiln::topk(a, 3);
  check_close(v, {5, 5, 4}, 0, 0);
  check_close(i, {1, 3, 5}, 0, 0);
  auto [sv, si] = a.topk(2, -1, false);
  check_close(sv, {0, 1}, 0, 0);
  check_close(si, {6, 0}, 0, 0);
  auto [ev, ei] = kiln::topk(a, 0);
  CHECK(ev.sizes() == IntList{1, 0});
  auto [fv, fi] = kiln::topk(a, 7, 1, true, false);
  check_close(fv, {5, 5, 4, 3, 2, 1, 0}, 0, 0);
  // along dim 0 of a non-contiguous tensor
  Tensor b = d64({4, 1, 2, 3, 0, 5}).view({2, 3}).t();  // [[4,3],[1,0],[2,5]]
  auto [bv, bi] = kiln::topk(b, 2, 0);
  check_close(bv, {4, 5, 2, 3}, 0, 0);
  check_close(bi, {0, 2, 2, 0}, 0, 0);
}

TEST_CASE("sort: gradients scatter to the indices", "[sort][gradcheck]") {
  Tensor x = kiln::randn({3, 5}, f64(true));
  CHECK(kiln::gradcheck([](const TL& in) { return std::get<0>(kiln::sort(in[0], 1)); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return std::get<0>(kiln::sort(in[0].t(), 1, true)); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return std::get<0>(kiln::topk(in[0], 2, 0)); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return std::get<0>(kiln::topk(in[0], 3, 1, false)); }, {x}));
  Tensor y = d64({3, 1, 2}).requires_grad_(true);
  auto [v, i] = kiln::topk(y, 2);
  (v * d64({10, 20})).sum().backward();
  check_close(y.grad(), {10, 0, 20}, 0, 0);
}

TEST_CASE("sort: errors", "[sort][errors]") {
  Tensor a = kiln::zeros({2, 3});
  CHECK_THROWS_WITH(kiln::sort(a, 2), Catch::Contains("sort: dimension 2 out of range"));
  CHECK_THROWS_WITH(kiln::argsort(a, -3), Catch::Contains("argsort: dimension -3 out of range"));
  CHECK_THROWS_WITH(kiln::topk(a, 4), Catch::Contains("topk: k (4) is out of range for dimension 1 of size 3"));
  CHECK_THROWS_AS(kiln::topk(a, -1), kiln::Error);
  CHECK_THROWS_AS(kiln::topk(a, 1, 5), kiln::Error);
}
