// scaled_dot_product_attention: q [..., Tq, D], k [..., Tk, D], v [..., Tk, Dv] with identical
// leading dims. Forward and backward run the blocked online-softmax kernel
// (kiln/kernels/cpu/attention.cpp): no [Tq, Tk] score matrix is materialised; the backward
// recomputes each block of probabilities from the saved per-row logsumexp. 16-bit inputs are
// widened to float32 for the CPU kernel; the CUDA kernel (kiln/kernels/cuda/attention.cu) reads
// them natively and accumulates in float32. lse is kept in the stat dtype. Under create_graph
// the backward is the composite formula of differentiable ops (which does materialise the
// scores).
// On CUDA, f16/bf16 attention without a mask or dropout runs cuDNN's fused attention first
// (kiln/cuda/cudnn_graph.h; q, k, v read by strides, out laid out [B, T, H, D] for 4-d inputs)
// and kiln's kernel where cuDNN does not take the case or kiln::cudnn::set_sdpa_backend says
// kiln (docs/gpu.md, "Attention"). Both write the same lse, so the backward follows the
// forward's path and falls back to kiln's kernel if cuDNN refuses it.
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "kiln/core/autocast.h"
#include "kiln/core/autograd.h"
#include "kiln/core/shape.h"
#include "kiln/cuda/cudnn.h"
#include "kiln/cuda/cudnn_graph.h"
#include "kiln/kernels/activation.h"
#include "kiln/kernels/attention.h"
#include "kiln/kernels/dropout.h"
#include "kiln/kernels/norm.h"
#include "kiln/nn/functional.h"

