#include "kiln/nn/attention.h"

#include "kiln/nn/functional.h"

namespace kiln::nn {

MultiheadAttention::MultiheadAttention(int64_t e, int64_t h, bool c, bool bias, double dropout)
    : Module("MultiheadAttention"),
      embed_dim(e),
      num_heads(h),
      causal(c),
      qkv(LinearOptions(e, 3 * e).bias(bias)),
      proj(LinearOptions(e, e).bias(bias)),
      resid_dropout(dropout) {
  KILN_CHECK(h > 0 && e % h == 0, "MultiheadAttention: embed_dim (", e, ") must be divisible by num_heads (", h, ")");
  register_module("qkv", qkv);
  register_module("proj", proj);
  register_module("resid_dropout", resid_dropout);
}

Tensor MultiheadAttention::forward(const Tensor& x) { return resid_dropout(proj(heads(x))); }

Tensor MultiheadAttention::heads(const Tensor& x) {
  KILN_CHECK(x.dim() == 3 && x.size(2) == embed_dim, "MultiheadAttention: expected [B, T, ", embed_dim,
             "], got sizes ", x.sizes());
  const int64_t B = x.size(0), T = x.size(1), D = embed_dim / num_heads;
  // q, k, v: [B, H, T, D] views of the projection (unbind: their gradients land in one buffer)
  auto qkv_out = qkv(x).view({B, T, 3, num_heads, D}).permute({2, 0, 3, 1, 4}).unbind(0);
  Tensor y = functional::scaled_dot_product_attention(qkv_out[0], qkv_out[1], qkv_out[2], causal);
  return y.transpose(1, 2).reshape({B, T, embed_dim});  // a view: y is laid out [B, T, H, D]
}

std::string MultiheadAttention::extra_repr() const {
  return "embed_dim=" + std::to_string(embed_dim) + ", num_heads=" + std::to_string(num_heads) +
         ", causal=" + (causal ? "True" : "False");
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
  Tensor h = functional::bias_dropout_add(functional::linear(attn.heads(ln1(x)), attn.proj.weight),
                                          attn.proj.bias, x, attn.resid_dropout.p, is_training());
  // The MLP on the fused kernels: bias + GELU in the first GEMM's epilogue
  // (cuBLASLt on CUDA), then the projection without its bias, whose bias add, dropout and the
  // residual add are one pass. Same math, masks and random stream as
  // h + drop(proj(act(fc(ln2(h))))) with act = tanh GELU.
  Tensor a = functional::linear_gelu(ln2(h), fc.weight, fc.bias, act.approximate);
  return functional::bias_dropout_add(functional::linear(a, proj.weight), proj.bias, h, drop.p, is_training());
}

}  // namespace kiln::nn
