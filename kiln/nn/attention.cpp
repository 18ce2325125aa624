#include "kiln/nn/attention.h"

#include <cmath>
#include <limits>

#include "kiln/nn/functional.h"
#include "kiln/nn/init.h"

namespace kiln::nn {

namespace {
// Linear's default initialisation (kaiming_uniform_ with a = sqrt(5), bias U(+-1/sqrt(fan_in))),
// which the input projection keeps from when it was a Linear.
Tensor linear_init_weight(Tensor w) {
  init::kaiming_uniform_(w, std::sqrt(5.0));
  return w;
}
Tensor linear_init_bias(Tensor b, int64_t fan_in) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  init::uniform_(b, -bound, bound);
  return b;
}
}  // namespace

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// One of torch's mask forms as an additive mask of the scores' dtype: bool true -> -inf (the key
// is not attended to), floating -> added as given.
Tensor additive_mask(const Tensor& mask, const char* name, const Tensor& query) {
  KILN_CHECK(mask.device() == query.device(), "MultiheadAttention: ", name, " is on ", mask.device(),
             " but the query is on ", query.device());
  if (mask.dtype() == DType::Bool)
    return zeros(mask.sizes(), TensorOptions().dtype(query.dtype()).device(mask.device())).masked_fill(mask, kNegInf);
  KILN_CHECK(mask.is_floating_point(), "MultiheadAttention: ", name,
             " must be bool (true: not attended to) or floating (added to the scores), got ", mask.dtype());
  return mask.dtype() == query.dtype() ? mask : mask.to(query.dtype());
}

// [L, S]: -inf where key j comes after query i (torch's causal mask, aligned at the top left).
Tensor causal_additive_mask(int64_t L, int64_t S, const Tensor& query) {
  const TensorOptions index = TensorOptions().dtype(DType::I64).device(query.device());
  const Tensor later =
      arange(static_cast<double>(S), index).view({1, S}) > arange(static_cast<double>(L), index).view({L, 1});
  return zeros({L, S}, TensorOptions().dtype(query.dtype()).device(query.device())).masked_fill(later, kNegInf);
}

}  // namespace

MultiheadAttention::MultiheadAttention(const MultiheadAttentionOptions& o)
    : MultiheadAttention(o, /*torch_init=*/true) {}

MultiheadAttention::MultiheadAttention(int64_t e, int64_t h, bool c, bool bias, double dropout)
    : MultiheadAttention(MultiheadAttentionOptions(e, h).bias(bias).batch_first(true).causal(c).output_dropout(dropout),
                         /*torch_init=*/false) {}

MultiheadAttention::MultiheadAttention(const MultiheadAttentionOptions& o, bool torch_init)
    : Module("MultiheadAttention"),
      options(o),
      embed_dim(o.embed_dim()),
      num_heads(o.num_heads()),
      causal(o.causal()),
      // Linear's default initialisation, drawn before out_proj's (torch_init replaces it below)
      in_proj_weight(
          linear_init_weight(register_parameter("in_proj_weight", empty({3 * o.embed_dim(), o.embed_dim()})))),
      in_proj_bias(o.bias()
                       ? linear_init_bias(register_parameter("in_proj_bias", empty({3 * o.embed_dim()})), o.embed_dim())
                       : Tensor()),
      out_proj(LinearOptions(o.embed_dim(), o.embed_dim()).bias(o.bias())) {
  KILN_CHECK(num_heads > 0 && embed_dim > 0 && embed_dim % num_heads == 0, "MultiheadAttention: embed_dim (", embed_dim,
             ") must be positive and divisible by num_heads (", num_heads, ")");
  KILN_CHECK(o.dropout() >= 0.0 && o.dropout() <= 1.0, "MultiheadAttention: dropout must be in [0, 1], got ",
             o.dropout());
  register_module("out_proj", out_proj);  // the one child, as in torch
  if (torch_init) {
    init::xavier_uniform_(in_proj_weight);
    if (o.bias()) {
      init::zeros_(in_proj_bias);
      init::zeros_(out_proj.bias);
    }
  }
}

Tensor MultiheadAttention::forward(const Tensor& x) {
  if (options.batch_first() && x.dim() == 3) return output_dropout(out_proj(heads(x)));
  return std::get<0>(forward(x, x, x, MultiheadAttentionArgs().need_weights(false)));
}

