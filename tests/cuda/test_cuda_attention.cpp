// The fused CUDA attention (kiln/kernels/cuda/attention.cu) against the CPU kernel
// (kiln/kernels/cpu/attention.cpp) on random inputs: forward output, lse and the three gradients,
// causal and not, odd sequence lengths (1, 7, 65, 130, 200: not multiples of the 32/64-row tiles),
// Tq != Tk both ways, D != Dv, head dims 16/64/80/128 (all three head-dim buckets), f32, f64 and
// native f16/bf16 (the CPU reference widens 16-bit inputs to f32 and rounds its result once).
//
// Tolerances are relative to the tensor's scale: max |gpu - cpu| <= tol * max(1, max |cpu|) with
// tol = 1e-4 (f32: accumulation order differs), 1e-10 (f64), 5e-3 (f16: ~4 ulps of the rounded
// result) and 3e-2 (bf16: ~4 ulps). The backward must also be bitwise reproducible.
// f16/bf16 attention on CUDA runs cuDNN's fused attention by default; the cases here that
// go through F::scaled_dot_product_attention in those dtypes pin kiln's kernel
// (kiln::cudnn::set_sdpa_backend), and tests/cuda/test_cuda_sdpa_cudnn.cpp checks cuDNN's path.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include <kiln/kiln.h>

#include "kiln/kernels/activation.h"
#include "kiln/kernels/attention.h"
#include "kiln/kernels/dropout.h"
#include "kiln/kernels/norm.h"
#include "cuda_test_util.h"

namespace F = kiln::nn::functional;
using kiln::DType;
using kiln::Tensor;
using namespace kiln_cuda_test;

namespace {
const kiln::Device kCpu = kiln::Device::cpu();

kiln::TensorOptions on_gpu(DType dt = DType::F32) { return kiln::TensorOptions().dtype(dt).device(kGpu); }

double tol_for(DType dt) { return per_dtype(dt, 1e-10, 1e-4, 5e-3, 3e-2); }

struct Shape {
  int64_t B, Tq, Tk, D, Dv;
};

// Pins kiln's own kernel for a scope (f16/bf16 would otherwise run cuDNN's).
struct KilnKernelOnly {
  kiln::cudnn::SdpaBackend prev = kiln::cudnn::sdpa_backend();
  KilnKernelOnly() { kiln::cudnn::set_sdpa_backend(kiln::cudnn::SdpaBackend::Kiln); }
  ~KilnKernelOnly() { kiln::cudnn::set_sdpa_backend(prev); }
};

std::string describe(const Shape& s, bool causal, DType dt) {
  return kiln::detail::concat("B ", s.B, " Tq ", s.Tq, " Tk ", s.Tk, " D ", s.D, " Dv ", s.Dv,
                              causal ? " causal " : " ", kiln::dtype_name(dt));
}

// out, dq, dk, dv of F::scaled_dot_product_attention on `dev` (the gradient of sum(out * g)).
std::vector<Tensor> run(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, bool causal,
                        kiln::Device dev, bool gq = true, bool gk = true, bool gv = true) {
  Tensor qq = q.to(dev).detach().requires_grad_(gq), kk = k.to(dev).detach().requires_grad_(gk),
         vv = v.to(dev).detach().requires_grad_(gv);
  Tensor out = F::scaled_dot_product_attention(qq, kk, vv, causal);
  out.backward(g.to(dev));
  return {out.detach(), qq.grad(), kk.grad(), vv.grad()};
}

void compare(const Shape& s, bool causal, DType dt) {
  Tensor q = kiln::randn({s.B, s.Tq, s.D}).to(dt), k = kiln::randn({s.B, s.Tk, s.D}).to(dt);
  Tensor v = kiln::randn({s.B, s.Tk, s.Dv}).to(dt), g = kiln::randn({s.B, s.Tq, s.Dv}).to(dt);
  const std::string what = describe(s, causal, dt);
  std::vector<Tensor> c = run(q, k, v, g, causal, kCpu), d = run(q, k, v, g, causal, kGpu);
  const double tol = tol_for(dt);
  require_near(d[0], c[0], tol, what + ": out");
  require_near(d[1], c[1], tol, what + ": dq");
  require_near(d[2], c[2], tol, what + ": dk");
  require_near(d[3], c[3], tol, what + ": dv");
}

const std::vector<Shape> kShapes = {
    {2, 1, 1, 16, 16},        // one query, one key
    {3, 7, 7, 16, 16},        // less than one tile
    {2, 65, 65, 64, 64},      // one row into the second 64-row tile
    {2, 200, 200, 80, 80},    // D = 80: the 128 bucket, 32-row tiles
    {2, 65, 200, 64, 64},     // Tq < Tk (causal: keys after the last query are never seen)
    {2, 200, 65, 16, 16},     // Tq > Tk (causal: late queries see every key)
    {1, 1, 200, 64, 64},      // one query against many keys
    {1, 7, 65, 80, 16},       // D != Dv
    {2, 130, 130, 128, 128},  // the largest head dim
};
}  // namespace

