// CUDA vs CPU parity for every core op on random inputs (never zeros): sizes 1, 7, 1023, 4097,
// non-contiguous views and broadcasting; f16/bf16 with the tolerances stated per case. The CPU
// backend computes the reference from the same functors, so these tests check the launches
// (indexing, vector widths, tails), not the math.
#include <catch2/catch.hpp>

#include <functional>

#include <kiln/kiln.h>
#include "cuda_test_util.h"

using kiln::DType;
using kiln::Tensor;
using namespace kiln_cuda_test;

namespace {

double tol(DType dt) { return elementwise_tol(dt); }

// Runs fn on CPU inputs and on the same inputs moved to the GPU, and compares.
void parity(const std::string& what, const std::vector<Tensor>& cpu_in,
            const std::function<Tensor(const std::vector<Tensor>&)>& fn, double rtol, double atol) {
  std::vector<Tensor> gpu_in;
  for (const auto& t : cpu_in) gpu_in.push_back(t.to(kGpu));
  require_allclose(fn(gpu_in), fn(cpu_in), rtol, atol, what);
}
}  // namespace

TEST_CASE("unary ops match the CPU", "[cuda][pointwise]") {
  kiln::manual_seed(10);
  const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&)>>> ops = {
      {"neg", [](const Tensor& x) { return -x; }},
      {"exp", [](const Tensor& x) { return x.exp(); }},
      {"log", [](const Tensor& x) { return (x.abs() + 0.1).log(); }},
      {"sqrt", [](const Tensor& x) { return x.abs().sqrt(); }},
      {"rsqrt", [](const Tensor& x) { return (x.abs() + 0.5).rsqrt(); }},
      {"tanh", [](const Tensor& x) { return x.tanh(); }},
      {"sigmoid", [](const Tensor& x) { return x.sigmoid(); }},
      {"relu", [](const Tensor& x) { return x.relu(); }},
      {"gelu", [](const Tensor& x) { return x.gelu(); }},
      {"gelu_tanh", [](const Tensor& x) { return x.gelu("tanh"); }},
      {"silu", [](const Tensor& x) { return x.silu(); }},
      {"erf", [](const Tensor& x) { return kiln::erf(x); }},
      {"expm1", [](const Tensor& x) { return x.expm1(); }},
      {"pow", [](const Tensor& x) { return x.abs().pow(1.7); }},
      {"clamp", [](const Tensor& x) { return x.clamp(-0.5, 0.7); }},
      {"scalar ops", [](const Tensor& x) { return (2.0 - x * 3.0 + 1.5) / 2.0; }},
      {"isfinite", [](const Tensor& x) { return kiln::isfinite(x / x.abs().clamp_max(0.3)); }},
  };
  for (int64_t n : {1, 7, 1023, 4097}) {
    for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::F64}) {
      Tensor x = kiln::randn({n}).to(dt);
      for (auto& [name, op] : ops) {
        // f16/bf16 results are rounded once on each side: compare with the dtype's tolerance
        // (the fast CPU exp/erf differ from CUDA's by a few f32 ulps).
        parity(
            std::string(name) + " n=" + std::to_string(n), {x}, [&](const auto& in) { return op(in[0]); }, tol(dt) * 10,
            tol(dt));
      }
    }
  }
}

TEST_CASE("binary ops: broadcasting, non-contiguous, comparisons", "[cuda][pointwise]") {
  kiln::manual_seed(11);
  Tensor a = kiln::randn({33, 65}), b = kiln::randn({65}), c = kiln::randn({65, 33}).t();
  parity(
      "add broadcast", {a, b}, [](const auto& in) { return in[0] + in[1]; }, 1e-6, 1e-6);
  parity(
      "mul transposed", {a, c}, [](const auto& in) { return in[0] * in[1]; }, 1e-6, 1e-6);
  parity(
      "div", {a, b}, [](const auto& in) { return in[0] / (in[1].abs() + 0.5); }, 1e-6, 1e-6);
  parity(
      "maximum", {a, c}, [](const auto& in) { return kiln::maximum(in[0], in[1]); }, 0, 0);
  parity(
      "lt", {a, c}, [](const auto& in) { return in[0] < in[1]; }, 0, 0);
  parity(
      "where", {a, c}, [](const auto& in) { return kiln::where(in[0] > 0.0, in[0], in[1]); }, 0, 0);
  parity(
      "slice step", {a}, [](const auto& in) { return in[0].slice(1, 1, 64, 3) * 2.0; }, 0, 0);
  parity(
      "int add", {kiln::randint(-50, 50, {1023})}, [](const auto& in) { return in[0] + in[0] * 3.0; }, 0, 0);
}

