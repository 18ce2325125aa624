#pragma once
// Multi-head self-attention and the pre-norm GPT block.
#include "kiln/nn/activation.h"
#include "kiln/nn/linear.h"
#include "kiln/nn/normalization.h"

namespace kiln::nn {

// x [B, T, E] -> [B, T, E]: a fused q/k/v projection, scaled dot-product attention per head
// (F::scaled_dot_product_attention: blocked on the CPU), an output projection.
class MultiheadAttention : public Module {
 public:
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, bool causal = false, bool bias = true,
                     double dropout = 0.0);
  Tensor forward(const Tensor& x) override;  // resid_dropout(proj(heads(x)))
  // The attention's output before the output projection: [B, T, E], the heads side by side
  // (what a block that fuses the projection's bias, dropout and its residual add starts from).
  Tensor heads(const Tensor& x);
  std::string extra_repr() const override;

  int64_t embed_dim, num_heads;
  bool causal;
  Linear qkv, proj;
  Dropout resid_dropout;
};

struct TransformerBlockOptions {
  TransformerBlockOptions(int64_t embed_dim, int64_t num_heads) : embed_dim_(embed_dim), num_heads_(num_heads) {}
  KILN_ARG(int64_t, embed_dim);
  KILN_ARG(int64_t, num_heads);
  KILN_ARG(int64_t, mlp_ratio) = 4;
  KILN_ARG(double, dropout) = 0.0;
  KILN_ARG(bool, bias) = true;
};

// GPT-2's block: x + attn(ln1(x)), then + mlp(ln2(x)) with mlp = fc (4E) -> GELU(tanh) -> proj.
class TransformerBlock : public Module {
 public:
  explicit TransformerBlock(const TransformerBlockOptions& options);
  Tensor forward(const Tensor& x) override;

  TransformerBlockOptions options;
  LayerNorm ln1, ln2;
  MultiheadAttention attn;
  Linear fc, proj;
  GELU act{"tanh"};
  Dropout drop;
};

}  // namespace kiln::nn