Tensor MultiheadAttention::heads(const Tensor& x) {
  KILN_CHECK(x.dim() == 3 && x.size(2) == embed_dim, "MultiheadAttention: expected [B, T, ", embed_dim, "], got sizes ",
             x.sizes());
  const int64_t B = x.size(0), T = x.size(1), D = embed_dim / num_heads;
  // q, k, v: [B, H, T, D] views of the projection (unbind: their gradients land in one buffer)
  auto qkv_out = functional::linear(x, in_proj_weight, in_proj_bias)
                     .view({B, T, 3, num_heads, D})
                     .permute({2, 0, 3, 1, 4})
                     .unbind(0);
  const double p = is_training() ? options.dropout() : 0.0;
  Tensor y = functional::scaled_dot_product_attention(qkv_out[0], qkv_out[1], qkv_out[2], Tensor(), p, causal);
  return y.transpose(1, 2).reshape({B, T, embed_dim});  // a view: y is laid out [B, T, H, D]
}

std::tuple<Tensor, Tensor> MultiheadAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                                       const MultiheadAttentionArgs& a) {
  const char* op = "MultiheadAttention";
  const char* layout = options.batch_first() ? "[N, L, E]" : "[L, N, E]";
  KILN_CHECK(query.defined() && key.defined() && value.defined(), op, ": query, key and value must be defined");
  const bool batched = query.dim() == 3;
  KILN_CHECK((query.dim() == 2 || batched) && key.dim() == query.dim() && value.dim() == query.dim(), op,
             ": query, key and value must all be 3-D (", layout, ") or all 2-D (unbatched [L, E]), got sizes ",
             query.sizes(), ", ", key.sizes(), ", ", value.sizes());
  const int64_t E = embed_dim, H = num_heads, D = E / H;
  KILN_CHECK(query.size(-1) == E && key.size(-1) == E && value.size(-1) == E, op, ": query, key and value must have ",
             "embed_dim = ", E, " features (a kdim or vdim of its own is not supported), got sizes ", query.sizes(),
             ", ", key.sizes(), ", ", value.sizes());
  // Everything below works batch first: [N, L, E].
  auto batch_major = [&](const Tensor& t) {
    return !batched ? t.unsqueeze(0) : options.batch_first() ? t : t.transpose(0, 1);
  };
  const Tensor qb = batch_major(query), kb = batch_major(key), vb = batch_major(value);
  const int64_t N = qb.size(0), L = qb.size(1), S = kb.size(1);
  KILN_CHECK(kb.size(0) == N && vb.size(0) == N && vb.size(1) == S, op, ": key and value must hold the same ",
             "keys for the query's batch (", layout, " with S keys), got sizes query ", query.sizes(), ", key ",
             key.sizes(), ", value ", value.sizes());

  // The projections: one GEMM when query, key and value are one tensor (self-attention), else the
  // rows of in_proj_weight each input needs. q, k, v end up [N, H, T, D].
  auto rows = [&](int64_t first, int64_t count, const Tensor& x) {
    return functional::linear(x, in_proj_weight.narrow(0, first, count),
                              in_proj_bias.defined() ? in_proj_bias.narrow(0, first, count) : Tensor());
  };
  auto split = [&](const Tensor& t, int64_t T, int64_t parts) {
    return t.view({N, T, parts, H, D}).permute({2, 0, 3, 1, 4}).unbind(0);
  };
  Tensor q, k, v;
  if (query.is_same(key) && key.is_same(value)) {
    auto qkv_out = split(functional::linear(qb, in_proj_weight, in_proj_bias), L, 3);
    q = qkv_out[0], k = qkv_out[1], v = qkv_out[2];
  } else {
    q = split(rows(0, E, qb), L, 1)[0];
    if (key.is_same(value)) {
      auto kv = split(rows(E, 2 * E, kb), S, 2);
      k = kv[0], v = kv[1];
    } else {
      k = split(rows(E, E, kb), S, 1)[0];
      v = split(rows(2 * E, E, vb), S, 1)[0];
    }
  }

  // is_causal is torch's hint that attn_mask is the causal mask: where the causal kernel can take
  // its place (no key padding mask, no weights asked for) the mask is dropped for it, as torch
  // does; otherwise the mask is used as given. Without an attn_mask it masks causally (torch
  // raises an error there). The causal option always masks causally.
  const bool mask_replaced_by_hint =
      a.is_causal() && a.attn_mask().defined() && !a.key_padding_mask().defined() && !a.need_weights();
  bool is_causal = causal || (a.is_causal() && (!a.attn_mask().defined() || mask_replaced_by_hint));

  // The masks, as one additive mask that broadcasts to the scores [N, H, L, S].
  Tensor mask;
  auto add = [&](const Tensor& m) { mask = mask.defined() ? mask + m : m; };
  if (a.attn_mask().defined()) {
    const Tensor& m = a.attn_mask();
    const bool two_d = m.dim() == 2 && m.size(0) == L && m.size(1) == S;
    const bool three_d = m.dim() == 3 && m.size(0) == N * H && m.size(1) == L && m.size(2) == S;
    KILN_CHECK(two_d || three_d, op, ": attn_mask must be [L, S] = [", L, ", ", S, "] or [N * num_heads, L, S] = [",
               N * H, ", ", L, ", ", S, "], got sizes ", m.sizes());
    if (!mask_replaced_by_hint) add(additive_mask(m, "attn_mask", q).view({two_d ? 1 : N, two_d ? 1 : H, L, S}));
  }
  if (a.key_padding_mask().defined()) {
    const Tensor& m = a.key_padding_mask();
    KILN_CHECK(batched ? (m.dim() == 2 && m.size(0) == N && m.size(1) == S) : (m.dim() == 1 && m.size(0) == S), op,
               ": key_padding_mask must be ", batched ? "[N, S] = [" + std::to_string(N) + ", " : "[S] = [", S,
               "], got sizes ", m.sizes());
    add(additive_mask(m, "key_padding_mask", q).view({N, 1, 1, S}));
  }
  if (is_causal && mask.defined()) {
    add(causal_additive_mask(L, S, q));
    is_causal = false;
  }

  const double p = is_training() ? options.dropout() : 0.0;
  Tensor y, weights;
  if (a.need_weights()) {
    std::tie(y, weights) = functional::scaled_dot_product_attention_and_weights(q, k, v, mask, p, is_causal);
    if (a.average_attn_weights()) weights = weights.mean({1});
    if (!batched) weights = weights.squeeze(0);
  } else {
    y = functional::scaled_dot_product_attention(q, k, v, mask, p, is_causal);
  }
  Tensor out = output_dropout(out_proj(y.transpose(1, 2).reshape({N, L, E})));
  if (!batched) out = out.squeeze(0);
  else if (!options.batch_first()) out = out.transpose(0, 1);
  return {out, weights};
}

