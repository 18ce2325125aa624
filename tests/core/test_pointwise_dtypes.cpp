// Pointwise ops: dtype promotion (and gradients in the input's dtype), 16-bit dtypes within
// stated tolerances, in-place ops and their autograd guard rails, broadcasting with gradients
// summed back, non-contiguous and empty inputs, undefined operands.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include <kiln/kiln.h>
#include "tests/core/pointwise_test_util.h"
#include "tests/test_util.h"

using namespace kiln_test;
using namespace pointwise_test;
using kiln::DType;
using kiln::Tensor;
using kiln::TensorOptions;

// ---------------------------------------------------------------- dtype promotion

namespace {

// CHECKs that r has the dtype want and the values vals (within rtol).
void check_result(const Tensor& r, DType want, const std::vector<double>& vals, double rtol = 0) {
  CHECK(r.dtype() == want);
  check_close(r, vals, rtol, 0);
}

}  // namespace

TEST_CASE("pointwise: dtype promotion", "[pointwise]") {
  Tensor i64 = kiln::tensor(std::vector<int64_t>{1, 2, 3});
  Tensor i32 = kiln::tensor(std::vector<int32_t>{4, 5, 6});
  Tensor f32 = kiln::tensor({0.5, 0.25, 2.0});
  Tensor f64t = kiln::tensor({0.5, 0.25, 2.0}, f64());
  Tensor f16 = f32.to(DType::F16);
  Tensor bf16 = f32.to(DType::BF16);

  SECTION("int + float -> float") {
    check_result(i64 + f32, DType::F32, {1.5, 2.25, 5.0});
    CHECK((f32 * i64).dtype() == DType::F32);
    CHECK((i32 + f64t).dtype() == DType::F64);
    CHECK((i64 + f16).dtype() == DType::F16);
  }
  SECTION("f32 + f64 -> f64, 16-bit + f32 -> f32") {
    check_result(f32 + f64t, DType::F64, {1.0, 0.5, 4.0});
    CHECK((f16 + f32).dtype() == DType::F32);
    CHECK((bf16 * f32).dtype() == DType::F32);
    CHECK((f16 + f64t).dtype() == DType::F64);
    CHECK((f16 + bf16).dtype() == DType::F32);
  }
  SECTION("int op int stays integral; int32 + int64 -> int64") {
    check_result(i64 + i32, DType::I64, {5, 7, 9});
    check_result(i64 * i64, DType::I64, {1, 4, 9});
    CHECK((i64 - i32).dtype() == DType::I64);
    check_result(i64 + 2.0, DType::I64, {3, 4, 5});
    CHECK((i64 * 3.0).dtype() == DType::I64);
    check_result(10.0 - i64, DType::I64, {9, 8, 7});
  }
  SECTION("int / int is true division in float32") {
    Tensor num = kiln::tensor(std::vector<int64_t>{7, -7, 1});
    Tensor den = kiln::tensor(std::vector<int64_t>{2, 2, 3});
    check_result(num / den, DType::F32, {3.5, -3.5, 1.0 / 3.0}, 1e-6);
    check_result(num / 2.0, DType::F32, {3.5, -3.5, 0.5}, 1e-7);
    check_result(1.0 / den, DType::F32, {0.5, 0.5, 1.0 / 3.0}, 1e-6);
    CHECK((i32 / i32).dtype() == DType::F32);
  }
  SECTION("int with a fractional scalar -> float32") {
    check_result(i64 * 0.5, DType::F32, {0.5, 1.0, 1.5});
    check_result(i64 + 0.5, DType::F32, {1.5, 2.5, 3.5});
    check_result(0.5 - i64, DType::F32, {-0.5, -1.5, -2.5});
  }
  SECTION("float math on ints computes in float32") {
    CHECK(kiln::exp(i64).dtype() == DType::F32);
    check_close(kiln::sqrt(kiln::tensor(std::vector<int64_t>{4, 9})), {2.0, 3.0}, 1e-7, 0);
    CHECK(kiln::sigmoid(i64).dtype() == DType::F32);
    CHECK(kiln::abs(i64).dtype() == DType::I64);
    CHECK(kiln::neg(i64).dtype() == DType::I64);
    CHECK(kiln::relu(i64).dtype() == DType::I64);
  }
  SECTION("int ** integral scalar stays integral (PyTorch: tensor([1,2,3])**2 is int64)") {
    check_result(kiln::pow(i64, 2.0), DType::I64, {1, 4, 9});
    CHECK(i64.square().dtype() == DType::I64);
    check_result(kiln::pow(i64, 3.0), DType::I64, {1, 8, 27});
  }
  SECTION("16-bit ops keep their dtype") {
    CHECK((f16 + f16).dtype() == DType::F16);
    CHECK((bf16 * bf16).dtype() == DType::BF16);
    CHECK(kiln::exp(f16).dtype() == DType::F16);
    CHECK(kiln::gelu(bf16).dtype() == DType::BF16);
    CHECK((f16 * 2.0).dtype() == DType::F16);
  }
}

