// Tensor creation, dtypes and conversions, views, zero-copy wrapping, printing and bad input.
#include <catch2/catch.hpp>

#include <cmath>
#include <sstream>

#include <kiln/kiln.h>
#include "tests/test_util.h"

using kiln::DType;
using kiln::Tensor;
using kiln::TensorOptions;
using kiln_test::values;

TEST_CASE("creation functions fill and shape tensors", "[tensor]") {
  auto z = kiln::zeros({2, 3});
  REQUIRE(z.sizes() == kiln::IntList{2, 3});
  REQUIRE(z.dtype() == DType::F32);
  REQUIRE(z.numel() == 6);
  REQUIRE(values(z) == std::vector<double>(6, 0.0));
  REQUIRE(values(kiln::ones({2}, DType::I32)) == std::vector<double>{1, 1});
  REQUIRE(values(kiln::full({3}, 2.5, DType::F64)) == std::vector<double>{2.5, 2.5, 2.5});
  REQUIRE(values(kiln::arange(5)) == std::vector<double>{0, 1, 2, 3, 4});
  REQUIRE(values(kiln::arange(1, 2, 0.25)) == std::vector<double>{1, 1.25, 1.5, 1.75});
  REQUIRE(kiln::arange(4, DType::I64).dtype() == DType::I64);
  auto t = kiln::tensor(std::vector<int64_t>{3, -1, 7});
  REQUIRE(t.dtype() == DType::I64);
  REQUIRE(t[2].item<int64_t>() == 7);
  auto e = kiln::empty({0, 4});
  REQUIRE(e.numel() == 0);
  REQUIRE(kiln::scalar_tensor(4.0).dim() == 0);
  REQUIRE(kiln::ones({2}, TensorOptions().requires_grad(true)).requires_grad());
}

TEST_CASE("dtype conversions round like PyTorch", "[tensor]") {
  auto x = kiln::tensor({1.0, -2.5, 65504.0, 1e-8, 3.14159265358979, 70000.0});
  auto h = x.to(DType::F16);
  REQUIRE(h.element_size() == 2);
  auto back = values(h);
  REQUIRE(back[0] == 1.0);
  REQUIRE(back[1] == -2.5);
  REQUIRE(back[2] == 65504.0);                   // the largest half
  REQUIRE(back[3] == Approx(0.0).margin(6e-8));  // below the smallest subnormal half: 0 or 6e-8
  REQUIRE(back[4] == Approx(3.140625));          // 3.1416 rounds to the nearest half
  REQUIRE(std::isinf(back[5]));                  // overflow -> inf
  auto b = x.to(DType::BF16);
  REQUIRE(values(b)[4] == Approx(3.140625));  // bf16 keeps 8 bits of mantissa
  REQUIRE(values(b)[5] == 70144.0);
  // f32 -> int truncates toward zero, -> bool is != 0
  REQUIRE(values(kiln::tensor({1.7, -1.7, 0.0}).to(DType::I64)) == std::vector<double>{1, -1, 0});
  REQUIRE(values(kiln::tensor({1.7, 0.0}).to(DType::Bool)) == std::vector<double>{1, 0});
  // round trip every half bit pattern that is finite
  for (uint32_t bits = 0; bits < 0x7c00; bits += 7) {
    float f = kiln::Half::to_float(static_cast<uint16_t>(bits));
    REQUIRE(kiln::Half::from_float(f) == bits);
  }
  REQUIRE(std::isnan(static_cast<float>(kiln::Half(NAN))));
  REQUIRE(std::isnan(static_cast<float>(kiln::BFloat16(NAN))));
}

TEST_CASE("item and element access", "[tensor]") {
  auto x = kiln::arange(6, DType::F64).reshape({2, 3});
  REQUIRE(x[1][2].item<double>() == 5.0);
  REQUIRE(x.select(1, 0)[1].item<float>() == 3.0f);
  REQUIRE_THROWS_AS(x.item<double>(), kiln::Error);     // more than one element
  REQUIRE_THROWS_AS(x.data_ptr<float>(), kiln::Error);  // wrong type
  REQUIRE(x.size(-1) == 3);
  REQUIRE_THROWS_AS(x.size(2), kiln::Error);
}