TEST_CASE("copies and casts between every dtype", "[cuda][copy]") {
  kiln::manual_seed(12);
  Tensor x = kiln::randn({7, 129}) * 50.0;
  for (DType from : {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64, DType::I32, DType::U8, DType::Bool}) {
    for (DType to : {DType::F32, DType::F16, DType::BF16, DType::I32, DType::Bool}) {
      Tensor src = x.to(from);
      parity(
          std::string("cast ") + kiln::dtype_name(from) + "->" + kiln::dtype_name(to), {src},
          [&](const auto& in) { return in[0].t().to(to).contiguous(); }, 0, 0);
    }
  }
}

// The contiguous vector path of binary ops and casts (kernels/cuda/launch.cuh): packs of 16 bytes
// of the wider type, a scalar tail; in place; an offset view whose pointer is not aligned to a
// pack takes the general path.
TEST_CASE("binary ops and casts on contiguous operands: packs, tails, in place, unaligned", "[cuda][pointwise]") {
  kiln::manual_seed(13);
  for (int64_t n : {1, 7, 1023, 4097}) {
    for (DType dt : {DType::F32, DType::F64, DType::F16, DType::BF16}) {
      const Tensor a = kiln::randn({n}).to(dt), b = (kiln::randn({n}) + 2.0).to(dt);
      const std::string tag = std::string(kiln::dtype_name(dt)) + " n=" + std::to_string(n);
      parity(
          "add " + tag, {a, b}, [](const auto& in) { return in[0] + in[1]; }, tol(dt), tol(dt));
      parity(
          "div " + tag, {a, b}, [](const auto& in) { return in[0] / in[1]; }, tol(dt), tol(dt));
      parity(
          "add_ in place " + tag, {a, b}, [](const auto& in) { return in[0].clone().add_(in[1]); }, tol(dt), tol(dt));
      if (n > 1)
        parity(
            "mul of views one element in " + tag, {a, b},
            [n](const auto& in) { return in[0].slice(0, 1, n) * in[1].slice(0, 1, n); }, tol(dt), tol(dt));
      for (DType to : {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64, DType::I32, DType::U8}) {
        parity(
            "cast " + tag + " -> " + kiln::dtype_name(to), {(a * 20.0).abs()},
            [to](const auto& in) { return in[0].to(to); }, 0, 0);
        if (n > 1)
          parity(
              "cast of a view one element in " + tag + " -> " + kiln::dtype_name(to), {(a * 20.0).abs()},
              [to, n](const auto& in) { return in[0].slice(0, 1, n).to(to); }, 0, 0);
      }
    }
  }
  parity(
      "int64 add, odd size", {kiln::randint(-50, 50, {4097})}, [](const auto& in) { return in[0] + in[0]; }, 0, 0);
}

