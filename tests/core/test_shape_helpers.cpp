// libtorch's helpers kiln gained together: kiln::tensor literals' dtypes, repeat, chunk, split,
// linspace, full_like with options, all/any, norm and einsum (values, gradients, errors).
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include <kiln/kiln.h>
#include <kiln/nn/functional.h>
#include "kiln/core/shape.h"
#include "tests/test_util.h"

using kiln::Tensor;
using kiln::TensorOptions;

using namespace kiln_test;

TEST_CASE("tensor literals: int64, float32, bool, explicit dtype wins", "[factory]") {
  auto i = kiln::tensor({1, 2, 0, 3});
  REQUIRE(i.dtype() == DType::I64);
  REQUIRE(values(i) == std::vector<double>{1, 2, 0, 3});
  int64_t big = (int64_t{1} << 53) + 1;  // exact in int64, not in double
  REQUIRE(kiln::tensor({big}).item<int64_t>() == big);
  REQUIRE(kiln::tensor({1.5, 2.0}).dtype() == DType::F32);
  REQUIRE(kiln::tensor({1.5, 2}).dtype() == DType::F32);  // any floating value: float32
  REQUIRE(kiln::tensor({1.5f}).dtype() == DType::F32);
  auto b = kiln::tensor({true, false});
  REQUIRE(b.dtype() == DType::Bool);
  REQUIRE(values(b) == std::vector<double>{1, 0});
  REQUIRE(kiln::tensor({1, 2}, DType::F64).dtype() == DType::F64);
  REQUIRE(kiln::tensor({1, 2}, f64(true)).requires_grad());
  REQUIRE(kiln::tensor({1.0, 2.0}, TensorOptions().dtype(DType::I32)).dtype() == DType::I32);
  REQUIRE(kiln::tensor({1.0, 2.0}, TensorOptions().requires_grad(true)).dtype() == DType::F32);
  // an int64 tensor cannot require grad (libtorch refuses too)
  REQUIRE_THROWS_AS(kiln::tensor({1, 2}, TensorOptions().requires_grad(true)), kiln::Error);
  REQUIRE_FALSE(TensorOptions().has_dtype());
  REQUIRE(TensorOptions(DType::F16).has_dtype());
}

TEST_CASE("repeat tiles like torch.repeat", "[shape]") {
  auto x = kiln::tensor({1.0, 2.0, 3.0, 4.0}).reshape({2, 2});
  auto r = x.repeat({2, 3});
  REQUIRE(r.sizes() == IntList{4, 6});
  REQUIRE(values(r.select(0, 0)) == std::vector<double>{1, 2, 1, 2, 1, 2});
  REQUIRE(values(r.select(0, 3)) == std::vector<double>{3, 4, 3, 4, 3, 4});
  auto r3 = kiln::tensor({1.0, 2.0}).repeat({2, 1, 2});  // leading dims added
  REQUIRE(r3.sizes() == IntList{2, 1, 4});
  REQUIRE(values(r3) == std::vector<double>{1, 2, 1, 2, 1, 2, 1, 2});
  REQUIRE(kiln::gradcheck([](const TL& in) { return in[0].repeat({3, 1, 2}); }, {kiln::randn({2, 3}, f64(true))}));
  REQUIRE(error_of([&] { x.repeat({2}); }).find("can not be smaller") != std::string::npos);
}

TEST_CASE("chunk and split", "[shape]") {
  auto x = kiln::arange(10, DType::F64);
  auto c = x.chunk(3);
  REQUIRE(c.size() == 3);
  REQUIRE(values(c[0]) == std::vector<double>{0, 1, 2, 3});
  REQUIRE(values(c[2]) == std::vector<double>{8, 9});
  REQUIRE(kiln::chunk(x, 6).size() == 5);  // ceil(10 / 6) = 2 each, as PyTorch
  auto s = kiln::split(x, 4);
  REQUIRE(s.size() == 3);
  REQUIRE(values(s[2]) == std::vector<double>{8, 9});
  auto m = kiln::randn({2, 5}, f64());
  auto ws = m.split(IntList{1, 4}, 1);
  REQUIRE(ws[0].sizes() == IntList{2, 1});
  REQUIRE(ws[1].sizes() == IntList{2, 4});
  REQUIRE(ws[1].storage() == m.storage());  // views
  REQUIRE(kiln::gradcheck(
      [](const TL& in) {
        auto p = in[0].chunk(2, -1);
        auto q = in[0].split(IntList{2, 3}, 1);
        return p[0] * 2.0 + p[1].sum(IntList{1}, true) + q[1].sum(IntList{1}, true);
      },
      {kiln::randn({3, 5}, f64(true))}));
  REQUIRE(error_of([&] { m.split(IntList{1, 3}, 1); }).find("sum to 4") != std::string::npos);
  REQUIRE(error_of([&] { m.chunk(0); }).find("positive number of chunks") != std::string::npos);
  REQUIRE(error_of([&] { m.split(0); }).find("split_size must be positive") != std::string::npos);
}