TEST_CASE("pointwise: gradient dtype matches the input's dtype under promotion", "[pointwise]") {
  Tensor a = kiln::tensor({1.0, 2.0}, TensorOptions().dtype(DType::F32).requires_grad(true));
  Tensor b = kiln::tensor({3.0, 4.0}, f64(true));
  (a * b).sum().backward();
  REQUIRE(a.grad().defined());
  CHECK(a.grad().dtype() == DType::F32);
  CHECK(b.grad().dtype() == DType::F64);
  check_close(a.grad(), {3.0, 4.0}, 0, 0);
  check_close(b.grad(), {1.0, 2.0}, 0, 0);
}

// ---------------------------------------------------------------- 16-bit forward

TEST_CASE("pointwise: f16 and bf16 forward within stated tolerances", "[pointwise][half]") {
  // Tolerances: bf16 has an 8-bit mantissa (unit roundoff 2^-9 ~ 2e-3), f16 an 11-bit one
  // (2^-12 ~ 2.4e-4). The reference uses the 16-bit-rounded inputs in double, so only the
  // rounding of the result (plus float opmath) is tested: rel 1e-2 for bf16, 2e-3 for f16.
  kiln::manual_seed(22);
  Tensor x32 = kiln::randn({6, 9}) * 2.0;
  Tensor y32 = kiln::rand({6, 9}) + 0.5;
  for (DType dt : {DType::F16, DType::BF16}) {
    INFO("dtype " << kiln::dtype_name(dt));
    const double rtol = dt == DType::F16 ? 2e-3 : 1e-2;
    const double atol = dt == DType::F16 ? 1e-3 : 1e-2;
    Tensor x = x32.to(dt), y = y32.to(dt);
    auto xv = values(x), yv = values(y);  // already rounded to dt
    struct Case {
      const char* name;
      Tensor got;
      std::vector<double> want;
    };
    std::vector<Case> cases = {
        {"add", x + y, map2(xv, yv, [](double a, double b) { return a + b; })},
        {"sub", x - y, map2(xv, yv, [](double a, double b) { return a - b; })},
        {"mul", x * y, map2(xv, yv, [](double a, double b) { return a * b; })},
        {"div", x / y, map2(xv, yv, [](double a, double b) { return a / b; })},
        {"x*3+1", x * 3.0 + 1.0, map1(xv, [](double a) { return a * 3.0 + 1.0; })},
        {"1-x", 1.0 - x, map1(xv, [](double a) { return 1.0 - a; })},
        {"exp", kiln::exp(x), map1(xv, [](double a) { return std::exp(a); })},
        {"log", kiln::log(y), map1(yv, [](double a) { return std::log(a); })},
        {"sqrt", kiln::sqrt(y), map1(yv, [](double a) { return std::sqrt(a); })},
        {"rsqrt", kiln::rsqrt(y), map1(yv, [](double a) { return 1.0 / std::sqrt(a); })},
        {"tanh", kiln::tanh(x), map1(xv, [](double a) { return std::tanh(a); })},
        {"sigmoid", kiln::sigmoid(x), map1(xv, ref_sigmoid)},
        {"relu", kiln::relu(x), map1(xv, [](double a) { return a > 0 ? a : 0.0; })},
        {"gelu", kiln::gelu(x), map1(xv, ref_gelu)},
        {"gelu tanh", kiln::gelu(x, "tanh"), map1(xv, ref_gelu_tanh)},
        {"silu", kiln::silu(x), map1(xv, [](double a) { return a * ref_sigmoid(a); })},
        {"erf", kiln::erf(x), map1(xv, [](double a) { return std::erf(a); })},
        {"pow 3", kiln::pow(y, 3.0), map1(yv, [](double a) { return a * a * a; })},
        {"clamp", x.clamp(-1.0, 1.0), map1(xv, [](double a) { return std::min(std::max(a, -1.0), 1.0); })},
        {"maximum", kiln::maximum(x, y), map2(xv, yv, [](double a, double b) { return std::max(a, b); })},
    };
    for (auto& c : cases) {
      INFO(c.name);
      CHECK(c.got.dtype() == dt);
      check_close(c.got, c.want, rtol, atol, c.name);
    }
  }
}

