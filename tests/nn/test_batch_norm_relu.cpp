// batch_norm_relu (the fused BatchNorm + ReLU) against the composite relu(batch_norm(...)): forward,
// gradients and running statistics on odd sizes, [N, C], channels-last and eval mode; f64
// gradchecks (first and second order); argument errors; the model zoo's layers against an
// unfused reference.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <kiln/kiln.h>
#include <kiln/nn/functional.h>
#include <kiln/nn/nn.h>
#include "tests/nn/nn_test_util.h"

namespace {
namespace nn = kiln::nn;
using kiln::DType;
using kiln::IntList;
using kiln::Tensor;

// The same values with channels-last strides (C innermost in memory).
Tensor channels_last(const Tensor& x) {
  IntList to_cl{0}, from_cl{0, x.dim() - 1};
  for (int64_t i = 2; i < x.dim(); ++i) to_cl.push_back(i);
  to_cl.push_back(1);
  for (int64_t i = 1; i < x.dim() - 1; ++i) from_cl.push_back(i);
  return x.permute(to_cl).contiguous().permute(from_cl);
}

struct Result {
  Tensor y, dx, dw, db, rm, rv;
};

// Runs relu(batch_norm) fused or composite on leaf copies of the inputs, backward with g.
Result run(bool fused, const Tensor& x0, const Tensor& w0, const Tensor& b0, const Tensor& g, const Tensor& rm0,
           const Tensor& rv0, bool training, bool cl) {
  Tensor x = x0.detach().clone().requires_grad_(true);
  Tensor w = w0.defined() ? w0.detach().clone().requires_grad_(true) : Tensor();
  Tensor b = b0.defined() ? b0.detach().clone().requires_grad_(true) : Tensor();
  Tensor rm = rm0.defined() ? rm0.clone() : Tensor(), rv = rv0.defined() ? rv0.clone() : Tensor();
  Tensor xin = cl ? channels_last(x) : x;
  Tensor y = fused ? F::batch_norm_relu(xin, rm, rv, w, b, training, 0.1, 1e-5)
                   : kiln::relu(F::batch_norm(xin, rm, rv, w, b, training, 0.1, 1e-5));
  y.backward(g);
  return Result{y, x.grad(), w.defined() ? w.grad() : Tensor(), b.defined() ? b.grad() : Tensor(), rm, rv};
}

// The fused op equals the composite within `tol` (relative, 0: bit for bit), outputs and every
// gradient; the running statistics bit for bit.
void check_against_composite(const IntList& sizes, DType dt, bool affine, bool training, bool cl, double tol) {
  const int64_t C = sizes[1];
  Tensor x = (kiln::randn(sizes) * 1.5 + 0.3).to(dt);
  Tensor g = kiln::randn(sizes).to(dt);
  Tensor w = affine ? (kiln::randn({C}) + 0.5).to(dt) : Tensor();
  Tensor b = affine ? kiln::randn({C}).to(dt) : Tensor();
  Tensor rm = kiln::randn({C}) * 0.3, rv = kiln::rand({C}) + 0.5;
  Result f = run(true, x, w, b, g, rm, rv, training, cl);
  Result c = run(false, x, w, b, g, rm, rv, training, cl);
  INFO("sizes " << kiln::detail::concat(sizes) << " " << kiln::dtype_name(dt) << (affine ? " affine" : "")
                << (training ? " train" : " eval") << (cl ? " channels-last" : ""));
  REQUIRE(f.y.dtype() == dt);
  REQUIRE(f.y.sizes() == sizes);
  if (cl) CHECK_FALSE(f.y.is_contiguous());  // keeps the input's memory format
  check_close_rel(values(f.y), values(c.y), tol, "y");
  check_close_rel(values(f.dx), values(c.dx), tol, "dx");
  if (affine) {
    check_close_rel(values(f.dw), values(c.dw), tol, "dweight");
    check_close_rel(values(f.db), values(c.db), tol, "dbias");
  }
  check_close_rel(values(f.rm), values(c.rm), 0, "running_mean");
  check_close_rel(values(f.rv), values(c.rv), 0, "running_var");
  // the ReLU really applies: some outputs are clamped, some gradients are masked
  std::vector<double> yv = values(f.y);
  size_t zeros = 0;
  for (double v : yv) zeros += v == 0.0;
  CHECK(zeros > 0);
  CHECK(zeros < yv.size());
}

}  // namespace