TEST_CASE("attention: CUDA forward and backward match the CPU (f32)", "[cuda][attention]") {
  kiln::manual_seed(31);
  for (const Shape& s : kShapes)
    for (bool causal : {false, true}) compare(s, causal, DType::F32);
}

TEST_CASE("attention: CUDA f16/bf16 (native) and f64 match the CPU", "[cuda][attention]") {
  KilnKernelOnly kiln_kernel;
  kiln::manual_seed(32);
  for (DType dt : {DType::BF16, DType::F16, DType::F64})
    for (const Shape& s : kShapes)
      for (bool causal : {false, true}) compare(s, causal, dt);
}

// A small subset for compute-sanitizer's racecheck (scripts/gpu-verdict.sh): one f32 and one f64
// shape that span two query tiles and several key tiles; the whole group is too slow under it.
TEST_CASE("attention: racecheck subset (f32 and f64)", "[cuda][attention][racecheck]") {
  kiln::manual_seed(33);
  compare({2, 65, 65, 64, 64}, true, DType::F32);
  compare({1, 65, 130, 80, 80}, false, DType::F64);
}

TEST_CASE("attention: CUDA lse and 4-d inputs", "[cuda][attention]") {
  kiln::manual_seed(33);
  SECTION("lse from the raw kernels, f32 and bf16 (lse stays f32)") {
    for (DType dt : {DType::F32, DType::BF16})
      for (bool causal : {false, true}) {
        const int64_t B = 3, Tq = 70, Tk = 45, D = 24, Dv = 40;
        Tensor q = kiln::randn({B, Tq, D}).to(dt), k = kiln::randn({B, Tk, D}).to(dt),
               v = kiln::randn({B, Tk, Dv}).to(dt);
        Tensor qf = q.to(DType::F32), kf = k.to(DType::F32), vf = v.to(DType::F32);
        Tensor out_c = kiln::empty({B, Tq, Dv}), lse_c = kiln::empty({B, Tq});
        kiln::kernels::attention_forward(out_c, lse_c, qf, kf, vf, 0.3, causal);
        Tensor out_d = kiln::empty({B, Tq, Dv}, on_gpu(dt)), lse_d = kiln::empty({B, Tq}, on_gpu(DType::F32));
        kiln::kernels::attention_forward(out_d, lse_d, q.to(kGpu), k.to(kGpu), v.to(kGpu), 0.3, causal);
        const std::string what = kiln::detail::concat(causal ? "causal " : "", kiln::dtype_name(dt));
        // lse is computed in f32 on both sides from identical (rounded) inputs
        require_near(lse_d, lse_c, 1e-5, what + ": lse");
        require_near(out_d, out_c.to(dt), tol_for(dt), what + ": out");
      }
  }
  SECTION("[batch, heads, T, D] inputs") {
    Tensor q = kiln::randn({2, 3, 33, 16}), k = kiln::randn({2, 3, 47, 16}), v = kiln::randn({2, 3, 47, 20});
    Tensor g = kiln::randn({2, 3, 33, 20});
    for (bool causal : {false, true}) {
      std::vector<Tensor> c = run(q, k, v, g, causal, kCpu), d = run(q, k, v, g, causal, kGpu);
      for (int i = 0; i < 4; ++i) require_near(d[i], c[i], 1e-4, "4-d operand " + std::to_string(i));
    }
  }
}

