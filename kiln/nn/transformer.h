#pragma once
// torch's Transformer family: nn.TransformerEncoderLayer / TransformerEncoder,
// nn.TransformerDecoderLayer / TransformerDecoder and nn.Transformer, with torch's submodule
// names, argument order, mask forms (those of nn::MultiheadAttention) and initialisation.
#include <memory>
#include <string>

#include "kiln/nn/attention.h"
#include "kiln/nn/container.h"

namespace kiln::nn {

// The arguments of torch's TransformerEncoderLayer and TransformerDecoderLayer (the same for both).
struct TransformerLayerOptions {
  TransformerLayerOptions(int64_t d_model, int64_t nhead) : d_model_(d_model), nhead_(nhead) {}
  KILN_ARG(int64_t, d_model);
  KILN_ARG(int64_t, nhead);
  KILN_ARG(int64_t, dim_feedforward) = 2048;
  KILN_ARG(double, dropout) = 0.1;
  KILN_ARG(std::string, activation) = "relu";  // or "gelu" (exact)
  KILN_ARG(double, layer_norm_eps) = 1e-5;
  KILN_ARG(bool, batch_first) = false;
  KILN_ARG(bool, norm_first) = false;  // pre-norm: x + block(norm(x)); torch's default is post-norm
  KILN_ARG(bool, bias) = true;         // false: no bias in the projections, linears and LayerNorms
};
using TransformerEncoderLayerOptions = TransformerLayerOptions;
using TransformerDecoderLayerOptions = TransformerLayerOptions;

// The call forms TransformerEncoderLayer and TransformerEncoder share: src with MultiheadAttention's
// attn_mask and key_padding_mask and is_causal, none of them by default. Each implements encode.
class TransformerEncoderBase : public Module {
 public:
  using Module::Module;
  Tensor forward(const Tensor& src) override { return encode(src, Tensor(), Tensor(), false); }
  Tensor forward(const Tensor& src, const Tensor& mask, const Tensor& src_key_padding_mask = Tensor(),
                 bool is_causal = false) {
    return encode(src, mask, src_key_padding_mask, is_causal);
  }
  using Module::operator();
  Tensor operator()(const Tensor& src, const Tensor& mask, const Tensor& src_key_padding_mask = Tensor(),
                    bool is_causal = false) {
    return encode(src, mask, src_key_padding_mask, is_causal);
  }

 protected:
  virtual Tensor encode(const Tensor& src, const Tensor& mask, const Tensor& src_key_padding_mask, bool is_causal) = 0;
};

// torch's nn.TransformerEncoderLayer, with its submodule names (self_attn, linear1, dropout,
// linear2, norm1, norm2, dropout1, dropout2). Post-norm:
//   x = norm1(x + dropout1(self_attn(x))), then x = norm2(x + dropout2(linear2(dropout(act(linear1(x))))));
// pre-norm (norm_first) applies each norm to the branch's input instead. The mask and
// src_key_padding_mask are MultiheadAttention's attn_mask and key_padding_mask.
class TransformerEncoderLayer : public TransformerEncoderBase {
 public:
  explicit TransformerEncoderLayer(const TransformerEncoderLayerOptions& options);

  TransformerEncoderLayerOptions options;
  MultiheadAttention self_attn;
  Linear linear1;
  Dropout dropout;
  Linear linear2;
  LayerNorm norm1, norm2;
  Dropout dropout1, dropout2;

