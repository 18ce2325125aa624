// cuDNN's fused attention (kiln/cuda/cudnn_graph.h, the default CUDA path for f16/bf16 on sm_80+)
// against the CPU kernel on random inputs: odd sequence lengths, Tq != Tk, head dims 64 and 128,
// causal and not, f16 and bf16, 3-d and 4-d operands, q/k/v as strided views of a fused
// [B, T, 3, H, D] projection; the gradients; a bitwise repeat in deterministic mode; the graph
// cache (a second call builds nothing); a cuDNN forward followed by kiln's backward; and the
// fallback to kiln's kernel (f32, head dims cuDNN's path does not take, the switch) and to the
// composite path (mask, dropout). Each case checks which path ran through kiln::cudnn::sdpa_counts().
//
// Tolerances, relative to the tensor's scale (max |gpu - cpu| <= tol * max(1, max |cpu|)): the
// CPU reference widens 16-bit inputs to f32 and rounds once; cuDNN rounds the probabilities to the
// 16-bit type before P V and the gradients' products, so out: 5e-3 (f16) and 3e-2 (bf16), the
// gradients 2e-2 (f16) and 8e-2 (bf16).
//
// Without cudnn-frontend in the build, or on a GPU older than sm_80, the cuDNN cases only check
// that kiln's kernel ran instead.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include <kiln/kiln.h>

#include "kiln/core/determinism.h"
#include "kiln/cuda/cudnn_graph.h"
#include "cuda_test_util.h"

namespace F = kiln::nn::functional;
using kiln::DType;
using kiln::Tensor;
using kiln::cudnn::SdpaBackend;
using kiln::cudnn::SdpaCounts;
using namespace kiln_cuda_test;

namespace {
const kiln::Device kCpu = kiln::Device::cpu();

struct BackendGuard {
  SdpaBackend prev = kiln::cudnn::sdpa_backend();
  explicit BackendGuard(SdpaBackend b) { kiln::cudnn::set_sdpa_backend(b); }
  ~BackendGuard() { kiln::cudnn::set_sdpa_backend(prev); }
};

// Whether cuDNN's path can run here: built with the frontend, on sm_80 or newer.
bool cudnn_here() {
#if KILN_WITH_CUDNN_FRONTEND
  return kiln::cudnn::built_with_frontend() && kiln::cudnn::graph::device_sm(0) >= 80;
#else
  return false;
#endif
}

SdpaCounts delta(const SdpaCounts& a, const SdpaCounts& b) {
  SdpaCounts d;
  d.cudnn_forward = b.cudnn_forward - a.cudnn_forward;
  d.cudnn_backward = b.cudnn_backward - a.cudnn_backward;
  d.kiln_forward = b.kiln_forward - a.kiln_forward;
  d.kiln_backward = b.kiln_backward - a.kiln_backward;
  d.graphs_built = b.graphs_built - a.graphs_built;
  d.refused = b.refused - a.refused;
  return d;
}

double out_tol(DType dt) { return dt == DType::F16 ? 5e-3 : dt == DType::BF16 ? 3e-2 : 1e-4; }
double grad_tol(DType dt) { return dt == DType::F16 ? 2e-2 : dt == DType::BF16 ? 8e-2 : 1e-4; }

// out, dq, dk, dv of F::scaled_dot_product_attention on `dev` (the gradient of sum(out * g)).
std::vector<Tensor> run(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, bool causal,
                        kiln::Device dev) {
  Tensor qq = q.to(dev).detach().requires_grad_(true), kk = k.to(dev).detach().requires_grad_(true),
         vv = v.to(dev).detach().requires_grad_(true);
  Tensor out = F::scaled_dot_product_attention(qq, kk, vv, causal);
  out.backward(g.to(dev));
  return {out.detach(), qq.grad(), kk.grad(), vv.grad()};
}

struct Case {
  std::vector<int64_t> lead;  // leading dims: {B} (3-d operands) or {B, H} (4-d)
  int64_t Tq, Tk, D;
};

std::string describe(const Case& c, bool causal, DType dt) {
  return kiln::detail::concat("lead ", kiln::IntList(c.lead), " Tq ", c.Tq, " Tk ", c.Tk, " D ", c.D,
                              causal ? " causal " : " ", kiln::dtype_name(dt));
}

kiln::IntList with(std::vector<int64_t> lead, int64_t a, int64_t b) {
  lead.push_back(a);
  lead.push_back(b);
  return kiln::IntList(lead);
}

// GPU against CPU; returns the counters' change over the GPU run.
SdpaCounts compare(const Case& c, bool causal, DType dt) {
  Tensor q = kiln::randn(with(c.lead, c.Tq, c.D)).to(dt), k = kiln::randn(with(c.lead, c.Tk, c.D)).to(dt);
  Tensor v = kiln::randn(with(c.lead, c.Tk, c.D)).to(dt), g = kiln::randn(with(c.lead, c.Tq, c.D)).to(dt);
  const std::string what = describe(c, causal, dt);
  std::vector<Tensor> cpu = run(q, k, v, g, causal, kCpu);
  const SdpaCounts before = kiln::cudnn::sdpa_counts();
  std::vector<Tensor> gpu = run(q, k, v, g, causal, kGpu);
  const SdpaCounts d = delta(before, kiln::cudnn::sdpa_counts());
  require_near(gpu[0], cpu[0], out_tol(dt), what + ": out");
  require_near(gpu[1], cpu[1], grad_tol(dt), what + ": dq");
  require_near(gpu[2], cpu[2], grad_tol(dt), what + ": dk");
  require_near(gpu[3], cpu[3], grad_tol(dt), what + ": dv");
  return d;
}

void require_path(const SdpaCounts& d, bool cudnn, const std::string& what) {
  INFO(what << ": cudnn forward " << d.cudnn_forward << " backward " << d.cudnn_backward << ", kiln forward "
            << d.kiln_forward << " backward " << d.kiln_backward
            << "; last refusal: " << kiln::cudnn::sdpa_last_refusal());
  if (cudnn) {
    REQUIRE(d.cudnn_forward == 1);
    REQUIRE(d.cudnn_backward == 1);
    REQUIRE(d.kiln_forward == 0);
    REQUIRE(d.kiln_backward == 0);
  } else {
    REQUIRE(d.cudnn_forward == 0);
    REQUIRE(d.cudnn_backward == 0);
    REQUIRE(d.kiln_forward == 1);
    REQUIRE(d.kiln_backward == 1);
  }
}

}  // namespace