TEST_CASE("attention: CUDA gradients of a subset of the inputs", "[cuda][attention]") {
  kiln::manual_seed(34);
  Tensor q = kiln::randn({2, 77, 32}), k = kiln::randn({2, 90, 32}), v = kiln::randn({2, 90, 48});
  Tensor g = kiln::randn({2, 77, 48});
  for (bool causal : {false, true}) {
    // only v, only k, only q
    for (int which = 0; which < 3; ++which) {
      const bool gq = which == 2, gk = which == 1, gv = which == 0;
      std::vector<Tensor> c = run(q, k, v, g, causal, kCpu, gq, gk, gv);
      std::vector<Tensor> d = run(q, k, v, g, causal, kGpu, gq, gk, gv);
      for (int i = 1; i < 4; ++i) {
        const bool wanted = (i == 1 && gq) || (i == 2 && gk) || (i == 3 && gv);
        REQUIRE(d[i].defined() == wanted);
        if (wanted) require_near(d[i], c[i], 1e-4, "subset gradient " + std::to_string(i));
      }
    }
  }
}

TEST_CASE("attention: CUDA backward is bitwise reproducible", "[cuda][attention]") {
  KilnKernelOnly kiln_kernel;
  kiln::manual_seed(35);
  for (DType dt : {DType::F32, DType::BF16})
    for (bool causal : {false, true}) {
      Tensor q = kiln::randn({4, 257, 64}).to(dt), k = kiln::randn({4, 257, 64}).to(dt);
      Tensor v = kiln::randn({4, 257, 64}).to(dt), g = kiln::randn({4, 257, 64}).to(dt);
      std::vector<Tensor> a = run(q, k, v, g, causal, kGpu), b = run(q, k, v, g, causal, kGpu);
      for (int i = 0; i < 4; ++i) {
        INFO(kiln::dtype_name(dt) << (causal ? " causal" : "") << " result " << i);
        REQUIRE(kiln::equal(a[i].cpu(), b[i].cpu()));
      }
    }
}

TEST_CASE("attention: CUDA errors", "[cuda][attention]") {
  SECTION("head dim above 128") {
    Tensor q = kiln::randn({1, 8, 160}, on_gpu()), k = kiln::randn({1, 8, 160}, on_gpu()),
           v = kiln::randn({1, 8, 16}, on_gpu());
    REQUIRE_THROWS_WITH(F::scaled_dot_product_attention(q, k, v, false), Catch::Contains("head dims up to 128"));
  }
  SECTION("lse in the wrong dtype") {
    Tensor q = kiln::randn({1, 8, 16}, on_gpu(DType::BF16));
    Tensor out = kiln::empty({1, 8, 16}, on_gpu(DType::BF16)), lse = kiln::empty({1, 8}, on_gpu(DType::BF16));
    REQUIRE_THROWS_WITH(kiln::kernels::attention_forward(out, lse, q, q, q, 0.25, false), Catch::Contains("lse"));
  }
}

