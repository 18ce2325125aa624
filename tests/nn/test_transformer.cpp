// The Transformer family (encoder and decoder layers and stacks, nn::Transformer): outputs and
// gradients against PyTorch's (the values in torch_reference/transformer.json; inputs in transformer_test_util.h),
// dropout, f64 gradchecks, initialisation, parameter names, errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "tests/nn/torch_reference.h"
#include "tests/nn/transformer_test_util.h"

using namespace kiln_test;
using namespace kiln_test::transformer;

namespace {

// PyTorch's values for these tests (tests/nn/torch_reference/transformer.json, tests/nn/torch_reference.h)
const std::vector<double>& torch_ref(const char* name) { return torch_reference("transformer", name); }

// TransformerDecoderLayer: tgt [3, 2, 4], memory [5, 2, 4], a causal tgt_mask, a memory key padding mask.
// nn::Transformer(4, 2, 2, 1, 6, batch_first): src [2, 5, 4], tgt [2, 3, 4].

// bias=False: an encoder layer (pre-norm, GELU) and a decoder layer (post-norm, ReLU), causal tgt mask.

// A layer's options and its PyTorch references: the output and the gradients of two inputs or parameters.
template <class Options> struct LayerCase {
  const char* name;
  Options options;
  const std::vector<double>& out;
  const std::vector<double>& grad_a;
  const std::vector<double>& grad_b;
};

// The reference script's layer: set_params_to_sequence, then linear1's bias sin(0.9 i + 0.3) (about
// half the ReLU inputs > 0); in eval mode.
template <class Layer> void set_reference_params(Layer& layer) {
  set_params_to_sequence(layer);
  {
    kiln::NoGradGuard ng;
    layer.linear1.bias.copy_(sin_seq(6, 0.9, 0.3));
  }
  layer.eval();
}

}  // namespace

TEST_CASE("TransformerEncoderLayer: post-norm ReLU and pre-norm GELU match PyTorch, with gradients", "[transformer]") {
  // the gradients of src and linear1.weight
  const LayerCase<TransformerEncoderLayerOptions> cases[] = {
      {"post-norm, relu", TransformerEncoderLayerOptions(4, 2).dim_feedforward(6), torch_ref("k_layer_post_relu_out"),
       torch_ref("k_layer_post_relu_grad_src"), torch_ref("k_layer_post_relu_grad_linear1_weight")},
      {"pre-norm, gelu", TransformerEncoderLayerOptions(4, 2).dim_feedforward(6).norm_first(true).activation("gelu"),
       torch_ref("k_layer_pre_gelu_out"), torch_ref("k_layer_pre_gelu_grad_src"),
       torch_ref("k_layer_pre_gelu_grad_linear1_weight")},
  };
  for (const auto& c : cases) {
    INFO(c.name);
    TransformerEncoderLayer layer(c.options);
    set_reference_params(layer);
    Tensor src = sin_seq(24, 0.19, 0.4).view({3, 2, 4}).requires_grad_();
    Tensor out = layer(src, encoder_src_mask(), encoder_key_padding_mask());
    check_close(out, c.out, 0, 1e-13, "output");
    weighted_sum(out, 0.13, 0.6).backward();
    check_close(src.grad(), c.grad_a, 0, 1e-13, "src gradient");
    check_close(layer.linear1.weight.grad(), c.grad_b, 0, 1e-13, "linear1.weight gradient");
  }
}

TEST_CASE("TransformerEncoder: two layers, a final norm and a causal mask match PyTorch", "[transformer]") {
  TransformerEncoder encoder(
      TransformerEncoderOptions(TransformerEncoderLayerOptions(4, 2).dim_feedforward(6).batch_first(true), 2)
          .final_norm(true));
  check_parameter_names(encoder, 26,
                        {{0, "layers.0.self_attn.in_proj_weight"},
                         {4, "layers.0.linear1.weight"},
                         {11, "layers.0.norm2.bias"},
                         {12, "layers.1.self_attn.in_proj_weight"},
                         {24, "norm.weight"}});
  set_params_to_sequence(encoder);
  encoder.eval();
  Tensor src = sin_seq(24, 0.19, 0.4).view({2, 3, 4}).requires_grad_();
  Tensor causal = Transformer::generate_square_subsequent_mask(3, f64());
  Tensor out = encoder(src, causal, Tensor(), /*is_causal=*/true);
  check_close(out, torch_ref("k_encoder_out"), 0, 1e-13, "output");
  out.sum().backward();
  check_close(src.grad(), torch_ref("k_encoder_grad_src"), 0, 1e-12, "src gradient");
  // is_causal without the mask builds the same one; forward(src) runs without masks.
  check_same_tensor(encoder(src, Tensor(), Tensor(), true), out, 1e-14, "is_causal alone");
  CHECK_FALSE(kiln::allclose(encoder(src), out));
}