// The fused kernel and the composite evaluate the same expressions from the same double sums, but
// the compiler may contract a * b + c into an FMA in one and not in the other, and differently on
// each ISA (AVX2 and AVX-512 builds differ in the last bit): an element may move by a few ulp of
// its terms, and a weight gradient, a sum of M = numel / C products, by M of them.
double fma_tol(const IntList& sizes, DType dt) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  const double M = static_cast<double>(n / sizes[1]);
  return dt == DType::F32 ? 4 * std::ldexp(1.0, -23) : 4 * M * std::ldexp(1.0, -52);
}

TEST_CASE("batch_norm_relu: forward and gradients equal relu(batch_norm(x))", "[norm][batch_norm_relu]") {
  kiln::manual_seed(11);
  // odd sizes: [N, C, S > 1] planes, [N, C] (the column path), 3-d input
  for (const IntList& sizes : std::vector<IntList>{{5, 3, 7, 9}, {17, 5}, {3, 2, 11}, {1, 4, 13}})
    for (bool affine : {true, false})
      for (bool training : {true, false}) {
        // Same expression, same coefficients, same order of the double sums: equal up to FMA
        // contraction (fma_tol).
        check_against_composite(sizes, DType::F32, affine, training, false, fma_tol(sizes, DType::F32));
        check_against_composite(sizes, DType::F64, affine, training, false, fma_tol(sizes, DType::F64));
      }
  // channels-last runs as an [N*S, C] kernel
  for (bool training : {true, false}) {
    check_against_composite({4, 6, 5, 3}, DType::F32, true, training, true, fma_tol({4, 6, 5, 3}, DType::F32));
    check_against_composite({3, 5, 4, 7}, DType::F64, false, training, true, fma_tol({3, 5, 4, 7}, DType::F64));
  }
  // large enough for the multi-threaded paths (>= 32768 elements). The [N, C] path adds per-thread
  // double partials in thread order, but f32 statistics and gradients are rounded from the double
  // sums, so the two runs still agree up to FMA contraction.
  for (const IntList& sizes : std::vector<IntList>{{16, 8, 17, 19}, {4099, 9}})
    check_against_composite(sizes, DType::F32, true, true, false, fma_tol(sizes, DType::F32));
  check_against_composite({8, 9, 23, 21}, DType::F32, true, true, true, fma_tol({8, 9, 23, 21}, DType::F32));
}

TEST_CASE("batch_norm_relu: 16-bit inputs compute in float32", "[norm][batch_norm_relu]") {
  kiln::manual_seed(12);
  for (DType dt : {DType::F16, DType::BF16}) {
    INFO(kiln::dtype_name(dt));
    // The fused mask is taken on the f32 pre-activation, relu's on the rounded output: they can
    // only differ where the output rounds to zero, so compare within the 16-bit tolerance.
    check_against_composite({6, 4, 5, 3}, dt, true, true, false, 2e-2);
  }
  // autocast: the op runs in f32 like batch_norm
  Tensor x = kiln::randn({4, 3, 5, 5}), w = kiln::randn({3}), b = kiln::randn({3});
  Tensor want = F::batch_norm_relu(x.to(DType::BF16).to(DType::F32), Tensor(), Tensor(), w, b, true);
  kiln::amp::Autocast ac(DType::BF16);
  Tensor got = F::batch_norm_relu(x.to(DType::BF16), Tensor(), Tensor(), w, b, true);
  CHECK(got.dtype() == DType::F32);
  check_close_rel(values(got), values(want), 0, "autocast");
}

