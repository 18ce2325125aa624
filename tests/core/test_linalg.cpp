// Matrix products: mm, bmm and matmul for every rank combination against a naive triple loop
// written here; transposed and otherwise non-contiguous operands; f32/f64/f16/bf16/int64;
// gradchecks; shape and dtype errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include <kiln/kiln.h>
#include "tests/test_util.h"

using namespace kiln_test;

namespace {

using kiln::DType;
using kiln::IntList;
using kiln::Tensor;

// Naive batched matmul: a [B, n, k] @ b [B, k, m] in row-major, all in double.
std::vector<double> naive_bmm(const std::vector<double>& a, const std::vector<double>& b, int64_t B, int64_t n,
                              int64_t k, int64_t m) {
  std::vector<double> c(B * n * m, 0.0);
  for (int64_t z = 0; z < B; ++z)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j) {
        double s = 0;
        for (int64_t l = 0; l < k; ++l) s += a[(z * n + i) * k + l] * b[(z * k + l) * m + j];
        c[(z * n + i) * m + j] = s;
      }
  return c;
}

std::vector<double> naive_mm(const Tensor& a, const Tensor& b) {
  return naive_bmm(values(a), values(b), 1, a.size(0), a.size(1), b.size(1));
}

// Tolerance per dtype for products with inner size k of O(1) random values. f32 GEMM
// accumulates in float: error ~ k * 2^-24 * sum|a||b|. 16-bit inputs are widened to f32, so only
// the final rounding to 16 bits counts: f16 unit roundoff 2^-11 -> rel 2e-3; bf16 2^-8 -> 1e-2.
double rtol_for(DType dt) {
  switch (dt) {
    case DType::F64: return 1e-12;
    case DType::F32: return 1e-5;
    case DType::F16: return 2e-3;
    case DType::BF16: return 1e-2;
    default: return 0;
  }
}
// The absolute tolerance per dtype: the same values as rtol_for.
double atol_for(DType dt) { return rtol_for(dt); }

}  // namespace

// ---------------------------------------------------------------- mm / bmm

TEST_CASE("linalg: mm against a triple loop for f32, f64, f16, bf16", "[linalg]") {
  kiln::manual_seed(51);
  for (DType dt : {DType::F64, DType::F32, DType::F16, DType::BF16}) {
    INFO("dtype " << kiln::dtype_name(dt));
    for (auto [n, k, m] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
             {3, 4, 5}, {1, 7, 1}, {17, 33, 9}, {64, 65, 63}, {1, 1, 1}}) {
      INFO("n k m = " << n << " " << k << " " << m);
      Tensor a = kiln::randn({n, k}, dt);
      Tensor b = kiln::randn({k, m}, dt);
      Tensor c = kiln::mm(a, b);
      CHECK(c.dtype() == dt);
      CHECK(c.sizes() == IntList{n, m});
      // reference from the (already rounded) inputs
      check_close_finite(c, naive_mm(a, b), rtol_for(dt), atol_for(dt) * std::sqrt(static_cast<double>(k)), "mm");
      check_close_finite(a.mm(b), values(c), 0, 0, "method mm");
    }
  }
}

TEST_CASE("linalg: bmm against a triple loop", "[linalg]") {
  kiln::manual_seed(52);
  for (DType dt : {DType::F64, DType::F32, DType::F16}) {
    INFO("dtype " << kiln::dtype_name(dt));
    for (auto [B, n, k, m] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>{
             {2, 3, 4, 5}, {5, 1, 3, 2}, {1, 6, 2, 7}, {3, 70, 80, 90}}) {
      INFO("B n k m = " << B << " " << n << " " << k << " " << m);
      Tensor a = kiln::randn({B, n, k}, dt);
      Tensor b = kiln::randn({B, k, m}, dt);
      Tensor c = kiln::bmm(a, b);
      CHECK(c.sizes() == IntList{B, n, m});
      CHECK(c.dtype() == dt);
      check_close_finite(c, naive_bmm(values(a), values(b), B, n, k, m), rtol_for(dt),
                         atol_for(dt) * std::sqrt(static_cast<double>(k)), "bmm");
      check_close_finite(a.bmm(b), values(c), 0, 0, "method bmm");
    }
  }
}

TEST_CASE("linalg: int64 matmul is exact", "[linalg]") {
  Tensor a = kiln::arange(6, DType::I64).view({2, 3});
  Tensor b = kiln::arange(12, DType::I64).view({3, 4});
  Tensor c = kiln::mm(a, b);
  CHECK(c.dtype() == DType::I64);
  check_close_finite(c, naive_mm(a, b), 0, 0);
}