namespace kiln::nn::functional {

using autograd::SavedTensor;
using autograd::TensorList;

namespace {

Tensor to3d(const Tensor& t, int64_t B, DType dt) {
  Tensor r = t.to(dt).reshape({B, t.size(-2), t.size(-1)});
  return r.is_contiguous() ? r : r.contiguous();
}

// What the kernel reads: on the CPU a [B, T, D] or [B, H, T, D] tensor as it lies, whatever its
// strides (the heads of a fused projection are permuted views; copying them cost ~10% of a small
// GPT's step), when D has unit stride; otherwise, and on CUDA, contiguous [B, T, D].
Tensor kernel_operand(const Tensor& t, int64_t B, DType dt) {
  Tensor c = t.to(dt);
  if (!c.is_cuda() && (c.dim() == 3 || c.dim() == 4) && c.stride(-1) == 1) return c;
  return to3d(c, B, dt);
}

// [Tq, Tk] bool: true where key j is visible from query i (j <= i).
Tensor causal_keep(int64_t Tq, int64_t Tk, Device dev) {
  TensorOptions o = TensorOptions().dtype(DType::I64).device(dev);
  return arange(static_cast<double>(Tk), o).view({1, Tk}) <= arange(static_cast<double>(Tq), o).view({Tq, 1});
}

void check_qkv(const Tensor& q, const Tensor& k, const Tensor& v) {
  const char* op = "scaled_dot_product_attention";
  KILN_CHECK(q.defined() && k.defined() && v.defined(), op, ": q, k and v must be defined");
  KILN_CHECK(q.device() == k.device() && k.device() == v.device(), op, ": q, k, v must be on one device, got ",
             q.device(), ", ", k.device(), ", ", v.device());
  KILN_CHECK(is_floating(q.dtype()) && q.dtype() == k.dtype() && k.dtype() == v.dtype(), op,
             ": q, k, v must share one floating-point dtype, got ", q.dtype(), ", ", k.dtype(), ", ", v.dtype());
  KILN_CHECK(q.dim() >= 2 && q.dim() == k.dim() && k.dim() == v.dim(), op,
             ": q, k, v must be [..., T, D] with the same number of dimensions, got sizes q ", q.sizes(), ", k ",
             k.sizes(), ", v ", v.sizes());
  const int64_t nd = q.dim();
  bool lead_ok = true;
  for (int64_t d = 0; d < nd - 2; ++d) lead_ok = lead_ok && q.size(d) == k.size(d) && k.size(d) == v.size(d);
  KILN_CHECK(lead_ok && q.size(-1) == k.size(-1) && k.size(-2) == v.size(-2), op, ": mismatched sizes q ", q.sizes(),
             ", k ", k.sizes(), ", v ", v.sizes(),
             " (expected q [..., Tq, D], k [..., Tk, D], v [..., Tk, Dv] with equal leading dims)");
  KILN_CHECK(k.size(-2) > 0 || q.size(-2) == 0, op, ": k and v have no keys (sizes k ", k.sizes(), ", v ", v.sizes(),
             ")");
}

// ------------------------------------------------------------ cuDNN's fused attention

namespace cg = kiln::cudnn::graph;

// [..., T, D] as [B, H, T, D]: 4-d as it is, 3-d as [B, 1, T, D], 2-d as [1, 1, T, D], more dims
// with the leading ones merged into B.
Tensor as4d(const Tensor& t) {
  if (t.dim() == 4) return t;
  if (t.dim() == 3) return t.unsqueeze(1);
  int64_t lead = 1;
  for (int64_t d = 0; d + 3 < t.dim(); ++d) lead *= t.size(d);
  return t.reshape({lead, t.dim() >= 3 ? t.size(-3) : 1, t.size(-2), t.size(-1)});
}

cg::SdpaOperand operand_of(const Tensor& t4) {
  cg::SdpaOperand o;
  o.data = t4.data_ptr();
  for (int d = 0; d < 4; ++d) {
    o.size[d] = t4.size(d);
    o.stride[d] = t4.stride(d);
  }
  return cg::sdpa_canonical(o);
}

// t4 itself when cuDNN takes its strides and alignment, else a contiguous copy.
Tensor cudnn_operand(const Tensor& t4) {
  if (cg::sdpa_operand_ok(operand_of(t4))) return t4;
  Tensor c = empty(t4.sizes(), t4.options());
  c.copy_(t4);
  return c;
}

// Whether the cuDNN path may take this case (the device's compute capability and cuDNN's own
// support check are the kernel's to decide).
bool cudnn_candidate(const Tensor& q, const Tensor& k, const Tensor& v) {
  cg::SdpaCase c;
  c.built = kernels::attention_forward_cudnn.has(kernels::Backend::CUDA);
  c.backend = kiln::cudnn::sdpa_backend();
  c.cuda = q.is_cuda();
  c.dtype = q.dtype();
  c.H = q.dim() >= 3 ? q.size(-3) : 1;
  c.B = 1;
  for (int64_t d = 0; d + 3 < q.dim(); ++d) c.B *= q.size(d);
  c.Tq = q.size(-2), c.Tk = k.size(-2), c.D = q.size(-1), c.Dv = v.size(-1);
  return cg::sdpa_refusal(c) == cg::SdpaRefusal::None;
}

// The forward through cuDNN: out (sizes out_sizes) and lse [B * H, Tq] f32; false when cuDNN
// does not take the case. 4-d out is laid out [B, T, H, D], as the CPU kernel's.
bool cudnn_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, bool causal,
                   const IntList& out_sizes, Tensor* out, Tensor* lse) {
  if (!cudnn_candidate(q, k, v)) return false;
  Tensor q4 = cudnn_operand(as4d(q)), k4 = cudnn_operand(as4d(k)), v4 = cudnn_operand(as4d(v));
  const int64_t B = q4.size(0), H = q4.size(1), Tq = q4.size(2), Dv = v4.size(3);
  const TensorOptions oo = q.options();
  Tensor o4 = q.dim() == 4 ? empty({B, Tq, H, Dv}, oo).transpose(1, 2) : empty({B, H, Tq, Dv}, oo);
  Tensor l = empty({B * H, Tq}, TensorOptions().dtype(DType::F32).device(q.device()));
  if (!kernels::attention_forward_cudnn(o4, l, q4, k4, v4, scale, causal)) return false;
  *out = q.dim() == 4 ? o4 : o4.view(out_sizes);
  *lse = l;
  return true;
}

// The backward through cuDNN: the gradients of q, k, v (undefined where not wanted), or nullopt
// when cuDNN does not take the case. q, k, v of one fused projection get gradients in one buffer
// laid out like it, written in place by strides.
std::optional<TensorList> cudnn_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                         const Tensor& g, const Tensor& lse, double scale, bool causal, bool gq,
                                         bool gk, bool gv) {
  Tensor q4 = cudnn_operand(as4d(q)), k4 = cudnn_operand(as4d(k)), v4 = cudnn_operand(as4d(v));
  Tensor o4 = cudnn_operand(as4d(out)), g4 = cudnn_operand(as4d(g));
  std::vector<Tensor> d = empty_like_siblings({q4, k4, v4}, q4.options());
  for (Tensor& t : d)
    if (!cg::sdpa_operand_ok(operand_of(t))) t = empty(t.sizes(), t.options());
  if (!kernels::attention_backward_cudnn(d[0], d[1], d[2], g4, q4, k4, v4, o4, lse, scale, causal)) return std::nullopt;
  return TensorList{gq ? d[0].reshape(q.sizes()) : Tensor(), gk ? d[1].reshape(k.sizes()) : Tensor(),
                    gv ? d[2].reshape(v.sizes()) : Tensor()};
}