TEST_CASE("batch_norm_relu: running statistics, then eval mode", "[norm][batch_norm_relu]") {
  kiln::manual_seed(13);
  const int64_t C = 3;
  Tensor rm1 = kiln::zeros({C}), rv1 = kiln::ones({C}), rm2 = kiln::zeros({C}), rv2 = kiln::ones({C});
  Tensor w = kiln::randn({C}), b = kiln::randn({C});
  for (int step = 0; step < 3; ++step) {
    Tensor x = kiln::randn({7, C, 3, 5}) + static_cast<double>(step);
    Tensor yf = F::batch_norm_relu(x, rm1, rv1, w, b, true, 0.2);
    Tensor yc = kiln::relu(F::batch_norm(x, rm2, rv2, w, b, true, 0.2));
    check_close_rel(values(yf), values(yc), 0, "train y");
  }
  check_close_rel(values(rm1), values(rm2), 0, "running_mean");
  check_close_rel(values(rv1), values(rv2), 0, "running_var");
  Tensor x = kiln::randn({5, C, 4, 4});
  std::vector<double> rm_before = values(rm1);
  check_close_rel(values(F::batch_norm_relu(x, rm1, rv1, w, b, false)),
                  values(kiln::relu(F::batch_norm(x, rm2, rv2, w, b, false))), 0, "eval y");
  check_close_rel(values(rm1), rm_before, 0, "eval leaves running stats alone");
}

TEST_CASE("batch_norm_relu: f64 gradchecks of x, weight and bias", "[norm][batch_norm_relu]") {
  kiln::manual_seed(14);
  const TL xwb = check_batch_norm_gradchecks([](const auto&... args) { return F::batch_norm_relu(args...); });
  const Tensor &x = xwb[0], &w = xwb[1];
  // channels-last
  CHECK(kiln::gradcheck(
      [](const TL& in) {
        return F::batch_norm_relu(in[0].permute({0, 3, 1, 2}), Tensor(), Tensor(), in[1], in[2], true);
      },
      {kiln::randn({2, 3, 2, 3}, f64(true)), kiln::randn({3}, f64(true)), kiln::randn({3}, f64(true))}));
  // a bias that does not require grad still shapes the mask
  Tensor bc = kiln::randn({2}, f64());
  CHECK(kiln::gradcheck([&](const TL& in) { return F::batch_norm_relu(in[0], Tensor(), Tensor(), in[1], bc, true); },
                        {x, w}));
}

TEST_CASE("batch_norm_relu: second derivative through create_graph", "[norm][batch_norm_relu]") {
  kiln::manual_seed(15);
  Tensor x = kiln::randn({4, 2, 3}, f64(true));
  Tensor w = kiln::randn({2}, f64(true)), b = kiln::randn({2}, f64(true));
  Tensor gy = kiln::randn({4, 2, 3}, f64());
  // create_graph gradients equal the fused backward's
  {
    Tensor y = F::batch_norm_relu(x, Tensor(), Tensor(), w, b, true);
    auto g1 = kiln::autograd::grad({y}, {x, w, b}, {gy}, true, true);
    auto g2 = kiln::autograd::grad({F::batch_norm_relu(x, Tensor(), Tensor(), w, b, true)}, {x, w, b}, {gy});
    for (int i = 0; i < 3; ++i)
      check_close_rel(values(g1[i]), values(g2[i]), 1e-12, "create_graph grad " + std::to_string(i));
  }
  CHECK(kiln::gradcheck(
      [&](const TL& in) {
        Tensor y = F::batch_norm_relu(in[0], Tensor(), Tensor(), in[1], in[2], true);
        TL g = kiln::autograd::grad({y}, {in[0]}, {gy}, true, true);
        return (g[0] * gy).sum();
      },
      {x, w, b}));
}