TEST_CASE("attention: q, k, v unbound from a fused projection, CUDA == CPU", "[cuda][attention]") {
  // The MultiheadAttention pattern: [B, T, 3, H, D] -> permute -> unbind. The CPU kernel reads
  // the strided heads in place and lays its output out as [B, T, H, D]; the CUDA op makes them
  // contiguous. Output and the projection's gradient (through unbind's one backward) must agree.
  kiln::manual_seed(36);
  const int64_t B = 2, T = 67, H = 3, D = 16;
  Tensor x0 = kiln::randn({B, T, 3, H, D}), gy = kiln::randn({B, H, T, D});
  for (bool causal : {false, true}) {
    INFO((causal ? "causal" : "not causal"));
    std::vector<Tensor> y, gx;
    for (const kiln::Device& dev : {kCpu, kGpu}) {
      Tensor x = x0.to(dev).requires_grad_(true);
      auto qkv = x.permute({2, 0, 3, 1, 4}).unbind(0);
      Tensor out = F::scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], causal);
      y.push_back(out.detach());
      gx.push_back(kiln::autograd::grad({out}, {x}, {gy.to(dev)})[0]);
    }
    require_near(y[1], y[0], 1e-4, "output");
    require_near(gx[1], gx[0], 1e-4, "gradient of the projection");
  }
}