// The blocked kernels' path: no mask, no dropout; scale 0 means 1 / sqrt(D).
Tensor blocked_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal, double scale_in) {
  if (auto out = amp::autocast_rerun(amp::Policy::LowPrecision, {q, k, v}, [&](const auto& a) {
        return blocked_attention(a[0], a[1], a[2], is_causal, scale_in);
      }))
    return *out;
  const char* op = "scaled_dot_product_attention";
  check_qkv(q, k, v);
  const int64_t nd = q.dim();
  const int64_t Tq = q.size(-2), Tk = k.size(-2), D = q.size(-1), Dv = v.size(-1);
  int64_t B = 1;
  for (int64_t d = 0; d < nd - 2; ++d) B *= q.size(d);
  const double scale = scale_in != 0.0 ? scale_in : 1.0 / std::sqrt(static_cast<double>(D));
  // kernel dtype: f16/bf16 stay native on CUDA; the CPU kernel takes f32 or f64
  const DType cdt = q.dtype() == DType::F64 || q.is_cuda() ? q.dtype() : DType::F32;
  const DType sdt = kernels::norm_stat_dtype(q.dtype());  // lse

  Tensor out, lse, q3, k3, v3;
  IntList out_sizes = q.sizes();
  out_sizes.back() = Dv;
  bool via_cudnn = false;
  {
    NoGradGuard ng;
    if (q.is_cuda() && B * Tq > 0)
      via_cudnn = cudnn_forward(q.detach(), k.detach(), v.detach(), scale, is_causal, out_sizes, &out, &lse);
  }
  if (!via_cudnn) {
    NoGradGuard ng;
    if (q.is_cuda()) kiln::cudnn::detail::count_sdpa(kiln::cudnn::detail::SdpaEvent::KilnForward);
    q3 = kernel_operand(q.detach(), B, cdt);
    k3 = kernel_operand(k.detach(), B, cdt);
    v3 = kernel_operand(v.detach(), B, cdt);
    const TensorOptions oo = TensorOptions().dtype(cdt).device(q.device());
    // [B, H, T, D] out is laid out as [B, T, H, D] (as PyTorch's CPU flash attention does), so
    // merging the heads back, out.transpose(1, 2).reshape({B, T, H * D}), is a view.
    const bool heads_last = q3.dim() == 4;
    Tensor o3 = heads_last ? empty({q.size(0), Tq, q.size(1), Dv}, oo).transpose(1, 2) : empty({B, Tq, Dv}, oo);
    lse = empty({B, Tq}, TensorOptions().dtype(sdt).device(q.device()));
    if (B * Tq > 0) kernels::attention_forward(o3, lse, q3, k3, v3, scale, is_causal);
    out = (heads_last ? o3 : o3.view(out_sizes)).to(q.dtype());
  }
  if (autograd::any_requires_grad({&q, &k, &v})) {
    const bool gq = q.requires_grad(), gk = k.requires_grad(), gv = v.requires_grad();
    SavedTensor sq(q, op), sk(k, op), sv(v, op), so = SavedTensor::output(out, op);
    const DType dt = q.dtype();
    autograd::record_function(
        "ScaledDotProductAttentionBackward", {&q, &k, &v}, {&out},
        autograd::fused_or_composite(
            [=](const TensorList& g) {
              Tensor qs = sq.get(), ks = sk.get(), vs = sv.get();
              if (via_cudnn) {
                if (auto d = cudnn_backward(qs.detach(), ks.detach(), vs.detach(), so.get().detach(), g[0], lse, scale,
                                            is_causal, gq, gk, gv))
                  return *d;
              }
              if (qs.is_cuda()) kiln::cudnn::detail::count_sdpa(kiln::cudnn::detail::SdpaEvent::KilnBackward);
              Tensor q3b = kernel_operand(qs.detach(), B, cdt), k3b = kernel_operand(ks.detach(), B, cdt),
                     v3b = kernel_operand(vs.detach(), B, cdt);
              Tensor o3b = kernel_operand(so.get().detach(), B, cdt), g3 = kernel_operand(g[0], B, cdt);
              TensorOptions o = TensorOptions().dtype(cdt).device(qs.device());
              Tensor dq, dk, dv;
              if (gq && gk && gv && !qs.is_cuda() && q3b.dim() == 4) {
                // q, k, v of one fused projection: their gradients in one buffer laid out like it, which
                // the projection's unbind backward then takes without a copy (the CPU kernel writes
                // strided gradients)
                auto d = empty_like_siblings({q3b, k3b, v3b}, o);
                dq = d[0], dk = d[1], dv = d[2];
              } else {
                dq = gq ? empty(q3b.sizes(), o) : Tensor();
                dk = gk ? empty(k3b.sizes(), o) : Tensor();
                dv = gv ? empty(v3b.sizes(), o) : Tensor();
              }
              if (B * Tq > 0) {
                kernels::attention_backward(dq, dk, dv, g3, q3b, k3b, v3b, o3b, lse, scale, is_causal);
              } else {
                if (gk) dk.zero_();
                if (gv) dv.zero_();
              }
              auto shaped = [](const Tensor& t, const Tensor& like) {
                return t.sizes() == like.sizes() ? t : t.view(like.sizes());
              };
              return TensorList{gq ? shaped(dq, qs).to(dt) : Tensor(), gk ? shaped(dk, ks).to(dt) : Tensor(),
                                gv ? shaped(dv, vs).to(dt) : Tensor()};
            },
            [=](const TensorList& g) {
              Tensor qs = sq.get(), ks = sk.get(), vs = sv.get();
              // create_graph: composite formula
              Tensor s = matmul(qs, ks.transpose(-2, -1)) * scale;
              if (is_causal) s = where(causal_keep(Tq, Tk, qs.device()), s, -std::numeric_limits<double>::infinity());
              Tensor p = kiln::softmax(s, -1);
              Tensor dp = matmul(g[0], vs.transpose(-2, -1));
              Tensor ds = p * (dp - sum(dp * p, {-1}, true));
              return TensorList{gq ? matmul(ds, ks) * scale : Tensor(),
                                gk ? matmul(ds.transpose(-2, -1), qs) * scale : Tensor(),
                                gv ? matmul(p.transpose(-2, -1), g[0]) : Tensor()};
            }));
  }
  return out;
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal) {
  return blocked_attention(q, k, v, is_causal, 0.0);
}