TEST_CASE("TransformerEncoderLayer: dropout in training, gradcheck, errors", "[transformer]") {
  kiln::manual_seed(10);
  TransformerEncoderLayer layer(TransformerEncoderLayerOptions(4, 2).dim_feedforward(8).dropout(0.3));
  layer.to(DType::F64);
  Tensor src = kiln::randn({3, 2, 4}, f64());
  kiln::manual_seed(11);
  Tensor t1 = layer(src);
  kiln::manual_seed(11);
  CHECK(kiln::equal(layer(src), t1));  // the masks follow the seed
  layer.eval();
  Tensor e = layer(src);
  CHECK_FALSE(kiln::allclose(t1, e));
  TransformerEncoderLayer no_dropout(TransformerEncoderLayerOptions(4, 2).dim_feedforward(8).dropout(0.0));
  no_dropout.load_state_dict(layer.state_dict());
  no_dropout.to(DType::F64);
  check_same_tensor(no_dropout(src), e, 1e-14, "eval is the layer without dropout");
  // p = 1 drops every branch: post-norm leaves norm2(norm1(x)), pre-norm leaves x.
  for (bool norm_first : {false, true}) {
    INFO("norm_first " << norm_first);
    TransformerEncoderLayer all(
        TransformerEncoderLayerOptions(4, 2).dim_feedforward(8).dropout(1.0).norm_first(norm_first));
    all.to(DType::F64);
    Tensor want = norm_first ? src : all.norm2(all.norm1(src));
    check_same_tensor(all(src), want, 1e-14, "every dropout at p = 1");
    all.dropout2.eval();  // each Dropout has its own mode, as in torch
    CHECK_FALSE(kiln::allclose(all(src), want));
  }
  for (bool norm_first : {false, true}) {
    TransformerEncoderLayer l(
        TransformerEncoderLayerOptions(4, 2).dim_feedforward(5).dropout(0.0).norm_first(norm_first).activation("gelu"));
    l.to(DType::F64);
    Tensor padding = bool_tensor({false, true, false, false}, {2, 2});
    CHECK(kiln::gradcheck([&](const TL& in) { return l(in[0], Tensor(), padding); },
                          {kiln::randn({2, 2, 4}, f64(true))}));
  }
  CHECK_THAT(error_of([&] { TransformerEncoderLayer bad(TransformerEncoderLayerOptions(4, 2).activation("tanh")); }),
             Catch::Contains("activation must be \"relu\" or \"gelu\", got \"tanh\""));
  CHECK_THAT(
      error_of([&] { TransformerEncoder bad(TransformerEncoderOptions(TransformerEncoderLayerOptions(4, 2), -1)); }),
      Catch::Contains("num_layers must be >= 0"));
  CHECK_THAT(error_of([&] { layer(kiln::zeros({3, 2, 5}, f64())); }), Catch::Contains("embed_dim = 4 features"));
}