TEST_CASE("nn::MultiheadAttention, nn::TransformerEncoderLayer, nn::Transformer: CUDA == CPU with masks",
          "[cuda][attention]") {
  // torch's module forms over the ops above: cross-attention with a bool attn_mask and a key
  // padding mask returning the weights, then an encoder layer (pre-norm, GELU) over a
  // non-contiguous input; outputs and the gradients of the inputs and of a weight.
  namespace nn = kiln::nn;
  kiln::manual_seed(41);
  const int64_t L = 37, S = 29, N = 3, E = 48, H = 3;
  nn::MultiheadAttention cpu_mha(nn::MultiheadAttentionOptions(E, H)), gpu_mha(nn::MultiheadAttentionOptions(E, H));
  gpu_mha.load_state_dict(cpu_mha.state_dict());
  gpu_mha.to(kGpu);
  Tensor q0 = kiln::randn({L, N, E}), k0 = kiln::randn({S, N, E}), v0 = kiln::randn({S, N, E});
  Tensor attn_mask = kiln::rand({L, S}) < 0.2, padding = kiln::rand({N, S}) < 0.2;
  attn_mask.select(1, 0).fill_(0.0);  // every query keeps key 0, so no row is all masked
  padding.select(1, 0).fill_(0.0);
  std::vector<Tensor> out, w, gq, gk, gw;
  for (const kiln::Device& dev : {kCpu, kGpu}) {
    nn::MultiheadAttention& mha = dev == kCpu ? cpu_mha : gpu_mha;
    Tensor q = q0.to(dev).detach().requires_grad_(true), k = k0.to(dev).detach().requires_grad_(true), v = v0.to(dev);
    auto [o, weights] =
        mha(q, k, v, nn::MultiheadAttentionArgs().attn_mask(attn_mask.to(dev)).key_padding_mask(padding.to(dev)));
    (o.sum() + weights.pow(2.0).sum()).backward();
    out.push_back(o.detach());
    w.push_back(weights.detach());
    gq.push_back(q.grad());
    gk.push_back(k.grad());
    gw.push_back(mha.in_proj_weight.grad());
  }
  require_near(out[1], out[0], 1e-4, "attention output");
  require_near(w[1], w[0], 1e-4, "attention weights");
  require_near(gq[1], gq[0], 1e-4, "query gradient");
  require_near(gk[1], gk[0], 1e-4, "key gradient");
  require_near(gw[1], gw[0], 1e-4, "in-projection weight gradient");
  // Sample 0 with every key padded: without weights it attends to nothing (proj's bias) on both
  // devices, with finite gradients (the zeroed rows of the composite attention).
  Tensor all_padded = padding.clone();
  all_padded.select(0, 0).fill_(1.0);
  std::vector<Tensor> pad_out, pad_gq;
  for (const kiln::Device& dev : {kCpu, kGpu}) {
    nn::MultiheadAttention& mha = dev == kCpu ? cpu_mha : gpu_mha;
    Tensor q = q0.to(dev).detach().requires_grad_(true);
    auto [o, none] = mha(q, k0.to(dev), v0.to(dev),
                         nn::MultiheadAttentionArgs().key_padding_mask(all_padded.to(dev)).need_weights(false));
    o.pow(2.0).sum().backward();
    pad_out.push_back(o.detach());
    pad_gq.push_back(q.grad());
  }
  require_near(pad_out[1], pad_out[0], 1e-4, "output with a fully padded sample");
  require_near(pad_gq[1], pad_gq[0], 1e-4, "query gradient with a fully padded sample");
  REQUIRE(kiln::equal(pad_out[1].select(1, 0).cpu(), cpu_mha.out_proj.bias.detach().view({1, E}).expand({L, E})));

  auto options =
      nn::TransformerEncoderLayerOptions(E, H).dim_feedforward(80).norm_first(true).activation("gelu").dropout(0.0);
  nn::TransformerEncoderLayer cpu_layer(options), gpu_layer(options);
  gpu_layer.load_state_dict(cpu_layer.state_dict());
  gpu_layer.to(kGpu);
  Tensor src0 = kiln::randn({N, L, E});
  Tensor src_padding = kiln::rand({N, L}) < 0.2;
  src_padding.select(1, 0).fill_(0.0);
  std::vector<Tensor> y, gs, g1;
  for (const kiln::Device& dev : {kCpu, kGpu}) {
    nn::TransformerEncoderLayer& layer = dev == kCpu ? cpu_layer : gpu_layer;
    Tensor src = src0.to(dev).detach().requires_grad_(true);
    Tensor o = layer(src.transpose(0, 1), Tensor(), src_padding.to(dev), false);  // [L, N, E], a strided view
    o.pow(2.0).sum().backward();
    y.push_back(o.detach());
    gs.push_back(src.grad());
    g1.push_back(layer.linear1.weight.grad());
  }
  require_near(y[1], y[0], 1e-4, "encoder layer output");
  require_near(gs[1], gs[0], 1e-4, "encoder layer input gradient");
  require_near(g1[1], g1[0], 1e-4, "linear1 weight gradient");

  // nn::Transformer (encoder + decoder, causal target mask, memory padding).
  auto t_options = nn::TransformerOptions()
                       .d_model(E)
                       .nhead(H)
                       .num_encoder_layers(2)
                       .num_decoder_layers(2)
                       .dim_feedforward(64)
                       .dropout(0.0);
  nn::Transformer cpu_t(t_options), gpu_t(t_options);
  gpu_t.load_state_dict(cpu_t.state_dict());
  gpu_t.to(kGpu);
  Tensor tgt0 = kiln::randn({S, N, E});
  std::vector<Tensor> ty, gsrc, gtgt;
  for (const kiln::Device& dev : {kCpu, kGpu}) {
    nn::Transformer& model = dev == kCpu ? cpu_t : gpu_t;
    Tensor src = src0.to(dev).transpose(0, 1).contiguous().detach().requires_grad_(true);
    Tensor tgt = tgt0.to(dev).detach().requires_grad_(true);
    Tensor causal = nn::Transformer::generate_square_subsequent_mask(S, kiln::TensorOptions().device(dev));
    Tensor o = model(src, tgt, Tensor(), causal, Tensor(), src_padding.to(dev), Tensor(), src_padding.to(dev));
    o.pow(2.0).sum().backward();
    ty.push_back(o.detach());
    gsrc.push_back(src.grad());
    gtgt.push_back(tgt.grad());
  }
  require_near(ty[1], ty[0], 1e-4, "Transformer output");
  require_near(gsrc[1], gsrc[0], 1e-4, "Transformer src gradient");
  require_near(gtgt[1], gtgt[0], 1e-4, "Transformer tgt gradient");
}