// ---------------------------------------------------------------- matmul rank combinations

TEST_CASE("linalg: matmul for every rank combination", "[linalg]") {
  kiln::manual_seed(53);
  for (DType dt : {DType::F64, DType::F32}) {
    INFO("dtype " << kiln::dtype_name(dt));
    const double rt = rtol_for(dt), at = atol_for(dt);

    {
      INFO("1-D . 1-D -> 0-D dot product");
      Tensor a = kiln::randn({7}, dt), b = kiln::randn({7}, dt);
      Tensor c = kiln::matmul(a, b);
      CHECK(c.dim() == 0);
      check_close_finite(c, naive_bmm(values(a), values(b), 1, 1, 7, 1), rt, at);
    }
    {
      INFO("2-D . 1-D -> 1-D");
      Tensor a = kiln::randn({3, 7}, dt), b = kiln::randn({7}, dt);
      Tensor c = kiln::matmul(a, b);
      CHECK(c.sizes() == IntList{3});
      check_close_finite(c, naive_bmm(values(a), values(b), 1, 3, 7, 1), rt, at);
    }
    {
      INFO("1-D . 2-D -> 1-D");
      Tensor a = kiln::randn({7}, dt), b = kiln::randn({7, 4}, dt);
      Tensor c = kiln::matmul(a, b);
      CHECK(c.sizes() == IntList{4});
      check_close_finite(c, naive_bmm(values(a), values(b), 1, 1, 7, 4), rt, at);
    }
    {
      INFO("2-D . 2-D");
      Tensor a = kiln::randn({3, 7}, dt), b = kiln::randn({7, 4}, dt);
      Tensor c = kiln::matmul(a, b);
      CHECK(c.sizes() == IntList{3, 4});
      check_close_finite(c, naive_mm(a, b), rt, at);
    }
    {
      INFO("3-D . 2-D folds the batch");
      Tensor a = kiln::randn({2, 3, 7}, dt), b = kiln::randn({7, 4}, dt);
      Tensor c = kiln::matmul(a, b);
      CHECK(c.sizes() == IntList{2, 3, 4});
      check_close_finite(c, naive_bmm(values(a), values(b), 1, 6, 7, 4), rt, at);
    }
    {
      INFO("4-D . 2-D");
      Tensor a = kiln::randn({2, 2, 3, 7}, dt), b = kiln::randn({7, 4}, dt);
      Tensor c = kiln::matmul(a, b);
      CHECK(c.sizes() == IntList{2, 2, 3, 4});
      check_close_finite(c, naive_bmm(values(a), values(b), 1, 12, 7, 4), rt, at);
    }
    {
      INFO("3-D . 1-D");
      Tensor a = kiln::randn({2, 3, 7}, dt), b = kiln::randn({7}, dt);
      Tensor c = kiln::matmul(a, b);
      CHECK(c.sizes() == IntList{2, 3});
      check_close_finite(c, naive_bmm(values(a), values(b), 1, 6, 7, 1), rt, at);
    }
    {
      INFO("1-D . 3-D broadcasts the vector over the batch");
      Tensor a = kiln::randn({7}, dt), b = kiln::randn({2, 7, 4}, dt);
      Tensor c = kiln::matmul(a, b);
      CHECK(c.sizes() == IntList{2, 4});
      auto av = values(a), bv = values(b);
      std::vector<double> a2(av);
      a2.insert(a2.end(), av.begin(), av.end());
      check_close_finite(c, naive_bmm(a2, bv, 2, 1, 7, 4), rt, at);
    }
    {
      INFO("2-D . 3-D broadcasts the matrix over the batch");
      Tensor a = kiln::randn({3, 7}, dt), b = kiln::randn({2, 7, 4}, dt);
      Tensor c = kiln::matmul(a, b);
      CHECK(c.sizes() == IntList{2, 3, 4});
      auto av = values(a);
      std::vector<double> a2(av);
      a2.insert(a2.end(), av.begin(), av.end());
      check_close_finite(c, naive_bmm(a2, values(b), 2, 3, 7, 4), rt, at);
    }
    {
      INFO("3-D . 3-D");
      Tensor a = kiln::randn({5, 3, 7}, dt), b = kiln::randn({5, 7, 4}, dt);
      Tensor c = kiln::matmul(a, b);
      CHECK(c.sizes() == IntList{5, 3, 4});
      check_close_finite(c, naive_bmm(values(a), values(b), 5, 3, 7, 4), rt, at);
    }
    {
      INFO("broadcast batch [2,1,3,4] @ [5,4,2] -> [2,5,3,2]");
      Tensor a = kiln::randn({2, 1, 3, 4}, dt), b = kiln::randn({5, 4, 2}, dt);
      Tensor c = kiln::matmul(a, b);
      REQUIRE(c.sizes() == IntList{2, 5, 3, 2});
      auto av = values(a), bv = values(b), cv = values(c);
      for (int64_t i = 0; i < 2; ++i)
        for (int64_t j = 0; j < 5; ++j)
          for (int64_t r = 0; r < 3; ++r)
            for (int64_t s = 0; s < 2; ++s) {
              double want = 0;
              for (int64_t l = 0; l < 4; ++l) want += av[(i * 3 + r) * 4 + l] * bv[(j * 4 + l) * 2 + s];
              double got = cv[((i * 5 + j) * 3 + r) * 2 + s];
              INFO("i j r s = " << i << " " << j << " " << r << " " << s);
              CHECK(std::abs(got - want) <= at + rt * std::abs(want));
            }
    }
  }
}

