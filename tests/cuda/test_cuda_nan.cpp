// NaN and Inf on the GPU: the ops of tests/core/test_nan_semantics.cpp (where the CPU is checked
// against PyTorch's exact outputs) on inputs with NaN, +inf and -inf sprinkled through rows long
// enough for the vector loads, block reductions and tails; the GPU must give the CPU's result
// with NaN in the same places (forward, and the gradient where the op has one).
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <kiln/kiln.h>
#include "../test_util.h"  // the repository root is not on test_cuda's include path
#include "cuda_test_util.h"

using kiln::DType;
using kiln::Tensor;
using kiln_cuda_test::kGpu;
namespace F = kiln::nn::functional;

namespace {

// Same NaNs, same infinities, finite values within tol * (1 + |cpu|): check_close.
void check_same(const Tensor& gpu, const Tensor& cpu, double tol, const std::string& what) {
  INFO(what);
  REQUIRE(gpu.sizes() == cpu.sizes());
  kiln_test::check_close(gpu, kiln_test::values(cpu), tol, tol, what);
}

// [rows, cols] of N(0, 1) with NaN, +inf and -inf at fixed spots (row 0 clean).
Tensor spiked(int64_t rows, int64_t cols, DType dt) {
  kiln::manual_seed(3);
  Tensor x = kiln::randn({rows, cols}, kiln::TensorOptions().dtype(DType::F64));
  double* p = x.data_ptr<double>();
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (int64_t r = 1; r < rows; ++r) {
    p[r * cols + (r * 37) % cols] = r % 3 == 0 ? inf : nan;
    if (r % 2 == 0) p[r * cols + (r * 11 + 5) % cols] = -inf;
  }
  return x.to(dt);
}

struct Case {
  const char* name;
  std::function<Tensor(const Tensor&)> f;
  bool grad;
};
}  // namespace

TEST_CASE("NaN and Inf: the GPU gives the CPU's (PyTorch's) results", "[cuda][nan]") {
  const std::vector<Case> cases = {
      {"relu", [](const Tensor& x) { return x.relu(); }, true},
      {"leaky_relu", [](const Tensor& x) { return F::leaky_relu(x, 0.1); }, true},
      {"gelu", [](const Tensor& x) { return x.gelu(); }, false},
      {"gelu tanh", [](const Tensor& x) { return x.gelu("tanh"); }, false},
      {"clamp", [](const Tensor& x) { return x.clamp(-0.5, 0.7); }, true},
      {"maximum",
       [](const Tensor& x) {
         return kiln::maximum(x, kiln::cat({x.slice(0, 1, x.size(0)), x.slice(0, 0, 1)}, 0));
       },
       false},
      {"minimum",
       [](const Tensor& x) {
         return kiln::minimum(x, kiln::cat({x.slice(0, 1, x.size(0)), x.slice(0, 0, 1)}, 0));
       },
       false},
      {"max", [](const Tensor& x) { return x.max(); }, false},
      {"max(dim) values", [](const Tensor& x) { return std::get<0>(x.max(1)); }, true},
      {"argmax", [](const Tensor& x) { return x.argmax(1); }, false},
      {"argmin", [](const Tensor& x) { return x.argmin(1); }, false},
      {"amax", [](const Tensor& x) { return x.amax({1}); }, false},
      {"amin dim 0", [](const Tensor& x) { return x.amin({0}); }, false},
      {"sum", [](const Tensor& x) { return x.sum({1}); }, false},
      {"mean", [](const Tensor& x) { return x.mean({1}); }, false},
      {"softmax", [](const Tensor& x) { return kiln::softmax(x, 1); }, false},
      {"log_softmax", [](const Tensor& x) { return kiln::log_softmax(x, 1); }, false},
      {"cross_entropy",
       [](const Tensor& x) {
         Tensor t = kiln::zeros({x.size(0)}, kiln::TensorOptions().dtype(DType::I64).device(x.device()));
         return kiln::cross_entropy(x, t, -100, 0.0, kiln::Reduction::None);
       },
       false},
      {"layer_norm", [](const Tensor& x) { return F::layer_norm(x, {x.size(1)}); }, false},
      {"max_pool2d",
       [](const Tensor& x) {
         return F::max_pool2d(x.reshape({1, x.size(0), 2, x.size(1) / 2}), 2);
       },
       true},
      {"batch_norm train",
       [](const Tensor& x) {
         return F::batch_norm(x.t().reshape({x.size(1), x.size(0), 1, 1}), Tensor(), Tensor(), Tensor(), Tensor(),
                              true);
       },
       false},
      {"batch_norm_relu train",
       [](const Tensor& x) {
         return F::batch_norm_relu(x.t().reshape({x.size(1), x.size(0), 1, 1}), Tensor(), Tensor(), Tensor(), Tensor(),
                                   true);
       },
       false},
      {"batch_norm_relu eval",
       [](const Tensor& x) {
         Tensor xr = x.reshape({1, x.size(0), 2, x.size(1) / 2});
         Tensor rm = kiln::zeros({x.size(0)}, x.options().requires_grad(false));
         Tensor rv = kiln::ones({x.size(0)}, x.options().requires_grad(false));
         return F::batch_norm_relu(xr, rm, rv, Tensor(), Tensor(), false);
       },
       true},
  };
  for (DType dt : {DType::F32, DType::F64}) {
    for (int64_t cols : {6, 1030}) {
      Tensor x = spiked(7, cols, dt);
      for (const Case& c : cases) {
        const std::string what = std::string(c.name) + " " + kiln::dtype_name(dt) + " cols " + std::to_string(cols);
        Tensor xc = x.detach().requires_grad_(c.grad), xg = x.to(kGpu).detach().requires_grad_(c.grad);
        Tensor yc = c.f(xc), yg = c.f(xg);
        check_same(yg, yc, dt == DType::F64 ? 1e-10 : 1e-4, what);
        if (c.grad) {
          yc.backward(kiln::ones_like(yc));
          yg.backward(kiln::ones_like(yg));
          check_same(xg.grad(), xc.grad(), dt == DType::F64 ? 1e-10 : 1e-4, what + " gradient");
        }
      }
    }
  }
}