 protected:
  Tensor encode(const Tensor& src, const Tensor& src_mask, const Tensor& src_key_padding_mask, bool is_causal) override;
};

// The call forms TransformerDecoderLayer and TransformerDecoder share: tgt and memory (the encoder's
// output), each with MultiheadAttention's attn_mask, key_padding_mask and is_causal, none of them by
// default. A decoder needs memory: the single-input form throws. Each implements decode.
class TransformerDecoderBase : public Module {
 public:
  using Module::forward;
  using Module::Module;
  Tensor forward(const Tensor& tgt, const Tensor& memory, const Tensor& tgt_mask = Tensor(),
                 const Tensor& memory_mask = Tensor(), const Tensor& tgt_key_padding_mask = Tensor(),
                 const Tensor& memory_key_padding_mask = Tensor(), bool tgt_is_causal = false,
                 bool memory_is_causal = false) {
    return decode(tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask, tgt_is_causal,
                  memory_is_causal);
  }
  using Module::operator();
  Tensor operator()(const Tensor& tgt, const Tensor& memory, const Tensor& tgt_mask = Tensor(),
                    const Tensor& memory_mask = Tensor(), const Tensor& tgt_key_padding_mask = Tensor(),
                    const Tensor& memory_key_padding_mask = Tensor(), bool tgt_is_causal = false,
                    bool memory_is_causal = false) {
    return decode(tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask, tgt_is_causal,
                  memory_is_causal);
  }

 protected:
  virtual Tensor decode(const Tensor& tgt, const Tensor& memory, const Tensor& tgt_mask, const Tensor& memory_mask,
                        const Tensor& tgt_key_padding_mask, const Tensor& memory_key_padding_mask, bool tgt_is_causal,
                        bool memory_is_causal) = 0;
};

// torch's nn.TransformerDecoderLayer (self_attn, multihead_attn, linear1, dropout, linear2,
// norm1-3, dropout1-3): self-attention over tgt, attention from tgt to memory (the encoder's
// output), the feed-forward block, each a residual branch normed as in the encoder layer.
class TransformerDecoderLayer : public TransformerDecoderBase {
 public:
  explicit TransformerDecoderLayer(const TransformerDecoderLayerOptions& options);

  TransformerDecoderLayerOptions options;
  MultiheadAttention self_attn, multihead_attn;
  Linear linear1;
  Dropout dropout;
  Linear linear2;
  LayerNorm norm1, norm2, norm3;
  Dropout dropout1, dropout2, dropout3;

 protected:
  Tensor decode(const Tensor& tgt, const Tensor& memory, const Tensor& tgt_mask, const Tensor& memory_mask,
                const Tensor& tgt_key_padding_mask, const Tensor& memory_key_padding_mask, bool tgt_is_causal,
                bool memory_is_causal) override;
};

// How many layers of which kind a TransformerEncoder or TransformerDecoder stacks.
struct TransformerStackOptions {
  TransformerStackOptions(TransformerLayerOptions layer, int64_t num_layers)
      : layer_(std::move(layer)), num_layers_(num_layers) {}
  KILN_ARG(TransformerLayerOptions, layer);
  KILN_ARG(int64_t, num_layers);
  // a LayerNorm after the last layer (torch's norm=LayerNorm(d_model, eps)), with the layers'
  // layer_norm_eps, as nn.Transformer builds it
  KILN_ARG(bool, final_norm) = false;
};
using TransformerEncoderOptions = TransformerStackOptions;
using TransformerDecoderOptions = TransformerStackOptions;

// What TransformerEncoder and TransformerDecoder are: options.num_layers() Layers ("layers.0", ...)
// run in turn with the same other arguments, then the optional final LayerNorm ("norm"). The layers
// are initialised independently, where torch's start as copies of one layer.
template <class Layer, class Base> class TransformerStack : public Base {
 public:
  TransformerStackOptions options;
  ModuleList layers;
  std::shared_ptr<LayerNorm> norm;  // null unless final_norm

 protected:
  TransformerStack(const char* type_name, const TransformerStackOptions& options);  // transformer.cpp
  // x through every layer, each called as forward(x, args...), then the final norm if any.
  template <class... Args> Tensor run(Tensor x, const Args&... args) {
    for (size_t i = 0; i < layers.size(); ++i) x = layers.at<Layer>(i).forward(x, args...);
    return norm ? norm->forward(x) : x;
  }
};

// torch's nn.TransformerEncoder: TransformerEncoderLayers, each with the same masks.
class TransformerEncoder : public TransformerStack<TransformerEncoderLayer, TransformerEncoderBase> {
 public:
  explicit TransformerEncoder(const TransformerEncoderOptions& options);