namespace {
std::tuple<Tensor, Tensor> composite_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                               const Tensor& attn_mask, double dropout_p, bool is_causal,
                                               std::optional<double> scale, bool zero_masked_rows);
}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask,
                                    double dropout_p, bool is_causal, std::optional<double> scale) {
  if (!attn_mask.defined() && dropout_p == 0.0) {
    KILN_CHECK(!scale || *scale != 0.0, "scaled_dot_product_attention: scale must be non-zero");
    return blocked_attention(q, k, v, is_causal, scale ? *scale : 0.0);
  }
  return std::get<0>(composite_attention(q, k, v, attn_mask, dropout_p, is_causal, scale, /*zero_masked_rows=*/true));
}

std::tuple<Tensor, Tensor> scaled_dot_product_attention_and_weights(const Tensor& q, const Tensor& k, const Tensor& v,
                                                                    const Tensor& attn_mask, double dropout_p,
                                                                    bool is_causal, std::optional<double> scale) {
  return composite_attention(q, k, v, attn_mask, dropout_p, is_causal, scale, /*zero_masked_rows=*/false);
}

namespace {

// softmax(q k^T * scale + mask) [dropout] v and the probabilities. zero_masked_rows: a query whose
// keys are all masked attends to nothing (probabilities and output 0, zero gradients), as torch's
// scaled_dot_product_attention; otherwise its softmax gives NaN there, as torch's
// nn.MultiheadAttention when it returns the weights.
std::tuple<Tensor, Tensor> composite_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                               const Tensor& attn_mask, double dropout_p, bool is_causal,
                                               std::optional<double> scale, bool zero_masked_rows) {
  const char* op = "scaled_dot_product_attention";
  KILN_CHECK(dropout_p >= 0.0 && dropout_p <= 1.0, op, ": dropout_p must be in [0, 1], got ", dropout_p);
  KILN_CHECK(!(attn_mask.defined() && is_causal), op, ": give an attn_mask or is_causal, not both");
  KILN_CHECK(!scale || *scale != 0.0, op, ": scale must be non-zero");
  check_qkv(q, k, v);
  const int64_t Tq = q.size(-2), Tk = k.size(-2);
  const double ninf = -std::numeric_limits<double>::infinity();
  Tensor s = matmul(q, k.transpose(-2, -1)) * (scale ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  if (is_causal) s = where(causal_keep(Tq, Tk, q.device()), s, ninf);
  if (attn_mask.defined()) {
    KILN_CHECK(attn_mask.device() == q.device(), op, ": attn_mask is on ", attn_mask.device(), " but q is on ",
               q.device());
    KILN_CHECK(attn_mask.dtype() == DType::Bool || attn_mask.is_floating_point(), op,
               ": attn_mask must be bool (true: attend) or floating (added to the scores), got ", attn_mask.dtype());
    KILN_CHECK(broadcast_shapes(attn_mask.sizes(), s.sizes(), op) == s.sizes(), op, ": attn_mask of sizes ",
               attn_mask.sizes(), " does not broadcast to the scores' sizes ", s.sizes());
    s = attn_mask.dtype() == DType::Bool ? where(attn_mask, s, ninf) : s + attn_mask;
  }
  Tensor p;
  if (zero_masked_rows) {
    // The masked rows' scores are replaced before the softmax, so no NaN reaches its backward.
    Tensor masked_row = s.amax({-1}, /*keepdim=*/true) == ninf;
    p = where(masked_row, 0.0, kiln::softmax(where(masked_row, 0.0, s), -1));
  } else {
    p = kiln::softmax(s, -1);
  }
  if (dropout_p > 0.0) p = dropout(p, dropout_p, true);
  return {matmul(p, v), p};
}

}  // namespace

}  // namespace kiln::nn::functional