TEST_CASE("unbind: views of each index, one backward for all of them", "[shape]") {
  auto x = kiln::arange(24, DType::F64).view({2, 3, 4});
  auto parts = x.unbind(1);
  REQUIRE(parts.size() == 3);
  REQUIRE(parts[1].sizes() == IntList{2, 4});
  REQUIRE(values(parts[1]) == std::vector<double>{4, 5, 6, 7, 16, 17, 18, 19});
  REQUIRE(parts[2].storage() == x.storage());  // views
  REQUIRE(kiln::unbind(x, -1).size() == 4);
  REQUIRE(kiln::unbind(kiln::empty({0, 3}, f64()), 0).empty());
  REQUIRE(error_of([] { kiln::scalar_tensor(1.0).unbind(); }).find("at least one dimension") != std::string::npos);
  // a part that gets no gradient contributes zeros; parts used twice accumulate
  REQUIRE(kiln::gradcheck(
      [](const TL& in) {
        auto p = in[0].unbind(1);
        return p[0] * p[2] + p[0].sum();
      },
      {kiln::randn({3, 4, 2}, f64(true))}));
}

TEST_CASE("split and unbind of a permuted view: the gradient has the base's layout", "[shape]") {
  // The pattern of a fused q/k/v projection: [B, T, 3, H, D] -> [3, B, H, T, D] -> q, k, v.
  auto x = kiln::randn({2, 5, 3, 2, 4}, f64(true));
  auto base = x.permute({2, 0, 3, 1, 4});
  auto qkv = base.unbind(0);
  auto w = kiln::randn({2, 2, 5, 4}, f64());
  auto loss = (qkv[0] * w).sum() + (qkv[1] * qkv[2]).sum();
  auto g = kiln::autograd::grad({loss}, {base})[0];
  REQUIRE(g.sizes() == base.sizes());
  REQUIRE(g.strides() == base.strides());  // so the permute's backward is free
  auto again = x.permute({2, 0, 3, 1, 4}).unbind(0);
  auto gx = kiln::autograd::grad({(again[0] * w).sum() + (again[1] * again[2]).sum()}, {x})[0];
  REQUIRE(gx.is_contiguous());
  {
    kiln::NoGradGuard ng;
    auto xp = x.permute({2, 0, 3, 1, 4});
    std::vector<double> want = values(kiln::stack({w, xp[2], xp[1]}, 0).permute({1, 3, 0, 2, 4}).contiguous());
    check_close(gx, want, 1e-12, 0);
  }
  REQUIRE(kiln::gradcheck(
      [](const TL& in) {
        auto p = in[0].permute({2, 0, 1}).split(IntList{1, 2}, 0);
        return p[0].sum(IntList{0}) * p[1].sum(IntList{0});
      },
      {kiln::randn({4, 2, 3}, f64(true))}));
}