 protected:
  Tensor encode(const Tensor& src, const Tensor& mask, const Tensor& src_key_padding_mask, bool is_causal) override;
};

// torch's nn.TransformerDecoder: TransformerDecoderLayers, each over the same memory and masks.
class TransformerDecoder : public TransformerStack<TransformerDecoderLayer, TransformerDecoderBase> {
 public:
  explicit TransformerDecoder(const TransformerDecoderOptions& options);

 protected:
  Tensor decode(const Tensor& tgt, const Tensor& memory, const Tensor& tgt_mask, const Tensor& memory_mask,
                const Tensor& tgt_key_padding_mask, const Tensor& memory_key_padding_mask, bool tgt_is_causal,
                bool memory_is_causal) override;
};

// torch's nn.Transformer arguments and defaults.
struct TransformerOptions {
  KILN_ARG(int64_t, d_model) = 512;
  KILN_ARG(int64_t, nhead) = 8;
  KILN_ARG(int64_t, num_encoder_layers) = 6;
  KILN_ARG(int64_t, num_decoder_layers) = 6;
  KILN_ARG(int64_t, dim_feedforward) = 2048;
  KILN_ARG(double, dropout) = 0.1;
  KILN_ARG(std::string, activation) = "relu";
  KILN_ARG(double, layer_norm_eps) = 1e-5;
  KILN_ARG(bool, batch_first) = false;
  KILN_ARG(bool, norm_first) = false;
  KILN_ARG(bool, bias) = true;
};

// torch's nn.Transformer: encoder (with its final norm) over src, decoder (with its final norm)
// over tgt and the encoder's output. src [S, N, E], tgt [T, N, E] ([N, ., E] with batch_first)
// -> [T, N, E]. Every parameter of two or more dimensions starts xavier_uniform_, as torch's.
class Transformer : public Module {
 public:
  explicit Transformer(const TransformerOptions& options = TransformerOptions());
  using Module::forward;  // needs src and tgt: the single-input form throws
  Tensor forward(const Tensor& src, const Tensor& tgt, const Tensor& src_mask = Tensor(),
                 const Tensor& tgt_mask = Tensor(), const Tensor& memory_mask = Tensor(),
                 const Tensor& src_key_padding_mask = Tensor(), const Tensor& tgt_key_padding_mask = Tensor(),
                 const Tensor& memory_key_padding_mask = Tensor(), bool src_is_causal = false,
                 bool tgt_is_causal = false, bool memory_is_causal = false);
  using Module::operator();
  Tensor operator()(const Tensor& src, const Tensor& tgt, const Tensor& src_mask = Tensor(),
                    const Tensor& tgt_mask = Tensor(), const Tensor& memory_mask = Tensor(),
                    const Tensor& src_key_padding_mask = Tensor(), const Tensor& tgt_key_padding_mask = Tensor(),
                    const Tensor& memory_key_padding_mask = Tensor(), bool src_is_causal = false,
                    bool tgt_is_causal = false, bool memory_is_causal = false) {
    return forward(src, tgt, src_mask, tgt_mask, memory_mask, src_key_padding_mask, tgt_key_padding_mask,
                   memory_key_padding_mask, src_is_causal, tgt_is_causal, memory_is_causal);
  }
  // [size, size] float: 0 on and below the diagonal, -inf above (each position sees itself and
  // earlier ones), as torch's.
  static Tensor generate_square_subsequent_mask(int64_t size, const TensorOptions& options = TensorOptions());

  TransformerOptions options;
  TransformerEncoder encoder;
  TransformerDecoder decoder;
};

}  // namespace kiln::nn