TEST_CASE("views share storage and compute strides", "[tensor]") {
  auto x = kiln::arange(24, DType::F64).reshape({2, 3, 4});
  auto t = x.transpose(0, 2);
  REQUIRE(t.sizes() == kiln::IntList{4, 3, 2});
  REQUIRE_FALSE(t.is_contiguous());
  REQUIRE(t.storage() == x.storage());
  REQUIRE(t[3][2][1].item<double>() == x[1][2][3].item<double>());
  auto p = x.permute({1, 2, 0});
  REQUIRE(p.strides() == kiln::IntList{4, 1, 12});
  REQUIRE(values(x.narrow(2, 1, 2)[0][0]) == std::vector<double>{1, 2});
  REQUIRE(values(x.slice(2, 0, 4, 2)[1][2]) == std::vector<double>{20, 22});
  REQUIRE(x.unsqueeze(1).sizes() == kiln::IntList{2, 1, 3, 4});
  REQUIRE(x.unsqueeze(-1).sizes() == kiln::IntList{2, 3, 4, 1});
  REQUIRE(x.unsqueeze(1).squeeze(1).sizes() == x.sizes());
  REQUIRE(kiln::zeros({1, 3, 1}).squeeze().sizes() == kiln::IntList{3});
  auto e = kiln::arange(3).view({3, 1}).expand({3, 4});
  REQUIRE(e.strides() == kiln::IntList{1, 0});
  REQUIRE(values(e[2]) == std::vector<double>{2, 2, 2, 2});
  REQUIRE(x.flatten(1).sizes() == kiln::IntList{2, 12});
  REQUIRE(x.view({-1, 8}).sizes() == kiln::IntList{3, 8});
  // a transposed tensor cannot be viewed flat, but reshape copies
  REQUIRE_THROWS_AS(t.view({24}), kiln::Error);
  auto r = t.reshape({24});
  REQUIRE(r.is_contiguous());
  REQUIRE(values(r)[1] == 12.0);  // t[0][0][1] = x[1][0][0]
  auto c = t.contiguous();
  REQUIRE(c.is_contiguous());
  REQUIRE(values(c) == values(r));
}

TEST_CASE("view and shape errors name the op and the shapes", "[tensor][errors]") {
  auto x = kiln::zeros({2, 3});
  REQUIRE_THROWS_WITH(x.view({4, 2}), Catch::Contains("view") && Catch::Contains("[4, 2]"));
  REQUIRE_THROWS_AS(x.view({-1, -1}), kiln::Error);
  REQUIRE_THROWS_AS(x.permute({0, 0}), kiln::Error);
  REQUIRE_THROWS_AS(x.permute({0}), kiln::Error);
  REQUIRE_THROWS_AS(x.expand({4, 3}), kiln::Error);
  REQUIRE_THROWS_AS(x.narrow(1, 2, 2), kiln::Error);
  REQUIRE_THROWS_WITH(x.select(0, 5), Catch::Contains("select") && Catch::Contains("out of range"));
  REQUIRE_THROWS_AS(x.transpose(0, 2), kiln::Error);
  REQUIRE_THROWS_AS(kiln::zeros({-1}), kiln::Error);
  REQUIRE_THROWS_WITH(x + kiln::zeros({4}), Catch::Contains("[2, 3]") && Catch::Contains("[4]"));
}

TEST_CASE("from_blob wraps memory without copying", "[tensor]") {
  std::vector<float> buf = {1, 2, 3, 4, 5, 6};
  bool deleted = false;
  {
    auto t = kiln::from_blob(buf.data(), {2, 3}, [&](void*) { deleted = true; });
    REQUIRE(t.data_ptr() == buf.data());
    buf[4] = 50;
    REQUIRE(t[1][1].item<float>() == 50.0f);
    t.mul_(2.0);
    REQUIRE(buf[0] == 2.0f);
    auto strided = kiln::from_blob(buf.data(), {3}, {2}, {});
    REQUIRE(values(strided) == std::vector<double>{2, 6, 100});
  }
  REQUIRE(deleted);
  std::vector<int64_t> ids = {5, 7};
  auto it = kiln::from_blob(ids.data(), {2}, {}, DType::I64);
  REQUIRE(it[1].item<int64_t>() == 7);
}