// The 32-bit strided kernel (launch.cuh: FastDivmod offsets, kStridedUnroll elements a thread):
// broadcasts and views of 2-5 merged dimensions with sizes that leave partial unrolled blocks, in
// every floating dtype; and a view spanning more than 2 GiB, which takes the 64-bit kernel.
TEST_CASE("strided pointwise: broadcasts and views across unrolled tails, and the 64-bit fallback",
          "[cuda][pointwise]") {
  kiln::manual_seed(14);
  for (DType dt : {DType::F32, DType::F64, DType::F16, DType::BF16}) {
    const std::string tag = kiln::dtype_name(dt);
    const Tensor a = kiln::randn({3, 5, 7, 37}).to(dt), row = kiln::randn({37}).to(dt);
    const Tensor col = kiln::randn({5, 1, 1}).to(dt), p = kiln::randn({37, 7, 5, 3}).to(dt);
    parity(
        "add a row " + tag, {a, row}, [](const auto& in) { return in[0] + in[1]; }, tol(dt), tol(dt));
    parity(
        "mul a column " + tag, {a, col}, [](const auto& in) { return in[0] * in[1]; }, tol(dt), tol(dt));
    parity(
        "sub a permuted view " + tag, {a, p},
        [](const auto& in) {
          return in[0] - in[1].permute({3, 2, 1, 0});
        },
        tol(dt), tol(dt));
    parity(
        "unary of a strided slice " + tag, {a}, [](const auto& in) { return in[0].slice(3, 1, 36, 2).exp(); }, tol(dt),
        tol(dt));
    parity(
        "where of broadcast operands " + tag, {a, row},
        [](const auto& in) { return kiln::where(in[1] > 0.0, in[0], in[1].slice(0, 0, 1)); }, 0, 0);
  }
  // two elements 2 GiB + 4 bytes apart: the last byte is past 2^31, so offsets need 64 bits
  const int64_t gap = (int64_t{1} << 29) + 1;
  Tensor big = kiln::zeros({gap + 1}, kiln::TensorOptions().device(kGpu));
  Tensor ends = big.slice(0, 0, gap + 1, gap);
  REQUIRE(ends.numel() == 2);
  ends.add_(kiln::tensor({1.5, -2.5}).to(kGpu));  // in place: the output spans 2 GiB too
  const Tensor got = (ends * 2.0).cpu();
  REQUIRE(got.slice(0, 0, 1).item<float>() == 3.0f);
  REQUIRE(got.slice(0, 1, 2).item<float>() == -5.0f);
  REQUIRE(big.slice(0, 1, gap).abs().sum().item<float>() == 0.0f);  // nothing between the ends written
}

TEST_CASE("reductions match the CPU", "[cuda][reduce]") {
  kiln::manual_seed(13);
  for (auto sizes : std::vector<kiln::IntList>{{1}, {7}, {4097}, {1 << 20}, {33, 1023}, {1023, 33}, {3, 5, 7}}) {
    Tensor x = kiln::randn(sizes);
    parity(
        "sum all", {x}, [](const auto& in) { return in[0].sum(); }, 1e-4, 1e-3);
    parity(
        "mean last", {x}, [](const auto& in) { return in[0].mean({-1}); }, 1e-4, 1e-5);
    parity(
        "sum first keepdim", {x}, [](const auto& in) { return in[0].sum({0}, true); }, 1e-4, 1e-4);
    parity(
        "amax", {x}, [](const auto& in) { return in[0].amax({-1}); }, 0, 0);
    parity(
        "min", {x}, [](const auto& in) { return in[0].min(); }, 0, 0);
    parity(
        "argmax", {x}, [](const auto& in) { return in[0].argmax(-1); }, 0, 0);
    parity(
        "var", {x}, [](const auto& in) { return in[0].var({-1}, 0); }, 1e-4, 1e-5);
  }
  Tensor t = kiln::randn({64, 48}).t();  // non-contiguous
  parity(
      "sum transposed", {t}, [](const auto& in) { return in[0].sum({1}); }, 1e-5, 1e-5);
  parity(
      "int sum", {kiln::randint(-9, 9, {4097})}, [](const auto& in) { return in[0].sum(); }, 0, 0);
  parity(
      "bf16 sum", {kiln::randn({4097}).to(DType::BF16)}, [](const auto& in) { return in[0].sum({0}); }, 2e-2, 0.5);
}