TEST_CASE("sdpa cuDNN: f16/bf16 forward and backward match the CPU", "[cuda][attention][cudnn]") {
  BackendGuard cudnn(SdpaBackend::Cudnn);
  kiln::manual_seed(51);
  const std::vector<Case> cases = {
      {{2}, 1, 1, 64},          // one query, one key (3-d)
      {{3}, 7, 7, 64},          // odd and short
      {{2, 3}, 65, 65, 64},     // 4-d, odd
      {{1, 2}, 200, 200, 128},  // d = 128
      {{2, 2}, 65, 130, 64},    // Tq < Tk (causal: top-left aligned)
      {{2, 2}, 130, 65, 128},   // Tq > Tk
      {{2, 1, 2}, 33, 33, 64},  // 5-d: leading dims merged
  };
  for (DType dt : {DType::F16, DType::BF16})
    for (const Case& c : cases)
      for (bool causal : {false, true}) require_path(compare(c, causal, dt), cudnn_here(), describe(c, causal, dt));
}

TEST_CASE("sdpa cuDNN: q, k, v as strided views of a fused projection, out [B, T, H, D]", "[cuda][attention][cudnn]") {
  BackendGuard cudnn(SdpaBackend::Cudnn);
  kiln::manual_seed(52);
  const int64_t B = 2, T = 67, H = 4, D = 64;
  for (DType dt : {DType::BF16, DType::F16})
    for (bool causal : {false, true}) {
      INFO(kiln::dtype_name(dt) << (causal ? " causal" : ""));
      Tensor x0 = kiln::randn({B, T, 3, H, D}).to(dt), gy = kiln::randn({B, H, T, D}).to(dt);
      std::vector<Tensor> y, gx;
      SdpaCounts d;
      for (const kiln::Device& dev : {kCpu, kGpu}) {
        Tensor x = x0.to(dev).requires_grad_(true);
        auto qkv = x.permute({2, 0, 3, 1, 4}).unbind(0);  // [B, H, T, D] views, strides (3THD, D, 3HD, 1)
        const SdpaCounts before = kiln::cudnn::sdpa_counts();
        Tensor out = F::scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], causal);
        if (dev == kGpu && cudnn_here()) {
          // out is laid out [B, T, H, D]: merging the heads is a view
          REQUIRE(out.transpose(1, 2).is_contiguous());
        }
        y.push_back(out.detach());
        gx.push_back(kiln::autograd::grad({out}, {x}, {gy.to(dev)})[0]);
        if (dev == kGpu) d = delta(before, kiln::cudnn::sdpa_counts());
      }
      require_near(y[1], y[0], out_tol(dt), "output");
      require_near(gx[1], gx[0], grad_tol(dt), "gradient of the projection");
      require_path(d, cudnn_here(), "fused projection");
    }
}

