// CUDA vs CPU parity for the fused ops (kiln/nn/functional/fused.cpp) and the cuBLASLt epilogues:
// random inputs, odd sizes (tails of the vector kernel, partial column tiles, many row chunks),
// non-contiguous views, f16/bf16 with stated tolerances, and the dropout mask bit-identical to
// the CPU's for the same seed. The math is the same functors on both sides (tested on the CPU
// in tests/nn/test_fused.cpp), so these check the launches.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include <kiln/kiln.h>
#include <kiln/kernels/fused.h>
#include <kiln/nn/functional.h>
#include "cuda_test_util.h"

namespace {

namespace F = kiln::nn::functional;
namespace K = kiln::kernels;
using kiln::DType;
using kiln::Tensor;
using namespace kiln_cuda_test;

void require_close(const Tensor& gpu, const Tensor& cpu, double rtol, double atol, const std::string& what) {
  INFO(describe(what, cpu));
  require_gpu_twin(gpu, cpu);
  Tensor g = gpu.cpu().to(DType::F64), c = cpu.to(DType::F64);
  INFO("max abs diff " << kiln::abs(g - c).max().item<double>());
  REQUIRE(kiln::allclose(g, c, rtol, atol));
}

double tol(DType dt) { return elementwise_tol(dt); }

// The cuBLASLt tests' tolerance (f32, f16, bf16), for a GEMM against the CPU's in f32 from the same
// rounded inputs.
double gemm_tol(DType dt) { return per_dtype(dt, 1e-4, 1e-4, 5e-3, 3e-2); }

// An [M, K] x [K, N] product.
struct Mkn {
  int64_t M, K, N;
};

std::string name_of(const Mkn& c, DType dt) {
  return std::to_string(c.M) + "x" + std::to_string(c.K) + "x" + std::to_string(c.N) + " " + kiln::dtype_name(dt);
}

// grads of sum(f(inputs) * w) w.r.t. every input, on the inputs' device.
std::vector<Tensor> grads(const std::function<Tensor(const std::vector<Tensor>&)>& f, const std::vector<Tensor>& in,
                          const Tensor& w) {
  std::vector<Tensor> leaves;
  for (const auto& t : in) leaves.push_back(t.detach().requires_grad_(true));
  Tensor y = f(leaves);
  return kiln::autograd::grad({(y * w.to(y.device())).sum()}, leaves);
}

}  // namespace

TEST_CASE("bias_gelu forward and backward match the CPU", "[cuda][fused]") {
  kiln::manual_seed(20);
  for (const char* approx : {"none", "tanh"}) {
    for (auto sizes : std::vector<kiln::IntList>{{1}, {7}, {3, 33}, {257, 64}, {1025, 129}, {4, 300, 768}}) {
      for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::F64}) {
        const std::string what = std::string(approx) + " " + kiln::dtype_name(dt);
        Tensor x = (kiln::randn(sizes) * 2.0).to(dt), b = kiln::randn({sizes.back()}).to(dt);
        Tensor w = kiln::randn(sizes).to(dt);
        auto f = [&](const std::vector<Tensor>& in) { return F::bias_gelu(in[0], in[1], approx); };
        require_close(f({x.to(kGpu), b.to(kGpu)}), f({x, b}), tol(dt) * 10, tol(dt), "forward " + what);
        auto gg = grads(f, {x.to(kGpu), b.to(kGpu)}, w), gc = grads(f, {x, b}, w);
        require_close(gg[0], gc[0], tol(dt) * 10, tol(dt), "dx " + what);
        // the bias gradient sums up to 4 * 300 rows: f32 partials vs the CPU's f64 ones
        const double rows = static_cast<double>(x.numel() / sizes.back());
        require_close(gg[1], gc[1], tol(dt) * 10, tol(dt) * rows * (dt == DType::F32 ? 0.1 : 1), "dbias " + what);
      }
    }
  }
  // non-contiguous input, no bias, misaligned (offset) input for the scalar path
  Tensor xt = kiln::randn({64, 31}).t();
  require_close(F::bias_gelu(xt.to(kGpu), Tensor()), F::bias_gelu(xt, Tensor()), 1e-5, 1e-6, "transposed");
  Tensor xo = kiln::randn({1 + 8 * 16}).slice(0, 1, 1 + 8 * 16).view({8, 16});
  Tensor bo = kiln::randn({16});
  require_close(F::bias_gelu(xo.to(kGpu).slice(0, 0, 8), bo.to(kGpu)), F::bias_gelu(xo, bo), 1e-5, 1e-6, "offset");
}