TEST_CASE("empty_like_siblings and view_of_tiled_parts: unbind parts' gradients in one buffer, no copy", "[shape]") {
  auto x = kiln::randn({2, 5, 3, 2, 4});  // [B, T, 3, H, D]
  auto base = x.permute({2, 0, 3, 1, 4});
  auto parts = base.unbind(0);
  auto sib = kiln::empty_like_siblings(parts, TensorOptions());
  REQUIRE(sib.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(sib[i].sizes() == parts[i].sizes());
    CHECK(sib[i].strides() == parts[i].strides());  // laid out as the parts are
    CHECK(sib[i].storage() == sib[0].storage());
    CHECK(sib[i].storage_offset() - sib[0].storage_offset() == parts[i].storage_offset() - parts[0].storage_offset());
  }
  // written into, they are the base's gradient as a view: same layout, every value in place
  for (size_t i = 0; i < 3; ++i) sib[i].copy_(parts[i] * double(i + 1));
  auto tiled = kiln::view_of_tiled_parts(sib, base.sizes(), base.strides(), 0, {0, 1, 2}, true);
  REQUIRE(tiled.defined());
  CHECK(tiled.storage() == sib[0].storage());
  CHECK(tiled.strides() == base.strides());
  auto scale = kiln::tensor({1.0, 2.0, 3.0}).view({3, 1, 1, 1, 1});
  check_close(tiled, values((base * scale).contiguous()), 0, 0);
  // not siblings: contiguous copies, or parts out of place
  auto separate = kiln::empty_like_siblings({parts[0].contiguous(), parts[1].contiguous()}, TensorOptions());
  CHECK(separate[0].storage() != separate[1].storage());
  CHECK_FALSE(
      kiln::view_of_tiled_parts({sib[0], sib[2], sib[1]}, base.sizes(), base.strides(), 0, {0, 1, 2}, true).defined());
  CHECK_FALSE(kiln::view_of_tiled_parts({sib[0], sib[1]}, base.sizes(), base.strides(), 0, {0, 1, 2}, true).defined());
  CHECK_FALSE(
      kiln::view_of_tiled_parts({sib[0].contiguous(), sib[1], sib[2]}, base.sizes(), base.strides(), 0, {0, 1, 2}, true)
          .defined());
}

TEST_CASE("attention on unbind parts of a fused projection: gradients equal, and the unbind copies nothing",
          "[shape]") {
  kiln::manual_seed(3);
  const int64_t B = 2, T = 7, H = 3, D = 5;
  auto x = kiln::randn({B, T, 3 * H * D}).requires_grad_();
  auto attend = [&](bool siblings) {
    auto qkv = x.view({B, T, 3, H, D}).permute({2, 0, 3, 1, 4}).unbind(0);
    // contiguous() makes three separate tensors: the plain path, the reference here
    auto q = siblings ? qkv[0] : qkv[0].contiguous(), k = siblings ? qkv[1] : qkv[1].contiguous();
    auto v = siblings ? qkv[2] : qkv[2].contiguous();
    return kiln::nn::functional::scaled_dot_product_attention(q, k, v, /*is_causal=*/true);
  };
  auto w = kiln::randn({B, H, T, D});
  auto g_ref = kiln::autograd::grad({(attend(false) * w).sum()}, {x})[0];
  auto loss = (attend(true) * w).sum();
  kiln::profiler::Profiler prof;
  auto g = kiln::autograd::grad({loss}, {x})[0];
  prof.stop();
  check_close(g, values(g_ref), 1e-5, 1e-5);
  int unbind_nodes = 0, copies_in_unbind = 0;
  for (const auto& e : prof.events()) {
    unbind_nodes += e.kind == kiln::profiler::EventKind::Node && e.name == "UnbindBackward";
    copies_in_unbind += e.kind == kiln::profiler::EventKind::Op && e.node == "UnbindBackward" && e.name == "copy_";
  }
  CHECK(unbind_nodes == 1);
  CHECK(copies_in_unbind == 0);
}

TEST_CASE("linspace and full_like with options", "[factory]") {
  auto l = kiln::linspace(0, 1, 5);
  REQUIRE(l.dtype() == DType::F32);
  check_close(l, {0, 0.25, 0.5, 0.75, 1}, 0, 1e-7);
  auto l64 = kiln::linspace(-1, 2, 4, DType::F64);
  REQUIRE(values(l64) == std::vector<double>{-1, 0, 1, 2});
  REQUIRE(values(kiln::linspace(3, 7, 1)) == std::vector<double>{3});
  REQUIRE(kiln::linspace(3, 7, 0).numel() == 0);
  REQUIRE_THROWS_AS(kiln::linspace(0, 1, -1), kiln::Error);
  auto x = kiln::zeros({2, 3}, DType::F64);
  auto f = kiln::full_like(x, 7, DType::I64);
  REQUIRE(f.dtype() == DType::I64);
  REQUIRE(f.sizes() == IntList{2, 3});
  REQUIRE(kiln::full_like(x, 1, TensorOptions().requires_grad(true)).dtype() == DType::F64);
  REQUIRE(kiln::zeros_like(x).dtype() == DType::F64);
  REQUIRE(kiln::randn_like(x).sizes() == x.sizes());
}

