#pragma once
// Multi-head attention (torch's nn.MultiheadAttention), the pre-norm GPT block and torch's
// Transformer encoder.
#include <memory>
#include <string>
#include <tuple>

#include "kiln/nn/activation.h"
#include "kiln/nn/container.h"
#include "kiln/nn/linear.h"
#include "kiln/nn/normalization.h"

namespace kiln::nn {

struct MultiheadAttentionOptions {
  MultiheadAttentionOptions(int64_t embed_dim, int64_t num_heads) : embed_dim_(embed_dim), num_heads_(num_heads) {}
  KILN_ARG(int64_t, embed_dim);
  KILN_ARG(int64_t, num_heads);
  KILN_ARG(double, dropout) = 0.0;        // on the attention probabilities, in training (torch's dropout)
  KILN_ARG(bool, bias) = true;            // of the input and output projections
  KILN_ARG(bool, batch_first) = false;    // [N, L, E] in and out instead of torch's default [L, N, E]
  KILN_ARG(bool, causal) = false;         // every call masks each query's later keys (a decoder)
  KILN_ARG(double, output_dropout) = 0.0; // after the output projection (GPT-2's resid_dropout)
};

// What forward(query, key, value, ...) takes besides the three inputs, with torch's names and
// defaults. Masks follow torch's nn.MultiheadAttention (not F::scaled_dot_product_attention): a
// bool mask is true where a key must NOT be attended to, a floating one is added to the scores.
struct MultiheadAttentionArgs {
  KILN_ARG(Tensor, key_padding_mask);     // [N, S] ([S] unbatched): keys to ignore, per sample
  KILN_ARG(bool, need_weights) = true;    // also return the attention probabilities
  KILN_ARG(Tensor, attn_mask);            // [L, S] or [N * num_heads, L, S]
  KILN_ARG(bool, average_attn_weights) = true;  // the weights averaged over heads: [N, L, S]
  // torch's hint that attn_mask is causal (the mask is used as given). Without an attn_mask kiln
  // masks causally, where torch raises an error.
  KILN_ARG(bool, is_causal) = false;
};

// torch's nn.MultiheadAttention: query [L, N, E], key and value [S, N, E] ([N, ., E] with
// batch_first, [., E] unbatched) -> ([L, N, E], weights). One [3E, E] input projection `qkv`
// (torch's in_proj_weight / in_proj_bias) run as one GEMM when query, key and value are the same
// tensor, an output projection `proj` (torch's out_proj), scaled dot-product attention per head
// (F::scaled_dot_product_attention: blocked on the CPU when no mask, dropout or weights are asked
// for). key and value must have embed_dim features (torch's kdim / vdim are not supported).
// docs/model_zoo.md maps the parameter names.
class MultiheadAttention : public Module {
 public:
  // torch's constructor and initialisation (xavier_uniform_ input projection, zero biases).
  explicit MultiheadAttention(const MultiheadAttentionOptions& options);
  // GPT-2's self-attention: batch first, `dropout` after the output projection, Linear's
  // initialisation.
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, bool causal = false, bool bias = true,
                     double dropout = 0.0);

  // Self-attention: forward(x, x, x) without the weights (torch's need_weights=False).
  Tensor forward(const Tensor& x) override;
  // (attention output, weights): weights [N, L, S] averaged over heads, [N, H, L, S] when not
  // averaged, undefined when need_weights is false. As torch, the weights are the probabilities
  // after dropout, and a query whose keys are all masked gets NaN weights and output when the
  // weights are returned, and attends to nothing (output: proj's bias) when they are not.
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

  MultiheadAttentionOptions options;
  int64_t embed_dim, num_heads;
  bool causal;
  Linear qkv, proj;
  Dropout resid_dropout;

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

struct TransformerEncoderLayerOptions {
  TransformerEncoderLayerOptions(int64_t d_model, int64_t nhead) : d_model_(d_model), nhead_(nhead) {}
  KILN_ARG(int64_t, d_model);
  KILN_ARG(int64_t, nhead);
  KILN_ARG(int64_t, dim_feedforward) = 2048;
  KILN_ARG(double, dropout) = 0.1;
  KILN_ARG(std::string, activation) = "relu";  // or "gelu" (exact)
  KILN_ARG(double, layer_norm_eps) = 1e-5;
  KILN_ARG(bool, batch_first) = false;
  KILN_ARG(bool, norm_first) = false;  // pre-norm: x + sa(norm1(x)); torch's default is post-norm
};

// torch's nn.TransformerEncoderLayer, with its submodule names (self_attn, linear1, dropout,
// linear2, norm1, norm2, dropout1, dropout2). Post-norm:
//   x = norm1(x + dropout1(self_attn(x))), then x = norm2(x + dropout2(linear2(dropout(act(linear1(x))))));
// pre-norm (norm_first) applies each norm to the branch's input instead. src_mask and
// src_key_padding_mask are MultiheadAttention's attn_mask and key_padding_mask.
class TransformerEncoderLayer : public Module {
 public:
  explicit TransformerEncoderLayer(const TransformerEncoderLayerOptions& options);
  Tensor forward(const Tensor& src) override;
  Tensor forward(const Tensor& src, const Tensor& src_mask, const Tensor& src_key_padding_mask = Tensor(),
                 bool is_causal = false);
  using Module::operator();
  Tensor operator()(const Tensor& src, const Tensor& src_mask, const Tensor& src_key_padding_mask = Tensor(),
                    bool is_causal = false) {
    return forward(src, src_mask, src_key_padding_mask, is_causal);
  }
  std::string extra_repr() const override;

  TransformerEncoderLayerOptions options;
  MultiheadAttention self_attn;
  Linear linear1;
  Dropout dropout;
  Linear linear2;
  LayerNorm norm1, norm2;
  Dropout dropout1, dropout2;

 private:
  Tensor self_attention_block(const Tensor& x, const Tensor& mask, const Tensor& key_padding_mask, bool is_causal);
  Tensor feed_forward_block(const Tensor& x, const Tensor& residual);  // residual + the MLP branch of x
};

struct TransformerEncoderOptions {
  TransformerEncoderOptions(TransformerEncoderLayerOptions layer, int64_t num_layers)
      : layer_(std::move(layer)), num_layers_(num_layers) {}
  KILN_ARG(TransformerEncoderLayerOptions, layer);
  KILN_ARG(int64_t, num_layers);
  // a LayerNorm after the last layer (torch's norm=LayerNorm(d_model, eps)), with the layers'
  // layer_norm_eps, as nn.Transformer builds it
  KILN_ARG(bool, final_norm) = false;
};

// torch's nn.TransformerEncoder: num_layers fresh TransformerEncoderLayers ("layers.0", ...) run in
// turn with the same masks, then the optional final LayerNorm ("norm").
class TransformerEncoder : public Module {
 public:
  explicit TransformerEncoder(const TransformerEncoderOptions& options);
  Tensor forward(const Tensor& src) override;
  Tensor forward(const Tensor& src, const Tensor& mask, const Tensor& src_key_padding_mask = Tensor(),
                 bool is_causal = false);
  using Module::operator();
  Tensor operator()(const Tensor& src, const Tensor& mask, const Tensor& src_key_padding_mask = Tensor(),
                    bool is_causal = false) {
    return forward(src, mask, src_key_padding_mask, is_causal);
  }

  TransformerEncoderOptions options;
  ModuleList layers;
  std::shared_ptr<LayerNorm> norm;  // null unless final_norm
};

}  // namespace kiln::nn