TEST_CASE("bias_gelu_backward column sums are deterministic on the GPU", "[cuda][fused]") {
  kiln::manual_seed(21);
  Tensor x = kiln::randn({8192, 96}, kiln::TensorOptions().device(kGpu)), g = kiln::randn({8192, 96}).to(kGpu);
  Tensor b = kiln::randn({96}).to(kGpu);
  Tensor dx = kiln::empty({8192, 96}, x.options()), db1 = kiln::empty({96}, x.options()),
         db2 = kiln::empty({96}, x.options());
  kiln::kernels::bias_gelu_backward(dx, db1, g, x, b, kiln::kernels::GeluApprox::Tanh);
  kiln::kernels::bias_gelu_backward(dx, db2, g, x, b, kiln::kernels::GeluApprox::Tanh);
  REQUIRE(kiln::equal(db1.cpu(), db2.cpu()));
  require_close(db1, dx.cpu().to(DType::F64).sum({0}).to(DType::F32), 1e-4, 1e-3, "dbias = sum of dx");
}

TEST_CASE("bias_dropout_add: GPU mask identical to the CPU's, forward and backward", "[cuda][fused]") {
  for (auto sizes : std::vector<kiln::IntList>{{1}, {7}, {33, 65}, {3, 1000, 77}}) {
    for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::F64}) {
      INFO(kiln::dtype_name(dt));
      kiln::manual_seed(22);
      Tensor x = kiln::randn(sizes).to(dt), b = kiln::randn({sizes.back()}).to(dt), r = kiln::randn(sizes).to(dt);
      // the mask alone: x = 1, b = 0, r = 0 gives exactly 0 or 1 / (1 - p)
      Tensor ones = kiln::ones(sizes).to(dt), zb = kiln::zeros({sizes.back()}).to(dt), zr = kiln::zeros(sizes).to(dt);
      kiln::manual_seed(5);
      Tensor mc = F::bias_dropout_add(ones, zb, zr, 0.25, true);
      Tensor mg = F::bias_dropout_add(ones.to(kGpu), zb.to(kGpu), zr.to(kGpu), 0.25, true);
      require_close(mg, mc, 0, 0, "mask");

      Tensor w = kiln::randn(sizes).to(dt);
      auto f = [](const std::vector<Tensor>& in) { return F::bias_dropout_add(in[0], in[1], in[2], 0.1, true); };
      kiln::manual_seed(6);
      auto gc = grads(f, {x, b, r}, w);
      auto gg = grads(f, {x.to(kGpu), b.to(kGpu), r.to(kGpu)}, w);
      require_close(gg[0], gc[0], tol(dt), tol(dt), "dx");
      const double rows = static_cast<double>(x.numel() / sizes.back());
      require_close(gg[1], gc[1], tol(dt) * 10, tol(dt) * rows, "dbias");
      require_close(gg[2], gc[2], 0, 0, "dresidual");
      kiln::manual_seed(7);
      Tensor yc = f({x, b, r});
      Tensor yg = f({x.to(kGpu), b.to(kGpu), r.to(kGpu)});
      require_close(yg, yc, tol(dt), tol(dt), "forward");
    }
  }
}

TEST_CASE("bias_dropout_add on the GPU equals residual + dropout(x + b) there", "[cuda][fused]") {
  kiln::manual_seed(23);
  Tensor x = kiln::randn({129, 255}).to(kGpu), b = kiln::randn({255}).to(kGpu), r = kiln::randn({129, 255}).to(kGpu);
  kiln::manual_seed(11);
  Tensor fused = F::bias_dropout_add(x, b, r, 0.2, true);
  kiln::manual_seed(11);
  Tensor chain = r + F::dropout(x + b, 0.2, true);
  require_close(fused, chain.cpu(), 1e-6, 1e-6, "fused vs chain");
}