TEST_CASE("pointwise: f16 overflow becomes inf, like IEEE half", "[pointwise][half]") {
  Tensor x = kiln::tensor({300.0, 1.0}).to(DType::F16);
  auto v = values(x * x);  // 90000 > 65504
  CHECK(v[0] == INFINITY);
  CHECK(v[1] == 1.0);
  // bf16 has f32's range
  auto w = values(kiln::tensor({300.0}).to(DType::BF16) * 300.0);
  CHECK(std::isfinite(w[0]));
  CHECK(std::abs(w[0] - 90000.0) <= 1e-2 * 90000.0);
}

// ---------------------------------------------------------------- in-place

TEST_CASE("pointwise: in-place add_, mul_, div_, clamp_ and compound operators", "[pointwise][inplace]") {
  kiln::manual_seed(23);
  Tensor a = kiln::randn({3, 4}, f64());
  Tensor b = kiln::randn({3, 4}, f64());
  auto av = values(a), bv = values(b);
  Tensor t = a.clone();
  uint64_t v0 = t.version();
  Tensor& r = t.add_(b);
  CHECK(&r == &t);
  CHECK(t.version() > v0);
  check_close(t, map2(av, bv, [](double x, double y) { return x + y; }), 1e-14, 1e-14, "add_");
  t = a.clone();
  t.add_(b, -2.0);
  check_close(t, map2(av, bv, [](double x, double y) { return x - 2.0 * y; }), 1e-14, 1e-14, "add_ alpha");
  t = a.clone();
  t.add_(1.5);
  check_close(t, map1(av, [](double x) { return x + 1.5; }), 1e-14, 1e-14, "add_ scalar");
  t = a.clone();
  t.mul_(b);
  check_close(t, map2(av, bv, [](double x, double y) { return x * y; }), 1e-14, 1e-14, "mul_");
  t = a.clone();
  t.mul_(-3.0);
  check_close(t, map1(av, [](double x) { return -3.0 * x; }), 1e-14, 1e-14, "mul_ scalar");
  t = a.clone();
  t.sub_(b);
  check_close(t, map2(av, bv, [](double x, double y) { return x - y; }), 1e-14, 1e-14, "sub_");
  t = a.clone();
  t.div_(4.0);
  check_close(t, map1(av, [](double x) { return x / 4.0; }), 1e-14, 1e-14, "div_ scalar");
  t = a.clone();
  t.clamp_(-0.5, 0.5);
  check_close(t, map1(av, [](double x) { return std::min(std::max(x, -0.5), 0.5); }), 0, 0, "clamp_");

  t = a.clone();
  t += b;
  t *= 2.0;
  t -= 1.0;
  t /= 4.0;
  check_close(t, map2(av, bv, [](double x, double y) { return ((x + y) * 2.0 - 1.0) / 4.0; }), 1e-14, 1e-14,
              "compound");

  // broadcast other into self: [3,4] += [4]
  t = a.clone();
  Tensor row = kiln::tensor({1.0, 2.0, 3.0, 4.0}, f64());
  t.add_(row);
  std::vector<double> want(av.size());
  for (size_t i = 0; i < av.size(); ++i) want[i] = av[i] + (i % 4) + 1.0;
  check_close(t, want, 1e-14, 1e-14, "add_ broadcast");
  // the result must fit in self: [4] += [3,4] is an error
  Tensor small = row.clone();
  REQUIRE_THROWS_AS(small.add_(a), kiln::Error);
  REQUIRE_THROWS_AS(small.mul_(a), kiln::Error);

  // other of another dtype is converted
  Tensor f = kiln::zeros({3}, DType::F32);
  f.add_(kiln::tensor(std::vector<int64_t>{1, 2, 3}));
  CHECK(f.dtype() == DType::F32);
  check_close(f, {1, 2, 3}, 0, 0, "f32 add_ int64");
  // in-place true division on an int tensor is refused
  Tensor it = kiln::tensor(std::vector<int64_t>{4, 6});
  REQUIRE_THROWS_AS(it.div_(kiln::tensor(std::vector<int64_t>{2, 4})), kiln::Error);
}