TEST_CASE("where with a scalar on either side", "[pointwise]") {
  auto c = kiln::tensor({true, false, true});
  auto t = kiln::tensor({1.0, 2.0, 3.0}, DType::F64);
  REQUIRE(values(kiln::where(c, 0.5, t)) == std::vector<double>{0.5, 2, 0.5});
  REQUIRE(values(kiln::where(c, t, -1.0)) == std::vector<double>{1, -1, 3});
}

TEST_CASE("all and any", "[reduce]") {
  auto x = kiln::tensor({1.0, 0.0, 2.0, 3.0}).reshape({2, 2});
  REQUIRE_FALSE(x.all().item<bool>());
  REQUIRE(x.any().item<bool>());
  REQUIRE(x.all().dtype() == DType::Bool);
  REQUIRE(values(x.all(1)) == std::vector<double>{0, 1});
  REQUIRE(values(x.all(0)) == std::vector<double>{1, 0});
  REQUIRE(x.any(1, true).sizes() == IntList{2, 1});
  REQUIRE_FALSE(kiln::zeros({3}).any().item<bool>());
  REQUIRE(kiln::all(kiln::tensor({true, true})).item<bool>());
  REQUIRE(kiln::tensor({std::nan("")}).all().item<bool>());  // NaN is non-zero
  REQUIRE(kiln::zeros({0}).all().item<bool>());
  REQUIRE_FALSE(kiln::zeros({0}).any().item<bool>());
  REQUIRE(kiln::tensor({0, 5}).any().item<bool>());
  REQUIRE_THROWS_AS(x.all(2), kiln::Error);
}

TEST_CASE("norm: values for p = 1, 2, inf, 3, 0 and gradients", "[reduce]") {
  auto x = kiln::tensor({3.0, -4.0, 0.0, 1.0}, DType::F64).reshape({2, 2});
  REQUIRE(x.norm().item<double>() == Approx(std::sqrt(26.0)));
  REQUIRE(x.norm(1).item<double>() == Approx(8.0));
  const double inf = std::numeric_limits<double>::infinity();
  REQUIRE(x.norm(inf).item<double>() == Approx(4.0));
  REQUIRE(x.norm(-inf).item<double>() == Approx(0.0));
  REQUIRE(x.norm(0).item<double>() == Approx(3.0));
  REQUIRE(x.norm(3).item<double>() == Approx(std::cbrt(27.0 + 64 + 1)));
  check_close(x.norm(2, {1}), {5.0, 1.0}, 1e-12, 0);
  REQUIRE(x.norm(2, {1}, true).sizes() == IntList{2, 1});
  REQUIRE(kiln::norm(x, 2, {0, 1}).dim() == 0);
  for (double p : {1.0, 2.0, 3.0, 1.5, inf}) {
    INFO("p = " << p);
    auto a = kiln::randn({3, 4}, f64(true));
    REQUIRE(kiln::gradcheck([p](const TL& in) { return in[0].norm(p); }, {a}));
    REQUIRE(kiln::gradcheck([p](const TL& in) { return in[0].norm(p, {1}); }, {a}));
    REQUIRE(kiln::gradcheck([p](const TL& in) { return kiln::norm(in[0], p, {0}, true); }, {a}));
  }
  // the gradient at a zero vector is 0, not NaN
  auto z = kiln::zeros({3}, f64(true));
  z.norm().backward();
  REQUIRE(values(z.grad()) == std::vector<double>{0, 0, 0});
  // second derivative through the custom backward
  auto a = kiln::randn({4}, f64(true));
  REQUIRE(kiln::gradcheck([](const TL& in) { return kiln::autograd::grad({in[0].norm()}, {in[0]}, {}, true, true)[0]; },
                          {a}));
  REQUIRE_THROWS_AS(kiln::tensor({1, 2}).norm(), kiln::Error);
}