TEST_CASE("fused_gelu on the GPU equals the 5-op chain", "[cuda][fused]") {
  kiln::manual_seed(24);
  for (int64_t n : {1, 7, 1023, 4097, 1 << 20}) {
    Tensor x = (kiln::randn({n}) * 3.0).to(kGpu);
    Tensor chain = x * 0.5 * (1.0 + kiln::erf(x / 1.41421));
    require_close(F::fused_gelu(x), chain.cpu(), 1e-5, 2e-6, "n=" + std::to_string(n));
  }
}

TEST_CASE("linear_epilogue: cuBLASLt bias / bias+GELU(+aux) epilogues match the CPU", "[cuda][fused][cublaslt]") {
  kiln::cuda::set_allow_tf32(false);
  kiln::manual_seed(25);
  for (Mkn c : {Mkn{1, 8, 8}, Mkn{17, 24, 40}, Mkn{128, 64, 96}, Mkn{33, 70, 130} /* N % 8 != 0 */}) {
    for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
      const std::string what = name_of(c, dt);
      Tensor x = kiln::randn({c.M, c.K}).to(dt), w = (kiln::randn({c.N, c.K}) * 0.2).to(dt),
             b = kiln::randn({c.N}).to(dt);
      // the CPU reference in f32 from the same (rounded) inputs
      Tensor pre = kiln::matmul(x.to(DType::F32), w.to(DType::F32).t()) + b.to(DType::F32);
      const double t = gemm_tol(dt);
      Tensor xg = x.to(kGpu), wg = w.to(kGpu), bg = b.to(kGpu);
      Tensor out = kiln::empty({c.M, c.N}, xg.options()), aux = kiln::empty({c.M, c.N}, xg.options());

      K::linear_epilogue(out, xg, wg, bg, K::Epilogue::Bias);
      INFO("bias epilogue used: " << K::cuda::last_call_used_epilogue());
      require_close(out.to(DType::F32), pre, t, t, "bias " + what);

      K::linear_epilogue(out, xg, wg, bg, K::Epilogue::BiasGelu, aux, K::GeluApprox::Tanh);
      const bool used = K::cuda::last_call_used_epilogue();
      INFO("GELU_AUX_BIAS used: " << used);
      if (c.N % 8 == 0 && !used) WARN("cuBLASLt turned down GELU_AUX_BIAS for " << what << " (fallback ran)");
      // cuBLASLt's GELU epilogue is the tanh form: an erf GELU would differ by up to ~5e-4 here
      require_close(out.to(DType::F32), kiln::gelu(pre, "tanh"), t, t, "bias+gelu " + what);
      require_close(aux.to(DType::F32), pre, t, t, "aux " + what);

      K::linear_epilogue(out, xg, wg, bg, K::Epilogue::BiasGelu, Tensor(), K::GeluApprox::None);
      require_close(out.to(DType::F32), kiln::gelu(pre), t, t, "bias+gelu(erf) " + what);
      // a transposed x
      Tensor xtg = x.t().contiguous().to(kGpu).t();
      K::linear_epilogue(out, xtg, wg, bg, K::Epilogue::BiasGelu, Tensor(), K::GeluApprox::Tanh);
      require_close(out.to(DType::F32), kiln::gelu(pre, "tanh"), t, t, "transposed x " + what);
    }
  }
}