TEST_CASE("pointwise: in-place into a float result an int tensor cannot hold throws", "[pointwise][inplace]") {
  // PyTorch: "result type Float can't be cast to the desired output type Long".
  Tensor it = kiln::tensor(std::vector<int64_t>{1, 2, 3});
  REQUIRE_THROWS_AS(it.add_(kiln::tensor({0.5, 0.5, 0.5})), kiln::Error);
  REQUIRE_THROWS_AS(it.mul_(kiln::tensor({0.5, 0.5, 0.5})), kiln::Error);
}

TEST_CASE("pointwise: in-place on non-contiguous views writes through to the base", "[pointwise][inplace]") {
  Tensor base = kiln::arange(12, f64()).view({3, 4});
  Tensor tv = base.t();                                 // [4,3], non-contiguous
  tv.add_(kiln::tensor({100.0, 200.0, 300.0}, f64()));  // adds per row of base
  check_close(base, {100, 101, 102, 103, 204, 205, 206, 207, 308, 309, 310, 311}, 0, 0, "transpose add_");
  Tensor b2 = kiln::arange(10, f64());
  b2.slice(0, 1, 10, 3).mul_(-1.0);  // elements 1, 4, 7
  check_close(b2, {0, -1, 2, 3, -4, 5, 6, -7, 8, 9}, 0, 0, "strided mul_");
  Tensor b3 = kiln::arange(6, f64()).view({2, 3});
  b3.select(1, 1).clamp_(2.0, 3.0);  // column 1: {1, 4} -> {2, 3}
  check_close(b3, {0, 2, 2, 3, 3, 5}, 0, 0, "column clamp_");
}

TEST_CASE("pointwise: in-place on a leaf that requires grad throws in grad mode", "[pointwise][inplace]") {
  Tensor w = kiln::tensor({1.0, 2.0}, f64(true));
  Tensor o = kiln::tensor({1.0, 1.0}, f64());
  REQUIRE_THROWS_AS(w.add_(o), kiln::Error);
  REQUIRE_THROWS_AS(w.add_(1.0), kiln::Error);
  REQUIRE_THROWS_AS(w.mul_(o), kiln::Error);
  REQUIRE_THROWS_AS(w.mul_(2.0), kiln::Error);
  REQUIRE_THROWS_AS(w.clamp_(0.0, 1.0), kiln::Error);
  REQUIRE_THROWS_AS(w += o, kiln::Error);
  check_close(w, {1.0, 2.0}, 0, 0, "unchanged after refusals");
  {
    kiln::NoGradGuard ng;
    w.add_(o);
    w.mul_(2.0);
    w.clamp_(0.0, 5.0);
  }
  check_close(w, {4.0, 5.0}, 0, 0, "updated under NoGradGuard");
  CHECK(w.requires_grad());
  CHECK(w.is_leaf());
  // still usable in a graph afterwards
  (w * w).sum().backward();
  check_close(w.grad(), {8.0, 10.0}, 0, 0);
}

TEST_CASE("pointwise: modifying a tensor saved for backward makes backward throw", "[pointwise][inplace]") {
  Tensor x = kiln::tensor({0.5, 1.0}, f64(true));
  Tensor y = kiln::exp(x);  // ExpBackward saves y
  Tensor z = y * 2.0;
  {
    kiln::NoGradGuard ng;
    y.add_(1.0);
  }
  REQUIRE_THROWS_AS(z.sum().backward(), kiln::Error);
}

// ---------------------------------------------------------------- broadcasting

