// A training step of a Transformer language model built from nn::TransformerEncoder, on the CPU:
// embedding * sqrt(E) + sinusoidal positions, a causal encoder stack, a linear decoder, cross
// entropy, backward, AdamW. Dropout is 0 so that PyTorch's side (bench/cpu/transformer_pytorch.py,
// which runs this program and compares) computes exactly the same function from the same weights.
//
//   bench_transformer [--config lm|encoder] [--steps N] [--dump DIR]
//
// lm: the shapes of PyTorch's word_language_model Transformer defaults (WikiText-2's 33,278-token
// vocabulary, E 200, 2 heads, FF 200, 2 layers, 35 x 20 tokens); encoder: E 256, 4 heads, FF 1024,
// 4 layers, 128 x 8 tokens, 1,000 tokens. --dump writes every parameter and the batch as .npy
// files into DIR (for the peer) before timing. Prints one JSON line: the first loss and the
// median milliseconds per step.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <kiln/kiln.h>

#include "../bench_util.h"

namespace F = kiln::nn::functional;
namespace nn = kiln::nn;
using kiln::Tensor;

namespace {

struct Config {
  std::string name;
  int64_t vocab, d_model, nhead, dim_feedforward, layers, seq, batch;
};

Config config_named(const std::string& name) {
  if (name == "lm") return {"lm", 33278, 200, 2, 200, 2, 35, 20};
  if (name == "encoder") return {"encoder", 1000, 256, 4, 1024, 4, 128, 8};
  std::fprintf(stderr, "unknown --config %s (lm or encoder)\n", name.c_str());
  std::exit(2);
}

struct LanguageModel : nn::Module {
  Config c;
  nn::Embedding embedding;
  nn::TransformerEncoder encoder;
  nn::Linear decoder;
  Tensor positions, causal;
  explicit LanguageModel(const Config& c)
      : nn::Module("LanguageModel"),
        c(c),
        embedding(c.vocab, c.d_model),
        encoder(nn::TransformerEncoderOptions(
            nn::TransformerEncoderLayerOptions(c.d_model, c.nhead).dim_feedforward(c.dim_feedforward).dropout(0.0),
            c.layers)),
        decoder(c.d_model, c.vocab) {
    register_module("embedding", embedding);
    register_module("encoder", encoder);
    register_module("decoder", decoder);
    // sin / cos positions, [seq, 1, E]
    Tensor pos = kiln::arange(static_cast<double>(c.seq)).unsqueeze(1);
    Tensor freq = kiln::exp(kiln::arange(0.0, static_cast<double>(c.d_model), 2.0) * (-std::log(10000.0) / c.d_model));
    positions = kiln::zeros({c.seq, c.d_model});
    positions.slice(1, 0, c.d_model, 2).copy_(kiln::sin(pos * freq));
    positions.slice(1, 1, c.d_model, 2).copy_(kiln::cos(pos * freq));
    positions = positions.unsqueeze(1);
    causal = nn::Transformer::generate_square_subsequent_mask(c.seq);
  }
  // tokens [T, B] -> mean cross entropy of predicting targets [T, B]
  Tensor loss(const Tensor& tokens, const Tensor& targets) {
    Tensor x = embedding(tokens) * std::sqrt(static_cast<double>(c.d_model)) + positions;
    Tensor logits = decoder(encoder(x, causal, Tensor(), /*is_causal=*/true));
    return F::cross_entropy(logits.view({-1, c.vocab}), targets.reshape({-1}));
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::string config = "encoder", dump;
  int steps = 7;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--config" && i + 1 < argc) config = argv[++i];
    else if (a == "--steps" && i + 1 < argc) steps = std::atoi(argv[++i]);
    else if (a == "--dump" && i + 1 < argc) dump = argv[++i];
    else {
      std::fprintf(stderr, "usage: bench_transformer [--config lm|encoder] [--steps N] [--dump DIR]\n");
      return 2;
    }
  }
  kiln::set_flush_denormal(true);  // as kiln-train runs (the peer flushes too)
  const Config c = config_named(config);
  kiln::manual_seed(0);
  LanguageModel model(c);
  // A fixed batch: token (t, b) = (7 t + 13 b) mod vocab, targets the next token.
  std::vector<int64_t> ids;
  for (int64_t t = 0; t <= c.seq; ++t)
    for (int64_t b = 0; b < c.batch; ++b) ids.push_back((7 * t + 13 * b) % c.vocab);
  Tensor stream = kiln::tensor(ids).view({c.seq + 1, c.batch});
  Tensor tokens = stream.narrow(0, 0, c.seq).contiguous(), targets = stream.narrow(0, 1, c.seq).contiguous();
  if (!dump.empty()) {
    for (auto& [name, p] : model.named_parameters()) kiln::save_npy(p, dump + "/" + name + ".npy");
    kiln::save_npy(stream, dump + "/stream.npy");
  }
  double loss0;
  {
    kiln::NoGradGuard ng;
    loss0 = model.loss(tokens, targets).item<double>();
  }
  kiln::bench::validate(std::isfinite(loss0) && std::abs(loss0 - std::log(static_cast<double>(c.vocab))) < 2.0,
                        "first loss near log(vocab)", loss0);
  kiln::optim::AdamW opt(model.parameters(), kiln::optim::AdamWOptions(1e-4));
  double last = 0.0;
  const double seconds = kiln::bench::time_median(
      [&] {
        Tensor loss = model.loss(tokens, targets);
        loss.backward();
        opt.step();
        opt.zero_grad();
        last = loss.item<double>();
      },
      steps, 2);
  kiln::bench::validate(std::isfinite(last) && last < loss0, "the loss falls", last);
  std::printf("{\"config\": \"%s\", \"loss0\": %.9g, \"ms_per_step\": %.3f, \"steps\": %d, \"threads\": %d}\n",
              c.name.c_str(), loss0, seconds * 1e3, steps, kiln::get_num_threads());
  return 0;
}