TEST_CASE("cuBLASLt: operands at odd element offsets, a misaligned bias, M = 1", "[cuda][fused][cublaslt]") {
  kiln::cuda::set_allow_tf32(false);
  kiln::manual_seed(27);
  // The last n elements of a fresh [n + 1] device tensor: a view one element past the
  // allocation's (256-byte aligned) start, so 2- or 4-byte aligned.
  auto offset_view = [](const Tensor& cpu_values, const kiln::IntList& sizes) {
    Tensor big = kiln::empty({cpu_values.numel() + 1}, cpu_values.options().device(kGpu));
    Tensor v = big.slice(0, 1, cpu_values.numel() + 1).view(sizes);
    v.copy_(cpu_values.reshape(sizes).to(kGpu));
    return v;
  };
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    const double t = gemm_tol(dt);
    for (int64_t M : {1, 7, 64}) {
      const int64_t Kd = 33, N = 40;
      const std::string what = "M = " + std::to_string(M) + " " + kiln::dtype_name(dt);
      Tensor x = kiln::randn({M, Kd}).to(dt), w = (kiln::randn({N, Kd}) * 0.2).to(dt), b = kiln::randn({N}).to(dt);
      Tensor prod = kiln::matmul(x.to(DType::F32), w.to(DType::F32).t());  // CPU reference in f32
      Tensor pre = prod + b.to(DType::F32);
      Tensor xg = offset_view(x, {M, Kd}), wg = offset_view(w, {N, Kd});
      REQUIRE(reinterpret_cast<uintptr_t>(xg.data_ptr()) % 16 != 0);
      require_close(kiln::mm(xg, wg.t()).to(DType::F32), prod, t, t, "mm on offset views " + what);
      Tensor out = offset_view(kiln::zeros({M, N}, dt), {M, N});
      // A bias 2 or 4 bytes past alignment: cuBLASLt's epilogue is skipped, the fallback adds it.
      Tensor bg_odd = offset_view(b, {N});
      K::linear_epilogue(out, xg, wg, bg_odd, K::Epilogue::Bias);
      REQUIRE_FALSE(K::cuda::last_call_used_epilogue());
      require_close(out.to(DType::F32), pre, t, t, "misaligned bias " + what);
      // An aligned bias with offset operands (and M = 1): the epilogue or its fallback, same values.
      K::linear_epilogue(out, xg, wg, b.to(kGpu), K::Epilogue::Bias);
      INFO("bias epilogue used: " << K::cuda::last_call_used_epilogue());
      require_close(out.to(DType::F32), pre, t, t, "aligned bias, offset operands " + what);
      K::linear_epilogue(out, xg, wg, b.to(kGpu), K::Epilogue::BiasGelu, Tensor(), K::GeluApprox::Tanh);
      require_close(out.to(DType::F32), kiln::gelu(pre, "tanh"), t, t, "bias+gelu, offset operands " + what);
    }
  }
  // A strided batch whose matrices sit at odd offsets: [3, 5, 9] @ [9, 4] from offset views.
  Tensor a = kiln::randn({3, 5, 9}), m = kiln::randn({3, 9, 4});
  require_close(kiln::bmm(offset_view(a, {3, 5, 9}), offset_view(m, {3, 9, 4})), kiln::bmm(a, m), 1e-4, 1e-4,
                "bmm on offset views");
}

TEST_CASE("matmul_dgelu_bgrad: cuBLASLt DGELU(_BGRAD) epilogue matches the CPU", "[cuda][fused][cublaslt]") {
  kiln::cuda::set_allow_tf32(false);
  kiln::manual_seed(26);
  for (Mkn c : {Mkn{16, 32, 64}, Mkn{100, 48, 200}, Mkn{9, 5, 13} /* fallback */}) {
    for (DType dt : {DType::F32, DType::BF16}) {
      const std::string what = name_of(c, dt);
      Tensor a = kiln::randn({c.M, c.K}).to(dt), bm = (kiln::randn({c.N, c.K}) * 0.3).to(dt).t();
      Tensor pre = kiln::randn({c.M, c.N}).to(dt);
      Tensor dpre_c = kiln::empty({c.M, c.N}, pre.options()), db_c = kiln::empty({c.N}, pre.options());
      K::matmul_dgelu_bgrad(dpre_c, db_c, a, bm, pre, K::GeluApprox::Tanh);
      Tensor dpre_g = kiln::empty({c.M, c.N}, pre.to(kGpu).options()), db_g = kiln::empty({c.N}, dpre_g.options());
      K::matmul_dgelu_bgrad(dpre_g, db_g, a.to(kGpu), bm.to(kGpu), pre.to(kGpu), K::GeluApprox::Tanh);
      INFO("DGELU_BGRAD used: " << K::cuda::last_call_used_epilogue());
      const double t = gemm_tol(dt);
      require_close(dpre_g, dpre_c, t, t, "dpre " + what);
      require_close(db_g, db_c, t, t * c.M, "dbias " + what);
      Tensor dpre_n = kiln::empty({c.M, c.N}, dpre_g.options());
      K::matmul_dgelu_bgrad(dpre_n, Tensor(), a.to(kGpu), bm.to(kGpu), pre.to(kGpu), K::GeluApprox::Tanh);
      require_close(dpre_n, dpre_c, t, t, "dpre without bias grad " + what);
    }
  }
}