TEST_CASE("sdpa cuDNN: deterministic backward is bitwise reproducible", "[cuda][attention][cudnn]") {
  BackendGuard cudnn(SdpaBackend::Cudnn);
  kiln::DeterministicGuard deterministic(true);
  kiln::manual_seed(53);
  for (DType dt : {DType::BF16, DType::F16})
    for (bool causal : {false, true}) {
      Tensor q = kiln::randn({4, 4, 257, 64}).to(dt), k = kiln::randn({4, 4, 257, 64}).to(dt);
      Tensor v = kiln::randn({4, 4, 257, 64}).to(dt), g = kiln::randn({4, 4, 257, 64}).to(dt);
      const SdpaCounts before = kiln::cudnn::sdpa_counts();
      std::vector<Tensor> a = run(q, k, v, g, causal, kGpu), b = run(q, k, v, g, causal, kGpu);
      const SdpaCounts d = delta(before, kiln::cudnn::sdpa_counts());
      if (cudnn_here()) REQUIRE(d.cudnn_backward == 2);
      for (int i = 0; i < 4; ++i) {
        INFO(kiln::dtype_name(dt) << (causal ? " causal" : "") << " result " << i);
        REQUIRE(kiln::equal(a[i].cpu(), b[i].cpu()));
      }
    }
}

TEST_CASE("sdpa cuDNN: the graph cache builds each case once", "[cuda][attention][cudnn]") {
  BackendGuard cudnn(SdpaBackend::Cudnn);
  kiln::manual_seed(54);
  // a shape no other test uses
  const Case c{{3, 2}, 37, 37, 64};
  const SdpaCounts first = compare(c, true, DType::F16);
  const SdpaCounts second = compare(c, true, DType::F16);  // new data, same shapes
  if (cudnn_here()) {
    REQUIRE(first.graphs_built == 2);  // forward and backward
    REQUIRE(second.graphs_built == 0);
    REQUIRE(second.refused == 0);
    require_path(second, true, "second call");
  } else {
    REQUIRE(first.graphs_built + second.graphs_built == 0);
  }
}

TEST_CASE("sdpa cuDNN: a cuDNN forward with kiln's backward (the same lse)", "[cuda][attention][cudnn]") {
  kiln::manual_seed(55);
  const DType dt = DType::BF16;
  Tensor q = kiln::randn({2, 3, 65, 64}).to(dt), k = kiln::randn({2, 3, 65, 64}).to(dt);
  Tensor v = kiln::randn({2, 3, 65, 64}).to(dt), g = kiln::randn({2, 3, 65, 64}).to(dt);
  std::vector<Tensor> cpu = run(q, k, v, g, true, kCpu);
  Tensor qq = q.to(kGpu).requires_grad_(true), kk = k.to(kGpu).requires_grad_(true),
         vv = v.to(kGpu).requires_grad_(true);
  const SdpaCounts before = kiln::cudnn::sdpa_counts();
  Tensor out;
  {
    BackendGuard cudnn(SdpaBackend::Cudnn);
    out = F::scaled_dot_product_attention(qq, kk, vv, true);
  }
  {
    BackendGuard kiln_only(SdpaBackend::Kiln);
    out.backward(g.to(kGpu));
  }
  const SdpaCounts d = delta(before, kiln::cudnn::sdpa_counts());
  REQUIRE(d.cudnn_forward == (cudnn_here() ? 1 : 0));
  REQUIRE(d.cudnn_backward == 0);
  REQUIRE(d.kiln_backward == 1);
  require_near(out.detach(), cpu[0], out_tol(dt), "out");
  require_near(qq.grad(), cpu[1], grad_tol(dt), "dq");
  require_near(kk.grad(), cpu[2], grad_tol(dt), "dk");
  require_near(vv.grad(), cpu[3], grad_tol(dt), "dv");
}

TEST_CASE("sdpa cuDNN: kiln's kernel or the composite path where cuDNN's path does not go",
          "[cuda][attention][cudnn]") {
  BackendGuard cudnn(SdpaBackend::Cudnn);
  kiln::manual_seed(56);
  SECTION("f32") { require_path(compare({{2, 2}, 33, 33, 64}, true, DType::F32), false, "f32"); }
  SECTION("head dims not a multiple of 8") {
    require_path(compare({{2, 2}, 33, 33, 20}, false, DType::BF16), false, "D = 20");
    require_path(compare({{2}, 17, 17, 36}, true, DType::F16), false, "D = 36");
  }
  SECTION("the switch") {
    BackendGuard kiln_only(SdpaBackend::Kiln);
    require_path(compare({{2, 2}, 33, 33, 64}, true, DType::BF16), false, "backend kiln");
  }
  SECTION("a mask or dropout: the composite path, counted by neither") {
    Tensor q = kiln::randn({2, 2, 33, 64}, kiln::TensorOptions().dtype(DType::BF16).device(kGpu));
    Tensor mask = kiln::rand({33, 33}).to(kGpu) < 0.8;
    const SdpaCounts before = kiln::cudnn::sdpa_counts();
    Tensor a = F::scaled_dot_product_attention(q, q, q, mask, 0.0, false, std::nullopt);
    Tensor b = F::scaled_dot_product_attention(q, q, q, Tensor(), 0.1, true, std::nullopt);
    const SdpaCounts d = delta(before, kiln::cudnn::sdpa_counts());
    REQUIRE(d.cudnn_forward + d.kiln_forward == 0);
    REQUIRE(a.sizes() == q.sizes());
    REQUIRE(b.sizes() == q.sizes());
  }
}