TEST_CASE("batch_norm_relu: bad arguments throw kiln::Error naming the op", "[norm][batch_norm_relu]") {
  Tensor x = kiln::randn({4, 6, 3});
  CHECK_THROWS_AS(F::batch_norm_relu(x, Tensor(), Tensor(), kiln::ones({3}), Tensor(), true), kiln::Error);
  CHECK_THROWS_AS(F::batch_norm_relu(x, Tensor(), Tensor(), Tensor(), kiln::ones({7}), true), kiln::Error);
  CHECK_THROWS_AS(F::batch_norm_relu(x, kiln::zeros({5}), kiln::ones({5}), Tensor(), Tensor(), true), kiln::Error);
  CHECK_THROWS_AS(F::batch_norm_relu(x, kiln::zeros({6}), Tensor(), Tensor(), Tensor(), true), kiln::Error);
  CHECK_THROWS_AS(F::batch_norm_relu(x, Tensor(), Tensor(), Tensor(), Tensor(), false), kiln::Error);
  CHECK_THROWS_AS(F::batch_norm_relu(kiln::randn({1, 3}), Tensor(), Tensor(), Tensor(), Tensor(), true), kiln::Error);
  CHECK_THROWS_AS(F::batch_norm_relu(kiln::randn({5}), Tensor(), Tensor(), Tensor(), Tensor(), true), kiln::Error);
  CHECK_THROWS_AS(F::batch_norm_relu(kiln::ones({4, 3}, DType::I64), Tensor(), Tensor(), Tensor(), Tensor(), true),
                  kiln::Error);
  CHECK_THROWS_AS(F::batch_norm_relu(x, Tensor(), Tensor(), kiln::ones({6}, DType::F64), Tensor(), true), kiln::Error);
  const std::string m = error_of([&] { F::batch_norm_relu(x, Tensor(), Tensor(), kiln::ones({3}), Tensor(), true); });
  CHECK(m.find("batch_norm_relu") != std::string::npos);
  CHECK(m.find("weight") != std::string::npos);
  CHECK(m.find("[4, 6, 3]") != std::string::npos);
}

TEST_CASE("model zoo: the CNN and a ResNet block keep the names and the unfused results", "[models][batch_norm_relu]") {
  kiln::manual_seed(17);
  nn::models::FashionCNN net;
  std::vector<std::string> want = {
      "conv1.weight", "bn1.weight", "bn1.bias",   "bn1.running_mean", "bn1.running_var", "bn1.num_batches_tracked",
      "conv2.weight", "bn2.weight", "bn2.bias",   "bn2.running_mean", "bn2.running_var", "bn2.num_batches_tracked",
      "fc1.weight",   "fc1.bias",   "fc2.weight", "fc2.bias"};
  std::vector<std::string> got = net.state_dict().keys();
  std::sort(want.begin(), want.end());
  std::sort(got.begin(), got.end());
  CHECK(got == want);
  // forward against the unfused formula on the same modules' parameters
  Tensor x = kiln::randn({3, 1, 28, 28});
  auto bn = [](nn::BatchNorm& m, const Tensor& h) {
    return kiln::relu(F::batch_norm(h, Tensor(), Tensor(), m.weight, m.bias, true, 0.1, m.options.eps()));
  };
  Tensor h = F::max_pool2d(bn(*net.bn1, (*net.conv1)(x)), 2);
  h = F::max_pool2d(bn(*net.bn2, (*net.conv2)(h)), 2);
  Tensor ref = (*net.fc2)(kiln::relu((*net.fc1)(h.flatten(1))));
  check_close_rel(values(net(x)), values(ref), 1e-6, "FashionCNN");

  // ResNet basic block: relu(bn1(conv1)) as a declared chain
  nn::models::BasicBlock blk(4, 8, 2);
  Tensor xb = kiln::randn({2, 4, 9, 9});
  Tensor out = bn(blk.bn1, blk.conv1(xb));
  out = F::batch_norm(blk.conv2(out), Tensor(), Tensor(), blk.bn2.weight, blk.bn2.bias, true);
  Tensor ref_b = kiln::relu(out + (*blk.downsample)(xb));
  check_close_rel(values(blk(xb)), values(ref_b), 1e-6, "BasicBlock");
}