// ---------------------------------------------------------------- non-contiguous operands

TEST_CASE("linalg: transposed and strided operands", "[linalg][strided]") {
  kiln::manual_seed(54);
  for (DType dt : {DType::F64, DType::F32, DType::F16}) {
    INFO("dtype " << kiln::dtype_name(dt));
    const double rt = rtol_for(dt), at = atol_for(dt) * 3;
    Tensor at_ = kiln::randn({6, 4}, dt).t();  // [4,6] column-major
    Tensor bt = kiln::randn({5, 6}, dt).t();   // [6,5] column-major
    Tensor a = kiln::randn({4, 6}, dt), b = kiln::randn({6, 5}, dt);
    REQUIRE_FALSE(at_.is_contiguous());
    check_close_finite(kiln::mm(at_, b), naive_mm(at_, b), rt, at, "A^T B");
    check_close_finite(kiln::mm(a, bt), naive_mm(a, bt), rt, at, "A B^T");
    check_close_finite(kiln::mm(at_, bt), naive_mm(at_, bt), rt, at, "A^T B^T");
    // neither stride is 1: every other row and column
    Tensor as = kiln::randn({8, 12}, dt).slice(0, 0, 8, 2).slice(1, 1, 12, 2);    // [4,6]
    Tensor bs = kiln::randn({12, 15}, dt).slice(0, 0, 12, 2).slice(1, 0, 15, 3);  // [6,5]
    REQUIRE(as.sizes() == IntList{4, 6});
    REQUIRE(bs.sizes() == IntList{6, 5});
    check_close_finite(kiln::mm(as, bs), naive_mm(as, bs), rt, at, "strided both");
    check_close_finite(kiln::mm(as, bt), naive_mm(as, bt), rt, at, "strided x transposed");
    // a row-major view with a leading dimension larger than the width (narrowed columns)
    Tensor an = kiln::randn({4, 10}, dt).narrow(1, 2, 6);
    check_close_finite(kiln::matmul(an, b), naive_mm(an, b), rt, at, "narrowed");
    // expanded (stride 0) operand
    Tensor ae = kiln::randn({1, 6}, dt).expand({4, 6});
    check_close_finite(kiln::mm(ae, b), naive_mm(ae, b), rt, at, "expanded rows");
    // batched: transposed last two dims, and a permuted batch dim
    Tensor ab = kiln::randn({3, 6, 4}, dt).transpose(1, 2);  // [3,4,6]
    Tensor bb = kiln::randn({6, 3, 5}, dt).transpose(0, 1);  // [3,6,5], batch stride 5
    check_close_finite(kiln::bmm(ab, bb), naive_bmm(values(ab), values(bb), 3, 4, 6, 5), rt, at, "bmm strided");
    check_close_finite(kiln::matmul(ab, bb), naive_bmm(values(ab), values(bb), 3, 4, 6, 5), rt, at,
                       "matmul 3d strided");
    check_close_finite(kiln::matmul(ab, bt),
                       naive_bmm(
                           values(ab),
                           [&] {
                             auto v = values(bt);
                             std::vector<double> r;
                             for (int i = 0; i < 3; ++i) r.insert(r.end(), v.begin(), v.end());
                             return r;
                           }(),
                           3, 4, 6, 5),
                       rt, at, "matmul 3d . transposed 2d");
    // a 1-D strided vector
    Tensor v = kiln::randn({12}, dt).slice(0, 0, 12, 2);
    check_close_finite(kiln::matmul(a, v), naive_bmm(values(a), values(v), 1, 4, 6, 1), rt, at, "strided vector");
  }
}

// ---------------------------------------------------------------- empty