// Leading dims reduced in place ([R, K] read by columns): one pass, or row chunks with a second
// pass when the columns alone would not fill the GPU; sum, mean, max and min, float and integer
// dtypes, column counts that are not a multiple of the 32-column tile, an empty reduction.
TEST_CASE("column reductions (leading dims) match the CPU", "[cuda][reduce]") {
  kiln::manual_seed(18);
  for (auto sizes : std::vector<kiln::IntList>{{5, 1025}, {4099, 33}, {65536, 40}, {3, 777, 64}, {20000, 2, 17}}) {
    Tensor x = kiln::randn(sizes);
    const std::string n = " " + kiln::detail::concat(sizes);
    parity(
        "sum dim 0" + n, {x}, [](const auto& in) { return in[0].sum({0}); }, 1e-4, 1e-4);
    parity(
        "mean dim 0" + n, {x}, [](const auto& in) { return in[0].mean({0}); }, 1e-4, 1e-5);
    parity(
        "amax dim 0" + n, {x}, [](const auto& in) { return in[0].amax({0}); }, 0, 0);
    parity(
        "amin dim 0" + n, {x}, [](const auto& in) { return in[0].amin({0}); }, 0, 0);
    parity(
        "f64 sum dim 0" + n, {x.to(DType::F64)}, [](const auto& in) { return in[0].sum({0}); }, 1e-12, 1e-12);
    parity(
        "bf16 sum dim 0" + n, {x.to(DType::BF16)}, [](const auto& in) { return in[0].sum({0}); }, 2e-2, 0.5);
    parity(
        "int sum dim 0" + n, {kiln::randint(-9, 9, sizes)}, [](const auto& in) { return in[0].sum({0}); }, 0, 0);
  }
  Tensor three = kiln::randn({6, 7, 40});
  parity(
      "sum dims 0, 1", {three},
      [](const auto& in) {
        return in[0].sum({0, 1});
      },
      1e-4, 1e-5);
  Tensor empty_rows = kiln::randn({0, 64});
  parity(
      "sum of no rows", {empty_rows}, [](const auto& in) { return in[0].sum({0}); }, 0, 0);
}

TEST_CASE("reductions over more rows than gridDim.y allows (65535)", "[cuda][reduce]") {
  kiln::manual_seed(17);
  // [70000, 3]: one block per row (K above the grid's y limit); [70000, 300]: the same with
  // longer rows. Both reduce the last dim, so every row is a separate output.
  for (int64_t r : {3, 300}) {
    Tensor x = kiln::randn({70000, r});
    const std::string n = " [70000, " + std::to_string(r) + "]";
    parity(
        "sum last" + n, {x}, [](const auto& in) { return in[0].sum({-1}); }, 1e-5, 1e-5);
    parity(
        "mean last" + n, {x}, [](const auto& in) { return in[0].mean({-1}); }, 1e-5, 1e-6);
    parity(
        "amax last" + n, {x}, [](const auto& in) { return in[0].amax({-1}); }, 0, 0);
    parity(
        "argmax last" + n, {x}, [](const auto& in) { return in[0].argmax(-1); }, 0, 0);
    parity(
        "f64 sum last" + n, {x.to(DType::F64)}, [](const auto& in) { return in[0].sum({-1}); }, 1e-12, 1e-12);
  }
}

TEST_CASE("softmax, log_softmax, cross-entropy and their gradients", "[cuda][softmax]") {
  kiln::manual_seed(14);
  for (int64_t n : {1, 7, 1023, 4097}) {
    Tensor x = kiln::randn({5, n}) * 4.0;
    parity(
        "softmax", {x}, [](const auto& in) { return in[0].softmax(-1); }, 1e-5, 1e-7);
    parity(
        "log_softmax dim 0", {x}, [](const auto& in) { return in[0].log_softmax(0); }, 1e-5, 1e-6);
  }
  Tensor logits = kiln::randn({64, 10}), target = kiln::randint(0, 10, {64});
  auto grad_of = [](const Tensor& l, const Tensor& t) {
    Tensor x = l.detach().requires_grad_(true);
    kiln::cross_entropy(x, t, -100, 0.1).backward();
    return x.grad();
  };
  require_allclose(grad_of(logits.to(kGpu), target.to(kGpu)), grad_of(logits, target), 1e-5, 1e-7,
                   "cross_entropy grad");
}

