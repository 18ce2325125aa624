#include "kiln/nn/transformer.h"

#include <limits>

#include "kiln/nn/functional.h"
#include "kiln/nn/init.h"

namespace kiln::nn {

namespace {

MultiheadAttentionOptions attention_options(const TransformerLayerOptions& o) {
  return MultiheadAttentionOptions(o.d_model(), o.nhead())
      .dropout(o.dropout())
      .batch_first(o.batch_first())
      .bias(o.bias());
}

LayerNormOptions norm_options(const TransformerLayerOptions& o) {
  return LayerNormOptions({o.d_model()}).eps(o.layer_norm_eps()).bias(o.bias());
}

LinearOptions linear_options(int64_t in, int64_t out, const TransformerLayerOptions& o) {
  return LinearOptions(in, out).bias(o.bias());
}

void check_activation(const char* layer, const std::string& activation) {
  KILN_CHECK(activation == "relu" || activation == "gelu", layer, ": activation must be \"relu\" or \"gelu\", got \"",
             activation, "\"");
}

// dropout_after(attn(x, kv, kv)) without the weights: a layer's attention branch.
Tensor attention_branch(MultiheadAttention& attn, Dropout& dropout_after, const Tensor& x, const Tensor& kv,
                        const Tensor& mask, const Tensor& key_padding_mask, bool is_causal) {
  auto args = MultiheadAttentionArgs()
                  .attn_mask(mask)
                  .key_padding_mask(key_padding_mask)
                  .need_weights(false)
                  .is_causal(is_causal);
  return dropout_after(std::get<0>(attn(x, kv, kv, args)));
}

// residual + dropout_after(linear2(dropout(act(linear1(x))))): a layer's feed-forward branch with its
// residual add. GELU rides in linear1's epilogue (F::linear_gelu); linear2's bias, the last dropout
// and the add are one F::bias_dropout_add.
Tensor feed_forward_branch(const std::string& activation, Linear& linear1, Dropout& dropout, Linear& linear2,
                           Dropout& dropout_after, const Tensor& x, const Tensor& residual) {
  Tensor h =
      activation == "gelu" ? functional::linear_gelu(x, linear1.weight, linear1.bias, "none") : kiln::relu(linear1(x));
  return functional::bias_dropout_add(functional::linear(dropout(h), linear2.weight), linear2.bias, residual,
                                      dropout_after.p, dropout_after.is_training());
}

}  // namespace

// ---------------------------------------------------------------- encoder

TransformerEncoderLayer::TransformerEncoderLayer(const TransformerEncoderLayerOptions& o)
    : TransformerEncoderBase("TransformerEncoderLayer"),
      options(o),
      self_attn(attention_options(o)),
      linear1(linear_options(o.d_model(), o.dim_feedforward(), o)),
      dropout(o.dropout()),
      linear2(linear_options(o.dim_feedforward(), o.d_model(), o)),
      norm1(norm_options(o)),
      norm2(norm_options(o)),
      dropout1(o.dropout()),
      dropout2(o.dropout()) {
  check_activation("TransformerEncoderLayer", o.activation());
  register_module("self_attn", self_attn);
  register_module("linear1", linear1);
  register_module("dropout", dropout);
  register_module("linear2", linear2);
  register_module("norm1", norm1);
  register_module("norm2", norm2);
  register_module("dropout1", dropout1);
  register_module("dropout2", dropout2);
}

Tensor TransformerEncoderLayer::encode(const Tensor& src, const Tensor& src_mask, const Tensor& src_key_padding_mask,
                                       bool is_causal) {
  auto attend = [&](const Tensor& x) {
    return attention_branch(self_attn, dropout1, x, x, src_mask, src_key_padding_mask, is_causal);
  };
  auto feed_forward = [&](const Tensor& x, const Tensor& residual) {
    return feed_forward_branch(options.activation(), linear1, dropout, linear2, dropout2, x, residual);
  };
  Tensor x = src;
  if (options.norm_first()) {
    x = x + attend(norm1(x));
    return feed_forward(norm2(x), x);
  }
  x = norm1(x + attend(x));
  return norm2(feed_forward(x, x));
}

TransformerEncoder::TransformerEncoder(const TransformerEncoderOptions& o)
    : TransformerStack("TransformerEncoder", o) {}

Tensor TransformerEncoder::encode(const Tensor& src, const Tensor& mask, const Tensor& src_key_padding_mask,
                                  bool is_causal) {
  return run(src, mask, src_key_padding_mask, is_causal);
}

// ---------------------------------------------------------------- decoder

TransformerDecoderLayer::TransformerDecoderLayer(const TransformerDecoderLayerOptions& o)
    : TransformerDecoderBase("TransformerDecoderLayer"),
      options(o),
      self_attn(attention_options(o)),
      multihead_attn(attention_options(o)),
      linear1(linear_options(o.d_model(), o.dim_feedforward(), o)),
      dropout(o.dropout()),
      linear2(linear_options(o.dim_feedforward(), o.d_model(), o)),
      norm1(norm_options(o)),
      norm2(norm_options(o)),
      norm3(norm_options(o)),
      dropout1(o.dropout()),
      dropout2(o.dropout()),
      dropout3(o.dropout()) {
  check_activation("TransformerDecoderLayer", o.activation());
  register_module("self_attn", self_attn);
  register_module("multihead_attn", multihead_attn);
  register_module("linear1", linear1);
  register_module("dropout", dropout);
  register_module("linear2", linear2);
  register_module("norm1", norm1);
  register_module("norm2", norm2);
  register_module("norm3", norm3);
  register_module("dropout1", dropout1);
  register_module("dropout2", dropout2);
  register_module("dropout3", dropout3);
}

Tensor TransformerDecoderLayer::decode(const Tensor& tgt, const Tensor& memory, const Tensor& tgt_mask,
                                       const Tensor& memory_mask, const Tensor& tgt_key_padding_mask,
                                       const Tensor& memory_key_padding_mask, bool tgt_is_causal,
                                       bool memory_is_causal) {
  KILN_CHECK(memory.defined(), "TransformerDecoderLayer: memory (the encoder's output) is undefined");
  auto self_attend = [&](const Tensor& x) {
    return attention_branch(self_attn, dropout1, x, x, tgt_mask, tgt_key_padding_mask, tgt_is_causal);
  };
  auto attend_memory = [&](const Tensor& x) {
    return attention_branch(multihead_attn, dropout2, x, memory, memory_mask, memory_key_padding_mask,
                            memory_is_causal);
  };
  auto feed_forward = [&](const Tensor& x, const Tensor& residual) {
    return feed_forward_branch(options.activation(), linear1, dropout, linear2, dropout3, x, residual);
  };
  Tensor x = tgt;
  if (options.norm_first()) {
    x = x + self_attend(norm1(x));
    x = x + attend_memory(norm2(x));
    return feed_forward(norm3(x), x);
  }
  x = norm1(x + self_attend(x));
  x = norm2(x + attend_memory(x));
  return norm3(feed_forward(x, x));
}

TransformerDecoder::TransformerDecoder(const TransformerDecoderOptions& o)
    : TransformerStack("TransformerDecoder", o) {}

Tensor TransformerDecoder::decode(const Tensor& tgt, const Tensor& memory, const Tensor& tgt_mask,
                                  const Tensor& memory_mask, const Tensor& tgt_key_padding_mask,
                                  const Tensor& memory_key_padding_mask, bool tgt_is_causal, bool memory_is_causal) {
  return run(tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask, tgt_is_causal,
             memory_is_causal);
}

// ---------------------------------------------------------------- stacks

template <class Layer, class Base>
TransformerStack<Layer, Base>::TransformerStack(const char* type_name, const TransformerStackOptions& o)
    : Base(type_name), options(o) {
  KILN_CHECK(o.num_layers() >= 0, type_name, ": num_layers must be >= 0, got ", o.num_layers());
  for (int64_t i = 0; i < o.num_layers(); ++i) layers.push_back(std::make_shared<Layer>(o.layer()));
  this->register_module("layers", layers);
  if (o.final_norm()) norm = this->register_module("norm", std::make_shared<LayerNorm>(norm_options(o.layer())));
}
template class TransformerStack<TransformerEncoderLayer, TransformerEncoderBase>;
template class TransformerStack<TransformerDecoderLayer, TransformerDecoderBase>;

// ---------------------------------------------------------------- Transformer

namespace {
TransformerLayerOptions layer_options(const TransformerOptions& o) {
  return TransformerLayerOptions(o.d_model(), o.nhead())
      .dim_feedforward(o.dim_feedforward())
      .dropout(o.dropout())
      .activation(o.activation())
      .layer_norm_eps(o.layer_norm_eps())
      .batch_first(o.batch_first())
      .norm_first(o.norm_first())
      .bias(o.bias());
}
}  // namespace

Transformer::Transformer(const TransformerOptions& o)
    : Module("Transformer"),
      options(o),
      encoder(TransformerEncoderOptions(layer_options(o), o.num_encoder_layers()).final_norm(true)),
      decoder(TransformerDecoderOptions(layer_options(o), o.num_decoder_layers()).final_norm(true)) {
  register_module("encoder", encoder);
  register_module("decoder", decoder);
  for (Tensor p : parameters())
    if (p.dim() > 1) init::xavier_uniform_(p);
}

Tensor Transformer::forward(const Tensor& src, const Tensor& tgt, const Tensor& src_mask, const Tensor& tgt_mask,
                            const Tensor& memory_mask, const Tensor& src_key_padding_mask,
                            const Tensor& tgt_key_padding_mask, const Tensor& memory_key_padding_mask,
                            bool src_is_causal, bool tgt_is_causal, bool memory_is_causal) {
  KILN_CHECK(src.defined() && tgt.defined(), "Transformer: src and tgt must be defined");
  KILN_CHECK(src.dim() == tgt.dim() && (src.dim() == 2 || src.dim() == 3), "Transformer: src and tgt must both be ",
             "3-D (", options.batch_first() ? "[N, S, E] and [N, T, E]" : "[S, N, E] and [T, N, E]",
             ") or both 2-D (unbatched), got sizes ", src.sizes(), " and ", tgt.sizes());
  const int64_t batch_dim = options.batch_first() ? 0 : 1;
  KILN_CHECK(src.dim() == 2 || src.size(batch_dim) == tgt.size(batch_dim),
             "Transformer: the batch number of src and tgt must be equal, got sizes ", src.sizes(), " and ",
             tgt.sizes());
  KILN_CHECK(src.size(-1) == options.d_model() && tgt.size(-1) == options.d_model(),
             "Transformer: the feature number of src and tgt must be equal to d_model (", options.d_model(),
             "), got sizes ", src.sizes(), " and ", tgt.sizes());
  Tensor memory = encoder.forward(src, src_mask, src_key_padding_mask, src_is_causal);
  return decoder.forward(tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask,
                         tgt_is_causal, memory_is_causal);
}

Tensor Transformer::generate_square_subsequent_mask(int64_t size, const TensorOptions& options) {
  KILN_CHECK(size >= 0, "Transformer::generate_square_subsequent_mask: size must be >= 0, got ", size);
  TensorOptions o = options;
  Tensor later = ones({size, size}, TensorOptions().device(o.device())).triu(1) > 0.5;
  return zeros({size, size}, o).masked_fill(later, -std::numeric_limits<double>::infinity());
}

}  // namespace kiln::nn