TEST_CASE("linalg: empty operands", "[linalg][empty]") {
  Tensor c = kiln::mm(kiln::randn({0, 3}), kiln::randn({3, 4}));
  CHECK(c.sizes() == IntList{0, 4});
  Tensor z = kiln::mm(kiln::randn({3, 0}), kiln::randn({0, 4}));
  CHECK(z.sizes() == IntList{3, 4});
  check_close_finite(z, std::vector<double>(12, 0.0), 0, 0, "k = 0 gives zeros");
  CHECK(kiln::bmm(kiln::randn({0, 2, 3}), kiln::randn({0, 3, 4})).sizes() == IntList{0, 2, 4});
  CHECK(kiln::matmul(kiln::randn({2, 0, 3}), kiln::randn({3, 4})).sizes() == IntList{2, 0, 4});
  // gradient of a k = 0 product is empty
  Tensor a = kiln::randn({3, 0}, f64(true));
  Tensor b = kiln::randn({0, 4}, f64(true));
  REQUIRE_NOTHROW(kiln::mm(a, b).sum().backward());  // dA = G @ B^T has an empty [3, 0] output
  REQUIRE(a.grad().defined());
  CHECK(a.grad().sizes() == IntList{3, 0});
}

// ---------------------------------------------------------------- gradients

TEST_CASE("linalg: mm/bmm gradients have the closed-form values", "[linalg]") {
  kiln::manual_seed(55);
  Tensor a = kiln::randn({3, 4}, f64(true));
  Tensor b = kiln::randn({4, 2}, f64(true));
  Tensor g = kiln::randn({3, 2}, f64());
  kiln::mm(a, b).backward(g);
  // dA = G B^T, dB = A^T G
  check_close_finite(a.grad(), naive_mm(g, b.detach().t()), 1e-12, 1e-12, "dA");
  check_close_finite(b.grad(), naive_mm(a.detach().t(), g), 1e-12, 1e-12, "dB");
}

TEST_CASE("linalg: an operand stored transposed gets its gradient in its own layout", "[linalg]") {
  // linear's y = x W^T: W's gradient arrives contiguous (no copy in AccumulateGrad), with the
  // closed-form value; likewise for a transposed left operand and for bmm.
  kiln::manual_seed(57);
  Tensor w = kiln::randn({3, 5}, f64(true));
  Tensor x = kiln::randn({4, 5}, f64(true));
  Tensor g = kiln::randn({4, 3}, f64());
  bool arrived_contiguous = false;  // as the backward made it, before accumulation
  w.register_hook([&](const Tensor& gw) {
    arrived_contiguous = gw.is_contiguous();
    return Tensor();
  });
  kiln::mm(x, w.t()).backward(g);
  CHECK(arrived_contiguous);
  CHECK(w.grad().is_contiguous());
  check_close_finite(w.grad(), naive_mm(g.t(), x.detach()), 1e-12, 1e-12, "dW");
  check_close_finite(x.grad(), naive_mm(g, w.detach()), 1e-12, 1e-12, "dx");

  Tensor at = kiln::randn({5, 4}, f64(true));  // used as at.t(): [4, 5]
  Tensor b = kiln::randn({5, 3}, f64(true));
  kiln::mm(at.t(), b).backward(g);
  CHECK(at.grad().is_contiguous());
  check_close_finite(at.grad(), naive_mm(b.detach(), g.t()), 1e-12, 1e-12, "dA^T");

  Tensor bw = kiln::randn({2, 3, 5}, f64(true));  // used as bw.transpose(1, 2): [2, 5, 3]
  Tensor bx = kiln::randn({2, 4, 5}, f64(true));
  Tensor bg = kiln::randn({2, 4, 3}, f64());
  kiln::bmm(bx, bw.transpose(1, 2)).backward(bg);
  CHECK(bw.grad().is_contiguous());
  for (int64_t z = 0; z < 2; ++z)
    check_close_finite(bw.grad().select(0, z), naive_mm(bg.select(0, z).t(), bx.detach().select(0, z)), 1e-12, 1e-12,
                       "batched dW");
}