TEST_CASE("pointwise: broadcasting [3,1] + [4] -> [3,4] and gradients summed back", "[pointwise][broadcast]") {
  Tensor a = kiln::tensor({1.0, 2.0, 3.0}, f64()).view({3, 1}).detach();
  a.requires_grad_(true);
  Tensor b = kiln::tensor({10.0, 20.0, 30.0, 40.0}, f64(true));
  Tensor s = a + b;
  REQUIRE(s.sizes() == kiln::IntList{3, 4});
  check_close(s, {11, 21, 31, 41, 12, 22, 32, 42, 13, 23, 33, 43}, 0, 0, "values");
  s.sum().backward();
  REQUIRE(a.grad().sizes() == kiln::IntList{3, 1});
  REQUIRE(b.grad().sizes() == kiln::IntList{4});
  check_close(a.grad(), {4, 4, 4}, 0, 0, "a grad = 4 per row");
  check_close(b.grad(), {3, 3, 3, 3}, 0, 0, "b grad = 3 per column");

  // mul: d/da = sum_j b_j, d/db = sum_i a_i
  Tensor a2 = kiln::tensor({1.0, 2.0, 3.0}, f64()).view({3, 1}).detach();
  a2.requires_grad_(true);
  Tensor b2 = kiln::tensor({10.0, 20.0, 30.0, 40.0}, f64(true));
  (a2 * b2).sum().backward();
  check_close(a2.grad(), {100, 100, 100}, 0, 0, "mul a grad");
  check_close(b2.grad(), {6, 6, 6, 6}, 0, 0, "mul b grad");

  // sub with the broadcast operand on the right, div
  Tensor a3 = kiln::tensor({1.0, 2.0, 3.0}, f64()).view({3, 1}).detach();
  a3.requires_grad_(true);
  Tensor b3 = kiln::tensor({1.0, 2.0, 4.0, 8.0}, f64(true));
  (b3 - a3).sum().backward();
  check_close(a3.grad(), {-4, -4, -4}, 0, 0, "sub a grad");
  check_close(b3.grad(), {3, 3, 3, 3}, 0, 0, "sub b grad");
}

TEST_CASE("pointwise: broadcasting shapes and gradchecks", "[pointwise][broadcast][gradcheck]") {
  kiln::manual_seed(24);
  Tensor a = kiln::randn({2, 1, 4}, f64(true));
  Tensor b = kiln::rand({3, 1}, f64(true));
  Tensor c = kiln::scalar_tensor(1.7, f64(true));
  CHECK((a + b).sizes() == kiln::IntList{2, 3, 4});
  CHECK((a * c).sizes() == kiln::IntList{2, 1, 4});
  CHECK((kiln::zeros({5, 1, 3}) + kiln::zeros({4, 1})).sizes() == kiln::IntList{5, 4, 3});
  CHECK(kiln::gradcheck([](const TL& in) { return in[0] + in[1]; }, {a, b}));
  CHECK(kiln::gradcheck([](const TL& in) { return in[0] - in[1]; }, {a, b}));
  CHECK(kiln::gradcheck([](const TL& in) { return in[0] * in[1]; }, {a, b}));
  CHECK(kiln::gradcheck([](const TL& in) { return in[0] / (in[1] + 0.5); }, {a, b}));
  CHECK(kiln::gradcheck([](const TL& in) { return in[0] * in[2] + in[1]; }, {a, b, c}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::add(in[0], in[1], 0.3); }, {a, b}));

  // the broadcast result values
  auto av = values(a), bv = values(b), sv = values(a * b);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) CHECK(sv[(i * 3 + j) * 4 + k] == av[i * 4 + k] * bv[j]);

  REQUIRE_THROWS_AS(kiln::randn({3, 4}) + kiln::randn({3}), kiln::Error);
  REQUIRE_THROWS_AS(kiln::randn({2, 3}) * kiln::randn({3, 2}), kiln::Error);
  REQUIRE_THROWS_AS(kiln::randn({2, 3}) < kiln::randn({4}), kiln::Error);
}

// ---------------------------------------------------------------- non-contiguous inputs

TEST_CASE("pointwise: non-contiguous inputs (transpose, strided slice, expand)", "[pointwise][strided]") {
  kiln::manual_seed(25);
  Tensor base = kiln::randn({4, 6}, f64());
  Tensor tr = base.t();                 // [6,4]
  Tensor sl = base.slice(1, 0, 6, 2);   // [4,3] stride 2
  Tensor sl2 = base.slice(0, 1, 4, 2);  // [2,6] every other row
  REQUIRE_FALSE(tr.is_contiguous());
  REQUIRE_FALSE(sl.is_contiguous());
  auto trv = values(tr), slv = values(sl);

  check_close(kiln::exp(tr), map1(trv, [](double v) { return std::exp(v); }), 1e-14, 1e-14, "exp transpose");
  check_close(kiln::gelu(sl), map1(slv, ref_gelu), 1e-12, 1e-12, "gelu strided");
  check_close(kiln::sigmoid(sl2), map1(values(sl2), ref_sigmoid), 1e-14, 1e-14, "sigmoid rows");
  // transposed + contiguous operands of the same shape
  Tensor other = kiln::randn({6, 4}, f64());
  check_close(tr + other, map2(trv, values(other), [](double x, double y) { return x + y; }), 1e-14, 1e-14, "t + c");
  check_close(other * tr, map2(values(other), trv, [](double x, double y) { return x * y; }), 1e-14, 1e-14, "c * t");
  // two different non-contiguous operands
  Tensor tr2 = kiln::randn({4, 6}, f64()).t();
  check_close(tr - tr2, map2(trv, values(tr2), [](double x, double y) { return x - y; }), 1e-14, 1e-14, "t - t");
  // expanded (stride 0) operand
  Tensor ex = kiln::randn({1, 4}, f64()).expand({6, 4});
  check_close(tr / (ex.abs() + 1.0), map2(trv, values(ex), [](double x, double y) { return x / (std::abs(y) + 1.0); }),
              1e-14, 1e-14, "t / expanded");
  check_close(tr > 0.0, map1(trv, [](double v) { return v > 0 ? 1.0 : 0.0; }), 0, 0, "cmp transpose");
  check_close(kiln::where(tr > 0.0, tr, other),
              map2(trv, values(other), [](double x, double y) { return x > 0 ? x : y; }), 0, 0, "where transpose");
  // 16-bit non-contiguous
  Tensor h = base.to(DType::F16).t();
  check_close(kiln::tanh(h), map1(values(h), [](double v) { return std::tanh(v); }), 2e-3, 1e-3, "f16 tanh transpose");
}

