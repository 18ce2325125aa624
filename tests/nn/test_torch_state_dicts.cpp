// State dicts saved by PyTorch load unchanged into kiln's mirrored modules: one file per module
// family (tests/nn/torch_modules, written by make_fixtures.py with PyTorch), each holding the
// module's state_dict under PyTorch's names plus an input and PyTorch's eval-mode output for it.
// Loading is strict (every name and shape must match, nothing left over), and kiln's output from
// the loaded weights must equal PyTorch's up to float rounding.
#include <catch2/catch.hpp>

#include <functional>
#include <memory>
#include <string>

#include "tests/test_util.h"

namespace nn = kiln::nn;
using kiln::Tensor;

namespace {

struct Fixture {
  nn::StateDict state;
  Tensor input, output;
};

Fixture load_fixture(const std::string& name) {
  const nn::StateDict all = kiln::load(std::string(KILN_TORCH_FIXTURES) + "/" + name + ".safetensors");
  Fixture f;
  for (const auto& [key, value] : all) {
    if (key == "__input__") f.input = value;
    else if (key == "__output__") f.output = value;
    else f.state.insert(key, value);
  }
  REQUIRE(f.input.defined());
  REQUIRE(f.output.defined());
  return f;
}

// Loads the fixture strictly into `module`, runs `forward` in eval mode and compares with
// PyTorch's output. The tolerance: f32 sums of at most a few hundred products of O(1) terms, in a
// different order than PyTorch's (relative to 1 + |value|).
void check(const std::string& name, nn::Module& module, const std::function<Tensor(const Tensor&)>& forward) {
  INFO(name);
  Fixture f = load_fixture(name);
  module.load_state_dict(f.state, /*strict=*/true);
  module.eval();
  kiln::NoGradGuard no_grad;
  const Tensor got = forward(f.input);
  kiln_test::check_same_tensor(got.to(kiln::DType::F64), f.output.to(kiln::DType::F64), 2e-5, name);
}

}  // namespace

TEST_CASE("PyTorch state dicts load unchanged into every mirrored module family", "[serialize][torch]") {
  auto plain = [](nn::Module& m) { return [&m](const Tensor& x) { return m(x); }; };
  nn::Linear linear(5, 3);
  check("linear", linear, plain(linear));
  nn::Conv1d conv1d(nn::Conv1dOptions(3, 4, 3).padding(1));
  check("conv1d", conv1d, plain(conv1d));
  nn::Conv2d conv2d(nn::Conv2dOptions(3, 4, 3).padding(1));
  check("conv2d", conv2d, plain(conv2d));
  nn::ConvTranspose2d conv_t(nn::ConvTranspose2dOptions(4, 3, 3).stride(2));
  check("conv_transpose2d", conv_t, plain(conv_t));
  nn::BatchNorm2d bn(4);  // running statistics from three training steps, and num_batches_tracked
  check("batch_norm2d", bn, plain(bn));
  nn::LayerNorm ln(6);
  check("layer_norm", ln, plain(ln));
  nn::GroupNorm gn(2, 4);
  check("group_norm", gn, plain(gn));
  nn::RMSNorm rms(kiln::IntList{6}, 1e-6);
  check("rms_norm", rms, plain(rms));
  nn::Embedding emb(10, 4);
  check("embedding", emb, plain(emb));
  nn::MultiheadAttention mha(nn::MultiheadAttentionOptions(8, 2));
  check("multihead_attention", mha, [&](const Tensor& x) { return std::get<0>(mha(x, x, x)); });
  nn::TransformerEncoderLayer enc(nn::TransformerEncoderLayerOptions(8, 2).dim_feedforward(16).dropout(0.0));
  check("transformer_encoder_layer", enc, plain(enc));
  nn::LSTM lstm(nn::LSTMOptions(4, 5).num_layers(2));
  check("lstm", lstm, plain(lstm));
  nn::GRU gru(4, 5);
  check("gru", gru, plain(gru));
}

TEST_CASE("a PyTorch state dict with a missing or renamed key is refused by name", "[serialize][torch]") {
  Fixture f = load_fixture("multihead_attention");
  nn::StateDict renamed;
  for (const auto& [key, value] : f.state) renamed.insert(key == "in_proj_weight" ? "qkv.weight" : key, value);
  nn::MultiheadAttention mha(nn::MultiheadAttentionOptions(8, 2));
  CHECK_THAT(kiln_test::error_of([&] { mha.load_state_dict(renamed, true); }), Catch::Contains("in_proj_weight"));
}
