#pragma once
// Multi-head attention (torch's nn.MultiheadAttention) and the pre-norm GPT block.
#include <memory>
#include <string>
#include <tuple>

#include "kiln/nn/activation.h"
#include "kiln/nn/linear.h"
#include "kiln/nn/normalization.h"

namespace kiln::nn {

struct MultiheadAttentionOptions {
  MultiheadAttentionOptions(int64_t embed_dim, int64_t num_heads) : embed_dim_(embed_dim), num_heads_(num_heads) {}
  KILN_ARG(int64_t, embed_dim);
  KILN_ARG(int64_t, num_heads);
  KILN_ARG(double, dropout) = 0.0;         // on the attention probabilities, in training (torch's dropout)
  KILN_ARG(bool, bias) = true;             // of the input and output projections
  KILN_ARG(bool, batch_first) = false;     // [N, L, E] in and out instead of torch's default [L, N, E]
  KILN_ARG(bool, causal) = false;          // every call masks each query's later keys (a decoder)
  KILN_ARG(double, output_dropout) = 0.0;  // after the output projection (GPT-2's resid_dropout)
};

// What forward(query, key, value, ...) takes besides the three inputs, with torch's names and
// defaults. Masks follow torch's nn.MultiheadAttention (not F::scaled_dot_product_attention): a
// bool mask is true where a key must NOT be attended to, a floating one is added to the scores.
struct MultiheadAttentionArgs {
  KILN_ARG(Tensor, key_padding_mask);           // [N, S] ([S] unbatched): keys to ignore, per sample
  KILN_ARG(bool, need_weights) = true;          // also return the attention probabilities
  KILN_ARG(Tensor, attn_mask);                  // [L, S] or [N * num_heads, L, S]
  KILN_ARG(bool, average_attn_weights) = true;  // the weights averaged over heads: [N, L, S]
  // torch's hint that attn_mask is causal: with no key_padding_mask and need_weights false the
  // causal kernel runs in the mask's place (as torch), otherwise the mask is used as given.
  // Without an attn_mask kiln masks causally, where torch raises an error.
  KILN_ARG(bool, is_causal) = false;
};

// torch's nn.MultiheadAttention: query [L, N, E], key and value [S, N, E] ([N, ., E] with
// batch_first, [., E] unbatched) -> ([L, N, E], weights). Parameters under torch's names, so a
// state dict saved by PyTorch loads unchanged: the [3E, E] input projection in_proj_weight (and
// in_proj_bias), run as one GEMM when query, key and value are the same tensor, the output
// projection out_proj (a Linear), scaled dot-product attention per head
// (F::scaled_dot_product_attention: blocked on the CPU when no mask, dropout or weights are asked
// for). key and value must have embed_dim features (torch's kdim / vdim are not supported).
// docs/model_zoo.md maps the parameter names.
class MultiheadAttention : public Module {
 public:
  // torch's constructor and initialisation (xavier_uniform_ input projection, zero biases).
  explicit MultiheadAttention(const MultiheadAttentionOptions& options);
  // GPT-2's self-attention: batch first, `dropout` after the output projection, Linear's
  // initialisation.
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, bool causal = false, bool bias = true, double dropout = 0.0);

  // Self-attention: forward(x, x, x) without the weights (torch's need_weights=False).
  Tensor forward(const Tensor& x) override;
  // (attention output, weights): weights [N, L, S] averaged over heads, [N, H, L, S] when not
  // averaged, undefined when need_weights is false. As torch, the weights are the probabilities
  // after dropout, and a query whose keys are all masked gets NaN weights and output when the
  // weights are returned, and attends to nothing (output: out_proj's bias) when they are not.
  std::tuple<Tensor, Tensor> forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                     const MultiheadAttentionArgs& args = {});
  using Module::operator();
  std::tuple<Tensor, Tensor> operator()(const Tensor& query, const Tensor& key, const Tensor& value,
                                        const MultiheadAttentionArgs& args = {}) {
    return forward(query, key, value, args);
  }
  // Self-attention of x [B, T, E] (batch first whatever batch_first says) before the output
  // projection: [B, T, E], the heads side by side (what a block that fuses the projection's
  // bias, dropout and its residual add starts from).
  Tensor heads(const Tensor& x);
  std::string extra_repr() const override;
  // options.output_dropout() after the output projection, in training mode (GPT-2's resid_dropout)
  Tensor output_dropout(const Tensor& x);

  MultiheadAttentionOptions options;
  int64_t embed_dim, num_heads;
  bool causal;
  // torch's names: the input projection's rows for q, k and v ([3E, E] and [3E]; no bias when
  // options.bias() is false), and the output projection
  Tensor in_proj_weight, in_proj_bias;
  Linear out_proj;

 private:
  MultiheadAttention(const MultiheadAttentionOptions& options, bool torch_init);
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