TEST_CASE("printing summarises like PyTorch", "[tensor]") {
  std::ostringstream os;
  os << kiln::tensor({1.0, 2.0, 3.0});
  REQUIRE(os.str() == "tensor([1., 2., 3.])");
  os.str("");
  os << kiln::tensor({0.5, -1.25}, TensorOptions().dtype(DType::F64).requires_grad(true));
  REQUIRE(os.str() == "tensor([ 0.5000, -1.2500], dtype=float64, requires_grad=True)");
  os.str("");
  os << kiln::arange(4, DType::I64).reshape({2, 2});
  REQUIRE(os.str() == "tensor([[0, 1],\n        [2, 3]])");
  os.str("");
  os << kiln::arange(2000);
  REQUIRE(os.str() == "tensor([0.0000e+00, 1.0000e+00, 2.0000e+00,  ..., 1.9970e+03, 1.9980e+03, 1.9990e+03])");
  os.str("");
  os << kiln::arange(100, 1300).reshape({400, 3});
  REQUIRE(os.str() ==
          "tensor([[ 100.,  101.,  102.],\n        [ 103.,  104.,  105.],\n        [ 106.,  107.,  108.],\n        "
          "...,\n        [1291., 1292., 1293.],\n        [1294., 1295., 1296.],\n        [1297., 1298., 1299.]])");
  os.str("");
  auto y = kiln::ones({2}, TensorOptions().requires_grad(true)) * 2.0;
  os << y;
  REQUIRE(os.str().find("grad_fn=<MulBackward>") != std::string::npos);
  os.str("");
  os << kiln::tensor(std::vector<bool>{true, false});
  REQUIRE(os.str() == "tensor([ True, False])");
}

TEST_CASE("device handling without CUDA", "[tensor][errors]") {
  REQUIRE(kiln::Device::parse("cuda:1") == kiln::Device::cuda(1));
  REQUIRE(kiln::Device::parse("cpu").is_cpu());
  REQUIRE_THROWS_AS(kiln::Device::parse("gpu"), kiln::Error);
  if (!kiln::cuda::is_available()) {
    REQUIRE_THROWS_AS(kiln::zeros({2}, kiln::Device::cuda(0)), kiln::Error);
    REQUIRE_THROWS_AS(kiln::zeros({2}).to(kiln::Device::cuda(0)), kiln::Error);
  }
}

TEST_CASE("pinned host memory falls back to ordinary memory without CUDA", "[tensor]") {
  auto x = kiln::arange(10).pin_memory();
  REQUIRE(values(x)[9] == 9.0);
  REQUIRE(x.is_pinned() == kiln::cuda::is_available());
}

TEST_CASE("elementwise results keep a dense input's memory format", "[tensor]") {
  auto nchw = kiln::randn({2, 3, 4, 5});
  auto nhwc = nchw.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2});  // channels-last
  REQUIRE(nhwc.strides() == kiln::IntList{60, 1, 15, 3});
  auto r = kiln::relu(nhwc);
  REQUIRE(r.strides() == nhwc.strides());
  REQUIRE(kiln::equal(r, kiln::relu(nchw)));
  auto s = nhwc + kiln::randn({3, 1, 1});  // broadcast operand: the full-size one decides
  REQUIRE(s.strides() == nhwc.strides());
  auto t = kiln::zeros({3, 4}).t();  // transposed: dense, kept
  REQUIRE((t * 2.0).strides() == t.strides());
  auto sliced = kiln::zeros({4, 6}).slice(1, 0, 6, 2);  // not dense: contiguous result
  REQUIRE((sliced + 1.0).is_contiguous());
}
