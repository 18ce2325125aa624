// batch_norm_relu_max_pool2d (the fused conv-block tail BN -> ReLU -> 2x2 max pool): forward,
// gradients and running statistics equal max_pool2d(relu(batch_norm(x)), 2) computed op by op,
// in training and eval mode, for odd sizes (a last row/column outside every window), with and
// without affine parameters; f64 gradchecks; the composite fallback for channels-last inputs;
// errors.
#include <kiln/nn/fused/conv_block.h>
#include "tests/nn/nn_test_util.h"

namespace {

Tensor composite(const Tensor& x, const Tensor& rm, const Tensor& rv, const Tensor& w, const Tensor& b, bool training) {
  return F::max_pool2d(kiln::relu(F::batch_norm(x, rm, rv, w, b, training, 0.1, 1e-5)), 2);
}

Tensor fused(const Tensor& x, const Tensor& rm, const Tensor& rv, const Tensor& w, const Tensor& b, bool training) {
  return F::batch_norm_relu_max_pool2d(x, rm, rv, w, b, training, 0.1, 1e-5);
}

struct Run : BatchNormRun {
  Tensor y, dx;
};

// One forward + backward with a fixed upstream gradient; affine: weight and bias defined.
Run run(bool use_fused, const Tensor& x0, const Tensor& w0, const Tensor& b0, const Tensor& g, bool training,
        bool affine, bool channels_last_input = false) {
  Run r;
  Tensor x = (channels_last_input ? channels_last(x0) : x0.clone()).detach().requires_grad_();
  const BatchNormArgs bn(affine, w0, b0, x0.size(1), x0.dtype());
  r.rm = bn.running_mean;
  r.rv = bn.running_var;
  r.y = use_fused ? fused(x, r.rm, r.rv, bn.weight, bn.bias, training)
                  : composite(x, r.rm, r.rv, bn.weight, bn.bias, training);
  r.y.backward(g);
  r.dx = x.grad();
  bn.take_grads(r.dw, r.db);
  return r;
}

const auto same = check_same_tensor;

}  // namespace

TEST_CASE("batch_norm_relu_max_pool2d: equals batch_norm -> relu -> max_pool2d", "[norm][pool]") {
  kiln::manual_seed(21);
  const std::vector<IntList> shapes = {{4, 3, 6, 8}, {2, 5, 7, 9}, {3, 2, 2, 2}, {2, 4, 28, 37}};
  for (const IntList& s : shapes)
    for (DType dt : {DType::F32, DType::F64})
      for (int training = 0; training < 2; ++training)
        for (int affine = 0; affine < 2; ++affine) {
          INFO("shape " << s[0] << "x" << s[1] << "x" << s[2] << "x" << s[3] << " dtype " << dt << " training "
                        << training << " affine " << affine);
          Tensor x = kiln::randn(s, dt) * 2.0 + 0.3;
          Tensor w = kiln::rand({s[1]}, dt) + 0.5;
          Tensor b = kiln::randn({s[1]}, dt) * 0.5;
          Tensor g = kiln::randn({s[0], s[1], s[2] / 2, s[3] / 2}, dt);
          Run f = run(true, x, w, b, g, training, affine);
          Run c = run(false, x, w, b, g, training, affine);
          const double tol = dt == DType::F32 ? 2e-5 : 1e-12;
          same(f.y, c.y, tol, "output");
          same(f.dx, c.dx, tol, "dx");
          check_same_batch_norm(f, c, affine, tol, 1e-12);
          CHECK(f.y.is_contiguous());
        }
}

TEST_CASE("batch_norm_relu_max_pool2d: channels-last and strided inputs take the composite path", "[norm][pool]") {
  kiln::manual_seed(22);
  Tensor x = kiln::randn({3, 4, 6, 7});
  Tensor w = kiln::rand({4}) + 0.5, b = kiln::randn({4});
  Tensor g = kiln::randn({3, 4, 3, 3});
  Run f = run(true, x, w, b, g, true, true, /*channels_last_input=*/true);
  Run c = run(false, x, w, b, g, true, true);
  same(f.y, c.y, 2e-5, "output");
  same(f.dx, c.dx, 2e-5, "dx");
  same(f.dw, c.dw, 2e-5, "dweight");
  Tensor xs = kiln::randn({3, 4, 7, 6}).transpose(2, 3);  // [3, 4, 6, 7], not contiguous
  kiln::NoGradGuard ng;
  same(fused(xs, Tensor(), Tensor(), w, b, true), composite(xs, Tensor(), Tensor(), w, b, true), 2e-5,
       "strided output");
}

TEST_CASE("batch_norm_relu_max_pool2d: gradcheck (f64)", "[norm][pool][gradcheck]") {
  kiln::manual_seed(23);
  auto r = [](IntList s) { return kiln::randn(s, f64(true)); };
  // training: gradients through the batch statistics, weight and bias
  CHECK(kiln::gradcheck(
      [](const TL& in) { return F::batch_norm_relu_max_pool2d(in[0], Tensor(), Tensor(), in[1], in[2], true); },
      {r({3, 2, 4, 5}), r({2}), r({2})}));
  // eval with running statistics, no affine parameters
  Tensor rm = kiln::tensor({0.1, -0.2}, f64()), rv = kiln::tensor({0.7, 1.3}, f64());
  CHECK(kiln::gradcheck(
      [&](const TL& in) { return F::batch_norm_relu_max_pool2d(in[0], rm, rv, Tensor(), Tensor(), false); },
      {r({2, 2, 5, 4})}));
}

TEST_CASE("batch_norm_relu_max_pool2d: errors name the op and the shapes", "[norm][pool]") {
  Tensor w = kiln::ones({3}), b = kiln::zeros({3});
  auto call = [&](const Tensor& x, const Tensor& ww) {
    return F::batch_norm_relu_max_pool2d(x, Tensor(), Tensor(), ww, b, true);
  };
  REQUIRE_THROWS_AS(call(kiln::randn({2, 3, 1, 4}), w), kiln::Error);                // no 2x2 window fits
  REQUIRE_THROWS_AS(call(kiln::randn({2, 3, 8}), w), kiln::Error);                   // not 4-D
  REQUIRE_THROWS_AS(call(kiln::randn({2, 3, 4, 4}), kiln::ones({4})), kiln::Error);  // weight size
  try {
    call(kiln::randn({2, 3, 1, 4}), w);
  } catch (const kiln::Error& e) {
    CHECK(std::string(e.what()).find("batch_norm_relu_max_pool2d") != std::string::npos);
  }
}