TEST_CASE("TransformerDecoderLayer: post-norm ReLU and pre-norm GELU match PyTorch, with gradients", "[transformer]") {
  // the gradients of tgt and memory
  const LayerCase<TransformerDecoderLayerOptions> cases[] = {
      {"post-norm, relu", TransformerDecoderLayerOptions(4, 2).dim_feedforward(6), torch_ref("k_dec_post_relu_out"),
       torch_ref("k_dec_post_relu_grad_tgt"), torch_ref("k_dec_post_relu_grad_memory")},
      {"pre-norm, gelu", TransformerDecoderLayerOptions(4, 2).dim_feedforward(6).norm_first(true).activation("gelu"),
       torch_ref("k_dec_pre_gelu_out"), torch_ref("k_dec_pre_gelu_grad_tgt"), torch_ref("k_dec_pre_gelu_grad_memory")},
  };
  Tensor memory_padding = bool_tensor({false, false, false, true, true, false, false, false, false, false}, {2, 5});
  for (const auto& c : cases) {
    INFO(c.name);
    TransformerDecoderLayer layer(c.options);
    check_parameter_names(layer, 18, {{4, "multihead_attn.in_proj_weight"}, {17, "norm3.bias"}});
    set_reference_params(layer);
    Tensor tgt = sin_seq(24, 0.19, 0.4).view({3, 2, 4}).requires_grad_();
    Tensor memory = sin_seq(40, 0.27, 1.1).view({5, 2, 4}).requires_grad_();
    Tensor causal = Transformer::generate_square_subsequent_mask(3, f64());
    Tensor out = layer(tgt, memory, causal, Tensor(), Tensor(), memory_padding, /*tgt_is_causal=*/true);
    check_close(out, c.out, 0, 1e-13, "output");
    weighted_sum(out, 0.13, 0.6).backward();
    check_close(tgt.grad(), c.grad_a, 0, 1e-13, "tgt gradient");
    check_close(memory.grad(), c.grad_b, 0, 1e-13, "memory gradient");
  }
}

TEST_CASE("Transformer: encoder and decoder with masks match PyTorch", "[transformer]") {
  Transformer model(TransformerOptions()
                        .d_model(4)
                        .nhead(2)
                        .num_encoder_layers(2)
                        .num_decoder_layers(1)
                        .dim_feedforward(6)
                        .batch_first(true));
  check_parameter_names(
      model, 46,
      {{24, "encoder.norm.weight"}, {26, "decoder.layers.0.self_attn.in_proj_weight"}, {45, "decoder.norm.bias"}});
  set_params_to_sequence(model);
  model.eval();
  Tensor src = sin_seq(40, 0.21, 0.3).view({2, 5, 4}).requires_grad_();
  Tensor tgt = sin_seq(24, 0.33, 0.8).view({2, 3, 4}).requires_grad_();
  Tensor padding = bool_tensor({false, false, false, false, true, false, false, false, false, false}, {2, 5});
  Tensor causal = Transformer::generate_square_subsequent_mask(3, f64());
  Tensor out = model(src, tgt, Tensor(), causal, Tensor(), padding, Tensor(), padding, false, /*tgt_is_causal=*/true);
  check_close(out, torch_ref("k_transformer_out"), 0, 1e-13, "output");
  out.sum().backward();
  check_close(src.grad(), torch_ref("k_transformer_grad_src"), 0, 1e-12, "src gradient");
  check_close(tgt.grad(), torch_ref("k_transformer_grad_tgt"), 0, 1e-12, "tgt gradient");
}