TEST_CASE("einsum: common contractions equal their matmul forms", "[linalg]") {
  auto A = kiln::randn({3, 4}, f64()), B = kiln::randn({4, 5}, f64());
  check_same_tensor(kiln::einsum("ij,jk->ik", {A, B}), kiln::matmul(A, B), 1e-12, "ij,jk->ik");
  check_same_tensor(kiln::einsum("ij,jk", {A, B}), kiln::matmul(A, B), 1e-12, "implicit");
  auto X = kiln::randn({2, 3, 4}, f64()), Y = kiln::randn({2, 4, 5}, f64());
  check_same_tensor(kiln::einsum("bij,bjk->bik", {X, Y}), kiln::bmm(X, Y), 1e-12, "bmm");
  auto Q = kiln::randn({2, 3, 4, 8}, f64()), K = kiln::randn({2, 3, 6, 8}, f64());
  check_same_tensor(kiln::einsum("bhqd,bhkd->bhqk", {Q, K}), kiln::matmul(Q, K.transpose(-1, -2)), 1e-12,
                    "attention scores");
  auto u = kiln::randn({3}, f64()), v = kiln::randn({4}, f64());
  check_same_tensor(kiln::einsum("i,j->ij", {u, v}), u.unsqueeze(1) * v.unsqueeze(0), 1e-12, "outer");
  auto S = kiln::randn({4, 4}, f64());
  double trace = 0;
  for (int i = 0; i < 4; ++i) trace += S[i][i].item<double>();
  REQUIRE(kiln::einsum("ii->", {S}).item<double>() == Approx(trace));
  REQUIRE(kiln::einsum("ii->i", {S}).sizes() == IntList{4});
  check_same_tensor(kiln::einsum("ij->", {A}), A.sum(), 1e-12, "sum");
  check_same_tensor(kiln::einsum("ij->j", {A}), A.sum(IntList{0}), 1e-12, "sum out i");
  check_same_tensor(kiln::einsum("ij->ji", {A}), A.t(), 0, "transpose");
  check_same_tensor(kiln::einsum("i,i->", {u, u}), (u * u).sum(), 1e-12, "dot");
  auto C = kiln::randn({5, 2}, f64()), D = kiln::randn({6, 4}, f64());
  check_same_tensor(kiln::einsum("ij,jk,kl->il", {A, B, C}), kiln::matmul(kiln::matmul(A, B), C), 1e-12,
                    "three operands");
  check_same_tensor(kiln::einsum("ij,kj->ik", {A, D}), kiln::matmul(A, D.t()), 1e-12, "ij,kj");
}

TEST_CASE("einsum: gradients and errors", "[linalg]") {
  auto a = kiln::randn({2, 3, 4}, f64(true)), b = kiln::randn({2, 4, 3}, f64(true));
  REQUIRE(kiln::gradcheck([](const TL& in) { return kiln::einsum("bij,bjk->bik", in); }, {a, b}));
  REQUIRE(kiln::gradcheck([](const TL& in) { return kiln::einsum("bij,bji->b", in); }, {a, b}));
  auto s = kiln::randn({3, 3}, f64(true));
  REQUIRE(kiln::gradcheck([](const TL& in) { return kiln::einsum("ii->", in); }, {s}));
  REQUIRE(kiln::gradcheck([](const TL& in) { return kiln::einsum("ij,jk->ki", in); },
                          {kiln::randn({2, 3}, f64(true)), kiln::randn({3, 2}, f64(true))}));
  auto A = kiln::randn({3, 4});
  REQUIRE(error_of([&] {
            kiln::einsum("ij,jk->ik", {A, kiln::randn({5, 2})});
          }).find("has size 5") != std::string::npos);
  REQUIRE(error_of([&] { kiln::einsum("...ij->ij", {A}); }).find("ellipsis") != std::string::npos);
  REQUIRE(error_of([&] { kiln::einsum("ijk->i", {A}); }).find("has 2 dims") != std::string::npos);
  REQUIRE(error_of([&] { kiln::einsum("ij->iz", {A}); }).find("'z' does not appear") != std::string::npos);
  REQUIRE(error_of([&] { kiln::einsum("ij->ii", {A}); }).find("appears twice") != std::string::npos);
  REQUIRE(error_of([&] { kiln::einsum("ij,jk->ik", {A}); }).find("names 2 operands") != std::string::npos);
  REQUIRE(error_of([&] { kiln::einsum("iij->j", {kiln::randn({2, 2, 2})}); }).find("repeated") != std::string::npos);
}