TEST_CASE("matmul through cuBLASLt", "[cuda][matmul]") {
  kiln::manual_seed(15);
  for (auto [m, k, n] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{{1, 1, 1}, {7, 13, 5}, {128, 256, 64}, {1023, 33, 257}}) {
    Tensor a = kiln::randn({m, k}), b = kiln::randn({k, n});
    parity(
        "mm f32", {a, b}, [](const auto& in) { return kiln::mm(in[0], in[1]); }, 1e-4, 1e-4);
    // column-major views of both operands (no copy on either backend)
    parity(
        "mm transposed views", {a.t().contiguous(), b.t().contiguous()},
        [](const auto& in) { return kiln::mm(in[0].t(), in[1].t()); }, 1e-4, 1e-4);
    parity(
        "mm f16", {a.to(DType::F16), b.to(DType::F16)}, [](const auto& in) { return kiln::mm(in[0], in[1]); }, 1e-2,
        1e-2);
    parity(
        "mm bf16", {a.to(DType::BF16), b.to(DType::BF16)}, [](const auto& in) { return kiln::mm(in[0], in[1]); }, 5e-2,
        5e-2);
  }
  Tensor a = kiln::randn({3, 17, 9}), b = kiln::randn({3, 9, 11});
  parity(
      "bmm", {a, b}, [](const auto& in) { return kiln::bmm(in[0], in[1]); }, 1e-5, 1e-5);
  parity(
      "matmul broadcast", {a, kiln::randn({9, 4})}, [](const auto& in) { return kiln::matmul(in[0], in[1]); }, 1e-5,
      1e-5);
}

TEST_CASE("Philox streams: uniforms bit-identical on the CPU and the GPU, normals within a few ulp", "[cuda][rng]") {
  for (DType dt : {DType::F32, DType::F64, DType::F16}) {
    INFO("dtype " << kiln::dtype_name(dt));
    kiln::manual_seed(99);
    Tensor c1 = kiln::rand({4097}, dt), c2 = kiln::randn({1023}, dt);
    kiln::manual_seed(99);
    Tensor g1 = kiln::rand({4097}, kiln::TensorOptions().dtype(dt).device(kGpu));
    Tensor g2 = kiln::randn({1023}, kiln::TensorOptions().dtype(dt).device(kGpu));
    // Uniforms are integer bits times a power of two: identical.
    REQUIRE(kiln::equal(g1.cpu(), c1));
    // Normals go through Box-Muller's log and cos (in double), which differ by 1-2 ulp between
    // libm and CUDA's math library. In f64: relative 1e-14 (~45 ulp) plus absolute 1e-14 for
    // values near a zero of cos. Rounded to f32/f16 the results agree except where the double
    // lands next to a rounding boundary: one ulp of the dtype.
    const double rtol = dt == DType::F64 ? 1e-14 : dt == DType::F32 ? 1.2e-7 : 9.8e-4;
    const double atol = dt == DType::F64 ? 1e-14 : dt == DType::F32 ? 1e-30 : 6e-8;
    REQUIRE(kiln::allclose(g2.cpu(), c2, rtol, atol));
    REQUIRE(c2.abs().sum().item<double>() > 100.0);  // a real draw, not zeros
  }
  kiln::manual_seed(5);
  Tensor ci = kiln::randint(0, 1000, {777});
  kiln::manual_seed(5);
  REQUIRE(kiln::equal(kiln::randint(0, 1000, {777}, kiln::TensorOptions().dtype(DType::I64).device(kGpu)).cpu(), ci));
}

TEST_CASE("autograd runs on the GPU and matches the CPU", "[cuda][autograd]") {
  kiln::manual_seed(16);
  Tensor w = kiln::randn({8, 5}), x = kiln::randn({4, 8});
  auto grads = [](const Tensor& w0, const Tensor& x0) {
    Tensor wv = w0.detach().requires_grad_(true);
    kiln::matmul(x0, wv).gelu().softmax(-1).log().mean().backward();
    return wv.grad();
  };
  require_allclose(grads(w.to(kGpu), x.to(kGpu)), grads(w, x), 1e-4, 1e-6, "chain grad");
}