TEST_CASE("pointwise: gradcheck through non-contiguous views", "[pointwise][strided][gradcheck]") {
  kiln::manual_seed(26);
  Tensor a = kiln::randn({4, 3}, f64(true));
  Tensor b = kiln::randn({3, 4}, f64(true));
  Tensor c = kiln::rand({4, 6}, f64(true));
  CHECK(kiln::gradcheck([](const TL& in) { return in[0].t() * in[1]; }, {a, b}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::tanh(in[0].t()) + in[1]; }, {a, b}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::log(in[0].slice(1, 0, 6, 2) + 0.5); }, {c}));
  CHECK(kiln::gradcheck([](const TL& in) { return kiln::gelu(in[0].slice(1, 1, 6, 2)) * in[1].t(); }, {c, b}));
}

// ---------------------------------------------------------------- empty tensors

TEST_CASE("pointwise: empty tensors", "[pointwise][empty]") {
  Tensor e = kiln::zeros({0, 3});
  Tensor r = kiln::randn({3});
  CHECK((e + r).sizes() == kiln::IntList{0, 3});
  CHECK((e * e).numel() == 0);
  CHECK(kiln::exp(e).sizes() == kiln::IntList{0, 3});
  CHECK(kiln::gelu(e).numel() == 0);
  CHECK((e > 0.0).dtype() == DType::Bool);
  CHECK((e > 0.0).numel() == 0);
  CHECK(kiln::where(e > 0.0, e, 1.0).sizes() == kiln::IntList{0, 3});
  CHECK((1.0 - e).sizes() == kiln::IntList{0, 3});
  CHECK(kiln::isnan(e).numel() == 0);
  Tensor ec = e.clone();
  ec.add_(1.0);
  ec.mul_(r);
  CHECK(ec.numel() == 0);
  // [0,3] broadcast against [1,3] and [2,0,3]
  CHECK((e + kiln::ones({1, 3})).sizes() == kiln::IntList{0, 3});
  CHECK((kiln::ones({2, 1, 3}) * e).sizes() == kiln::IntList{2, 0, 3});
  // autograd through empties gives empty gradients of the right shape
  Tensor g = kiln::zeros({0, 3}, f64(true));
  Tensor h = kiln::randn({3}, f64(true));
  (kiln::exp(g) * h).sum().backward();
  REQUIRE(g.grad().defined());
  CHECK(g.grad().sizes() == kiln::IntList{0, 3});
  REQUIRE(h.grad().defined());
  check_close(h.grad(), {0, 0, 0}, 0, 0, "grad of broadcast over 0 rows");
  // [0] vs [2] cannot broadcast
  REQUIRE_THROWS_AS(kiln::zeros({0}) + kiln::zeros({2}), kiln::Error);
}

// ---------------------------------------------------------------- errors

TEST_CASE("pointwise: undefined operands give kiln::Error", "[pointwise][errors]") {
  Tensor u;
  Tensor x = kiln::randn({2});
  REQUIRE_THROWS_AS(u + x, kiln::Error);
  REQUIRE_THROWS_AS(x * u, kiln::Error);
  REQUIRE_THROWS_AS(kiln::exp(u), kiln::Error);
}