TEST_CASE("Transformer: initialisation, the subsequent mask, gradcheck, errors", "[transformer]") {
  kiln::manual_seed(14);
  Transformer model(
      TransformerOptions().d_model(8).nhead(2).num_encoder_layers(1).num_decoder_layers(1).dim_feedforward(16));
  // Every matrix xavier_uniform_ (torch's _reset_parameters); the LayerNorms keep 1 and 0.
  for (auto& [name, p] : model.named_parameters()) {
    INFO(name);
    if (p.dim() > 1) {
      const double bound = std::sqrt(6.0 / static_cast<double>(p.size(0) + p.size(1)));
      CHECK(p.abs().max().item() <= bound);
      CHECK(p.abs().max().item() > 0.7 * bound);
    }
  }
  CHECK(model.encoder.norm != nullptr);
  CHECK(model.decoder.norm != nullptr);
  Tensor m = Transformer::generate_square_subsequent_mask(3);
  CHECK(m.dtype() == DType::F32);
  CHECK(values(m) == std::vector<double>{0, -INFINITY, -INFINITY, 0, 0, -INFINITY, 0, 0, 0});
  CHECK_THAT(error_of([&] { Transformer::generate_square_subsequent_mask(-1); }), Catch::Contains("size must be >= 0"));

  TransformerDecoder decoder(
      TransformerDecoderOptions(TransformerDecoderLayerOptions(4, 2).dim_feedforward(5).dropout(0.0).activation("gelu"),
                                2)
          .final_norm(true));
  decoder.to(DType::F64);
  Tensor causal = Transformer::generate_square_subsequent_mask(3, f64());
  CHECK(kiln::gradcheck([&](const TL& in) { return decoder(in[0], in[1], causal); },
                        {kiln::randn({3, 2, 4}, f64(true)), kiln::randn({4, 2, 4}, f64(true))}));
  // An unbatched pair is a batch of one.
  Tensor tgt = kiln::randn({3, 2, 4}, f64()), memory = kiln::randn({4, 2, 4}, f64());
  check_same_tensor(decoder(tgt.select(1, 1), memory.select(1, 1), causal), decoder(tgt, memory, causal).select(1, 1),
                    1e-14, "unbatched");

  Tensor src = kiln::zeros({5, 2, 8}), bad_tgt = kiln::zeros({3, 4, 8});
  CHECK_THAT(error_of([&] { model(src, bad_tgt); }), Catch::Contains("the batch number of src and tgt must be equal"));
  CHECK_THAT(error_of([&] {
               model(src, kiln::zeros({3, 2, 6}));
             }),
             Catch::Contains("the feature number of src and tgt must be equal to d_model (8)"));
  CHECK_THAT(error_of([&] { model(src, kiln::zeros({3, 8})); }), Catch::Contains("must both be 3-D"));
  CHECK_THAT(error_of([&] { model(src); }), Catch::Contains("no single-input forward"));
  CHECK_THAT(error_of([&] { decoder(tgt, Tensor()); }), Catch::Contains("memory (the encoder's output) is undefined"));
  CHECK_THAT(error_of([&] { TransformerDecoderLayer bad(TransformerDecoderLayerOptions(4, 2).activation("silu")); }),
             Catch::Contains("activation must be \"relu\" or \"gelu\""));
}

TEST_CASE("Transformer layers with bias=false match PyTorch", "[transformer]") {
  TransformerEncoderLayer enc(
      TransformerEncoderLayerOptions(4, 2).dim_feedforward(6).bias(false).norm_first(true).activation("gelu"));
  const std::vector<std::string> names = parameter_names(enc);
  CHECK(names == std::vector<std::string>{"self_attn.in_proj_weight", "self_attn.out_proj.weight", "linear1.weight",
                                          "linear2.weight", "norm1.weight", "norm2.weight"});
  set_params_to_sequence(enc);
  enc.eval();
  Tensor causal = Transformer::generate_square_subsequent_mask(3, f64());
  Tensor src = sin_seq(24, 0.19, 0.4).view({3, 2, 4}).requires_grad_();
  Tensor out = enc(src, causal, Tensor(), true);
  check_close(out, torch_ref("k_nobias_enc_out"), 0, 1e-13, "encoder layer output");
  weighted_sum(out, 0.13, 0.6).backward();
  check_close(src.grad(), torch_ref("k_nobias_enc_grad_src"), 0, 1e-13, "encoder layer src gradient");

  TransformerDecoderLayer dec(TransformerDecoderLayerOptions(4, 2).dim_feedforward(6).bias(false));
  CHECK(dec.parameters().size() == 9);
  set_params_to_sequence(dec);
  dec.eval();
  Tensor tgt = sin_seq(24, 0.19, 0.4).view({3, 2, 4});
  Tensor memory = sin_seq(40, 0.27, 1.1).view({5, 2, 4}).requires_grad_();
  Tensor y = dec(tgt, memory, causal, Tensor(), Tensor(), Tensor(), true);
  check_close(y, torch_ref("k_nobias_dec_out"), 0, 1e-13, "decoder layer output");
  weighted_sum(y, 0.13, 0.6).backward();
  check_close(memory.grad(), torch_ref("k_nobias_dec_grad_memory"), 0, 1e-13, "decoder layer memory gradient");
  check_close(dec.linear1.weight.grad(), torch_ref("k_nobias_dec_grad_linear1_weight"), 0, 1e-13,
              "linear1.weight gradient");

  // nn::LayerNorm(bias=false), as torch's: a weight only, the same as an undefined bias.
  nn::LayerNorm ln(nn::LayerNormOptions({4}).bias(false));
  CHECK(ln.parameters().size() == 1);
  CHECK_FALSE(ln.bias.defined());
  Tensor x = kiln::randn({3, 4});
  CHECK(kiln::equal(ln(x), F::layer_norm(x, {4}, ln.weight, Tensor())));
}