TEST_CASE("linalg: gradchecks", "[linalg][gradcheck]") {
  kiln::manual_seed(56);
  auto r = [](IntList s) { return kiln::randn(s, f64(true)); };
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::mm(in[0], in[1]); }, {r({3, 4}), r({4, 2})}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::bmm(in[0], in[1]); }, {r({2, 3, 4}), r({2, 4, 2})}));
  // matmul rank combinations
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::matmul(in[0], in[1]); }, {r({5}), r({5})}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::matmul(in[0], in[1]); }, {r({3, 5}), r({5})}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::matmul(in[0], in[1]); }, {r({5}), r({5, 2})}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::matmul(in[0], in[1]); }, {r({3, 5}), r({5, 2})}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::matmul(in[0], in[1]); }, {r({2, 3, 5}), r({5, 2})}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::matmul(in[0], in[1]); }, {r({2, 3, 5}), r({5})}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::matmul(in[0], in[1]); }, {r({5}), r({2, 5, 3})}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::matmul(in[0], in[1]); }, {r({3, 5}), r({2, 5, 2})}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::matmul(in[0], in[1]); }, {r({2, 3, 5}), r({2, 5, 2})}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::matmul(in[0], in[1]); }, {r({2, 1, 3, 4}), r({3, 4, 2})}));
  // transposed / strided operands
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::mm(in[0].t(), in[1].t()); }, {r({4, 3}), r({2, 4})}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::mm(in[0].slice(1, 0, 8, 2), in[1]); }, {r({3, 8}), r({4, 2})}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::bmm(in[0].transpose(1, 2), in[1]); },
                        {r({2, 4, 3}), r({2, 4, 2})}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::bmm(in[0], in[1].transpose(1, 2)); },
                        {r({2, 3, 4}), r({2, 2, 4})}));
  // the same tensor on both sides
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::mm(in[0], in[0].t()); }, {r({3, 4})}));
}

// ---------------------------------------------------------------- errors

TEST_CASE("linalg: shape and dtype errors", "[linalg][errors]") {
  auto r = [](IntList s, DType dt = DType::F32) { return kiln::randn(s, dt); };
  // inner dimensions
  REQUIRE_THROWS_AS(kiln::mm(r({3, 4}), r({5, 2})), kiln::Error);
  REQUIRE_THROWS_AS(kiln::bmm(r({2, 3, 4}), r({2, 5, 2})), kiln::Error);
  REQUIRE_THROWS_AS(kiln::matmul(r({3}), r({4})), kiln::Error);
  REQUIRE_THROWS_AS(kiln::matmul(r({3, 4}), r({3})), kiln::Error);
  REQUIRE_THROWS_AS(kiln::matmul(r({4}), r({3, 2})), kiln::Error);
  REQUIRE_THROWS_AS(kiln::matmul(r({3, 4}), r({5, 2})), kiln::Error);
  REQUIRE_THROWS_AS(kiln::matmul(r({2, 3, 4}), r({5, 2})), kiln::Error);
  REQUIRE_THROWS_AS(kiln::matmul(r({2, 3, 4}), r({2, 5, 2})), kiln::Error);
  // ranks
  REQUIRE_THROWS_AS(kiln::mm(r({2, 3, 4}), r({4, 2})), kiln::Error);
  REQUIRE_THROWS_AS(kiln::mm(r({4}), r({4, 2})), kiln::Error);
  REQUIRE_THROWS_AS(kiln::bmm(r({3, 4}), r({4, 2})), kiln::Error);
  REQUIRE_THROWS_AS(kiln::matmul(r({}), r({3})), kiln::Error);
  REQUIRE_THROWS_AS(kiln::matmul(r({3}), r({})), kiln::Error);
  // batch sizes
  REQUIRE_THROWS_AS(kiln::bmm(r({2, 3, 4}), r({3, 4, 2})), kiln::Error);
  REQUIRE_THROWS_AS(kiln::matmul(r({2, 3, 4}), r({3, 4, 5})), kiln::Error);
  REQUIRE_THROWS_AS(kiln::matmul(r({2, 2, 3, 4}), r({3, 4, 5})), kiln::Error);
  // dtypes
  REQUIRE_THROWS_AS(kiln::mm(r({3, 4}), r({4, 2}, DType::F64)), kiln::Error);
  REQUIRE_THROWS_AS(kiln::bmm(r({2, 3, 4}, DType::F16), r({2, 4, 2})), kiln::Error);
  REQUIRE_THROWS_AS(kiln::matmul(r({3, 4}, DType::F64), r({4})), kiln::Error);
  REQUIRE_THROWS_AS(kiln::matmul(kiln::ones({3, 4}, DType::I64), r({4, 2})), kiln::Error);
  // undefined
  REQUIRE_THROWS_AS(kiln::mm(Tensor(), r({4, 2})), kiln::Error);
  // the message names the shapes
  const std::string msg = error_of([&] { kiln::mm(r({3, 4}), r({5, 2})); });
  CHECK(msg.find("mm") != std::string::npos);
  CHECK(msg.find("[3, 4]") != std::string::npos);
  CHECK(msg.find("[5, 2]") != std::string::npos);
}