// F::linear with a bias of the input's dtype: the bias in cuBLASLt's epilogue and one backward
// node, on views (a permuted input, a transposed weight, a strided bias), against the CPU; in bf16
// against an f32 reference.
TEST_CASE("linear with a bias: forward and backward match the CPU, views included", "[cuda][fused]") {
  kiln::cuda::set_allow_tf32(false);
  kiln::manual_seed(28);
  Tensor xp = kiln::randn({64, 41, 3}), wt = kiln::randn({64, 96}) * 0.2, bw = kiln::randn({192});
  Tensor g = kiln::randn({3, 41, 96});
  auto f = [](const std::vector<Tensor>& in) {
    return F::linear(in[0].permute({2, 1, 0}), in[1].t(), in[2].slice(0, 0, 192, 2));
  };
  require_close(f({xp.to(kGpu), wt.to(kGpu), bw.to(kGpu)}), f({xp, wt, bw}), 1e-4, 1e-5, "forward");
  auto gg = grads(f, {xp.to(kGpu), wt.to(kGpu), bw.to(kGpu)}, g), gc = grads(f, {xp, wt, bw}, g);
  require_close(gg[0], gc[0], 1e-4, 1e-4, "dx");
  require_close(gg[1], gc[1], 1e-4, 1e-3, "dweight");
  require_close(gg[2], gc[2], 1e-4, 1e-3, "dbias");
  Tensor x = kiln::randn({64, 128}).to(DType::BF16), w = (kiln::randn({256, 128}) * 0.1).to(DType::BF16);
  Tensor b = kiln::randn({256}).to(DType::BF16);
  require_close(F::linear(x.to(kGpu), w.to(kGpu), b.to(kGpu)).to(DType::F32),
                kiln::matmul(x.to(DType::F32), w.to(DType::F32).t()) + b.to(DType::F32), 3e-2, 3e-2, "bf16 forward");
}

TEST_CASE("linear_gelu forward and backward match the CPU", "[cuda][fused]") {
  kiln::cuda::set_allow_tf32(false);
  kiln::manual_seed(27);
  for (const char* approx : {"tanh", "none"}) {
    Tensor x = kiln::randn({3, 41, 64}), w = kiln::randn({96, 64}) * 0.2, b = kiln::randn({96});
    Tensor g = kiln::randn({3, 41, 96});
    auto f = [&](const std::vector<Tensor>& in) { return F::linear_gelu(in[0], in[1], in[2], approx); };
    require_close(f({x.to(kGpu), w.to(kGpu), b.to(kGpu)}), f({x, w, b}), 1e-4, 1e-5, std::string("forward ") + approx);
    auto gg = grads(f, {x.to(kGpu), w.to(kGpu), b.to(kGpu)}, g), gc = grads(f, {x, w, b}, g);
    require_close(gg[0], gc[0], 1e-4, 1e-4, "dx");
    require_close(gg[1], gc[1], 1e-4, 1e-3, "dweight");
    require_close(gg[2], gc[2], 1e-4, 1e-3, "dbias");
  }
  // bf16 under autocast-free use
  Tensor x = kiln::randn({64, 128}).to(DType::BF16), w = (kiln::randn({256, 128}) * 0.1).to(DType::BF16);
  Tensor b = kiln::randn({256}).to(DType::BF16);
  require_close(F::linear_gelu(x.to(kGpu), w.to(kGpu), b.to(kGpu)).to(DType::F32),
                kiln::gelu(kiln::matmul(x.to(DType::F32), w.to(DType::F32).t()) + b.to(DType::F32), "tanh"), 3e-2, 3e-2,
                "bf16 forward");
}