// torch prints nothing for its MultiheadAttention; only kiln's own options show.
std::string MultiheadAttention::extra_repr() const {
  std::string s = causal ? "causal=True" : "";
  if (options.output_dropout() > 0.0)
    s += std::string(s.empty() ? "" : ", ") + "output_dropout=" + float_repr(options.output_dropout());
  return s;
}

Tensor MultiheadAttention::output_dropout(const Tensor& x) {
  return functional::dropout(x, options.output_dropout(), is_training());
}

TransformerBlock::TransformerBlock(const TransformerBlockOptions& o)
    : Module("TransformerBlock"),
      options(o),
      ln1(o.embed_dim()),
      ln2(o.embed_dim()),
      attn(o.embed_dim(), o.num_heads(), /*causal=*/true, o.bias(), o.dropout()),
      fc(LinearOptions(o.embed_dim(), o.mlp_ratio() * o.embed_dim()).bias(o.bias())),
      proj(LinearOptions(o.mlp_ratio() * o.embed_dim(), o.embed_dim()).bias(o.bias())),
      drop(o.dropout()) {
  register_module("ln1", ln1);
  register_module("attn", attn);
  register_module("ln2", ln2);
  register_module("fc", fc);
  register_module("proj", proj);
  register_module("drop", drop);
}

Tensor TransformerBlock::forward(const Tensor& x) {
  // x + attn(ln1(x)), the projection's bias, the dropout and the residual add in one pass
  Tensor h = functional::bias_dropout_add(functional::linear(attn.heads(ln1(x)), attn.out_proj.weight),
                                          attn.out_proj.bias, x, attn.options.output_dropout(), is_training());
  // The MLP on the fused kernels: bias + GELU in the first GEMM's epilogue
  // (cuBLASLt on CUDA), then the projection without its bias, whose bias add, dropout and the
  // residual add are one pass. Same math, masks and random stream as
  // h + drop(proj(act(fc(ln2(h))))) with act = tanh GELU.
  Tensor a = functional::linear_gelu(ln2(h), fc.weight, fc.bias, act.approximate);
  return functional::bias_dropout_add(functional::linear(a, proj.weight), proj.bias, h, drop.p, is_training());
}

}  // namespace kiln::nn
