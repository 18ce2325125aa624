// The model writers' check (docs/model_zoo.md): tiny versions of nanoGPT, a torchvision-style
// ResNet, a torchvision-style ViT, the common U-Net and the PyTorch-examples LSTM language model
// (and its Transformer variant), each written the way its PyTorch source is, with kiln's public API only. Each trains a
// few AdamW steps on one fixed batch, and its loss has to fall well below where it started.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <vector>

#include <kiln/kiln.h>
#include "tests/test_util.h"

using namespace kiln_test;

namespace {

namespace F = kiln::nn::functional;
namespace nn = kiln::nn;
namespace init = kiln::nn::init;
using kiln::TensorOptions;

// Runs `steps` AdamW steps of loss_fn and returns the losses before each step.
std::vector<double> train(nn::Module& model, int steps, double lr, const std::function<Tensor()>& loss_fn) {
  kiln::optim::AdamW opt(model.parameters(), kiln::optim::AdamWOptions(lr).weight_decay(0.01));
  std::vector<double> losses;
  for (int i = 0; i < steps; ++i) {
    Tensor loss = loss_fn();
    losses.push_back(loss.item());
    loss.backward();
    kiln::optim::clip_grad_norm(model.parameters(), 1.0);
    opt.step();
    opt.zero_grad();
  }
  return losses;
}

void check_trains(const std::vector<double>& losses, double ratio) {
  INFO("first loss " << losses.front() << ", last loss " << losses.back());
  for (double l : losses) REQUIRE(std::isfinite(l));
  CHECK(losses.back() < ratio * losses.front());
}

// ------------------------------------------------------------------------------ nanoGPT

struct CausalSelfAttention : nn::Module {
  nn::Linear c_attn, c_proj;
  int64_t n_head;
  double dropout = 0.1;  // on the attention probabilities, in training
  CausalSelfAttention(int64_t n_embd, int64_t n_head)
      : nn::Module("CausalSelfAttention"), c_attn(n_embd, 3 * n_embd), c_proj(n_embd, n_embd), n_head(n_head) {
    register_module("c_attn", c_attn);
    register_module("c_proj", c_proj);
  }
  // y = softmax(q k^T / sqrt(d) masked causally) v, by the fused op or spelled out with tril +
  // masked_fill (nanoGPT's fallback path)
  Tensor attend(const Tensor& x, bool flash) {
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
    std::vector<Tensor> qkv = c_attn(x).split(C, 2);
    auto heads = [&](const Tensor& t) { return t.view({B, T, n_head, C / n_head}).transpose(1, 2); };
    Tensor q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
    const double p = is_training() ? dropout : 0.0;
    Tensor y;
    if (flash) {
      y = F::scaled_dot_product_attention(q, k, v, /*attn_mask=*/Tensor(), p, /*is_causal=*/true);
    } else {
      Tensor att = q.matmul(k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(k.size(-1))));
      Tensor mask = kiln::ones({T, T}).tril().view({1, 1, T, T});
      att = F::dropout(att.masked_fill(mask == 0.0, -INFINITY).softmax(-1), p, is_training());
      y = att.matmul(v);
    }
    return c_proj(y.transpose(1, 2).contiguous().view({B, T, C}));
  }
  Tensor forward(const Tensor& x) override { return attend(x, true); }
};

struct GPTBlock : nn::Module {
  nn::LayerNorm ln_1, ln_2;
  CausalSelfAttention attn;
  nn::Linear c_fc, c_proj;
  nn::GELU gelu;
  GPTBlock(int64_t n_embd, int64_t n_head)
      : nn::Module("Block"),
        ln_1(n_embd),
        ln_2(n_embd),
        attn(n_embd, n_head),
        c_fc(n_embd, 4 * n_embd),
        c_proj(4 * n_embd, n_embd) {
    register_module("ln_1", ln_1);
    register_module("attn", attn);
    register_module("ln_2", ln_2);
    register_module("c_fc", c_fc);
    register_module("c_proj", c_proj);
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = x + attn(ln_1(x));
    return h + c_proj(gelu(c_fc(ln_2(h))));
  }
};

struct NanoGPT : nn::Module {
  int64_t block_size;
  nn::Embedding wte, wpe;
  nn::ModuleList h;
  nn::LayerNorm ln_f;
  NanoGPT(int64_t vocab, int64_t block_size, int64_t n_layer, int64_t n_head, int64_t n_embd)
      : nn::Module("GPT"), block_size(block_size), wte(vocab, n_embd), wpe(block_size, n_embd), ln_f(n_embd) {
    register_module("wte", wte);
    register_module("wpe", wpe);
    for (int64_t i = 0; i < n_layer; ++i) h.push_back(std::make_shared<GPTBlock>(n_embd, n_head));
    register_module("h", h);
    register_module("ln_f", ln_f);
    // nanoGPT's _init_weights, then the scaled init of the residual projections
    apply([](nn::Module& m) {
      if (auto* l = dynamic_cast<nn::Linear*>(&m)) {
        init::normal_(l->weight, 0.0, 0.02);
        if (l->bias.defined()) init::zeros_(l->bias);
      } else if (auto* e = dynamic_cast<nn::Embedding*>(&m)) {
        init::normal_(e->weight, 0.0, 0.02);
      }
    });
    for (auto& [name, p] : named_parameters())
      if (name.size() > 13 && name.compare(name.size() - 13, 13, "c_proj.weight") == 0)
        init::normal_(p, 0.0, 0.02 / std::sqrt(2.0 * static_cast<double>(n_layer)));
  }
  Tensor forward(const Tensor& idx) override {
    const int64_t T = idx.size(1);
    Tensor pos = kiln::arange(static_cast<double>(T), TensorOptions(DType::I64));
    Tensor x = wte(idx) + wpe(pos);
    for (size_t i = 0; i < h.size(); ++i) x = h[i](x);
    return F::linear(ln_f(x), wte.weight);  // lm_head tied to wte
  }
};

// ------------------------------------------------------------------------------ ResNet

struct BasicBlock : nn::Module {
  nn::Conv2d conv1, conv2;
  nn::BatchNorm2d bn1, bn2;
  nn::ReLU relu;
  std::shared_ptr<nn::Sequential> downsample;
  BasicBlock(int64_t inplanes, int64_t planes, int64_t stride)
      : nn::Module("BasicBlock"),
        conv1(nn::Conv2dOptions(inplanes, planes, 3).stride(stride).padding(1).bias(false)),
        conv2(nn::Conv2dOptions(planes, planes, 3).padding(1).bias(false)),
        bn1(planes),
        bn2(planes) {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    register_module("conv2", conv2);
    register_module("bn2", bn2);
    if (stride != 1 || inplanes != planes)
      downsample = register_module(
          "downsample",
          std::make_shared<nn::Sequential>(
              std::make_shared<nn::Conv2d>(nn::Conv2dOptions(inplanes, planes, 1).stride(stride).bias(false)),
              std::make_shared<nn::BatchNorm2d>(planes)));
  }
  Tensor forward(const Tensor& x) override {
    Tensor out = bn2(conv2(relu(bn1(conv1(x)))));
    return relu(out + (downsample ? (*downsample)(x) : x));
  }
};

struct TinyResNet : nn::Module {
  nn::Conv2d conv1;
  nn::BatchNorm2d bn1;
  nn::ReLU relu;
  nn::MaxPool2d maxpool{nn::Pool2dOptions(3).stride(2).padding(1)};
  BasicBlock layer1, layer2;
  nn::AdaptiveAvgPool2d avgpool{1};
  nn::Linear fc;
  explicit TinyResNet(int64_t num_classes)
      : nn::Module("ResNet"),
        conv1(nn::Conv2dOptions(3, 8, 3).padding(1).bias(false)),
        bn1(8),
        layer1(8, 8, 1),
        layer2(8, 16, 2),
        fc(16, num_classes) {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    register_module("layer1", layer1);
    register_module("layer2", layer2);
    register_module("fc", fc);
    apply([](nn::Module& m) {
      if (auto* c = dynamic_cast<nn::Conv2d*>(&m)) init::kaiming_normal_(c->weight, 0.0, init::FanMode::FanOut, "relu");
      else if (auto* b = dynamic_cast<nn::BatchNorm2d*>(&m)) init::ones_(b->weight), init::zeros_(b->bias);
    });
  }
  Tensor forward(const Tensor& x) override {
    Tensor y = maxpool(relu(bn1(conv1(x))));
    y = layer2(layer1(y));
    return fc(avgpool(y).flatten(1));
  }
};

// ------------------------------------------------------------------------------ ViT

struct EncoderBlock : nn::Module {
  nn::LayerNorm ln_1{nn::LayerNormOptions({16}).eps(1e-6)}, ln_2{nn::LayerNormOptions({16}).eps(1e-6)};
  nn::MultiheadAttention self_attention;
  nn::Sequential mlp;
  EncoderBlock(int64_t hidden, int64_t heads, int64_t mlp_dim)
      : nn::Module("EncoderBlock"), self_attention(hidden, heads) {
    auto fc1 = std::make_shared<nn::Linear>(hidden, mlp_dim), fc2 = std::make_shared<nn::Linear>(mlp_dim, hidden);
    for (auto& l : {fc1, fc2}) {
      init::xavier_uniform_(l->weight);
      init::normal_(l->bias, 0.0, 1e-6);
    }
    mlp.push_back(fc1);
    mlp.push_back(std::make_shared<nn::GELU>());
    mlp.push_back(std::make_shared<nn::Dropout>(0.0));
    mlp.push_back(fc2);
    mlp.push_back(std::make_shared<nn::Dropout>(0.0));
    register_module("ln_1", ln_1);
    register_module("self_attention", self_attention);
    register_module("ln_2", ln_2);
    register_module("mlp", mlp);
  }
  Tensor forward(const Tensor& x) override {
    Tensor y = x + self_attention(ln_1(x));
    return y + mlp(ln_2(y));
  }
};

struct TinyViT : nn::Module {
  int64_t patch, hidden;
  nn::Conv2d conv_proj;
  Tensor class_token, pos_embedding;
  nn::ModuleList layers;
  nn::LayerNorm ln{nn::LayerNormOptions({16}).eps(1e-6)};
  nn::Linear head;
  TinyViT(int64_t image, int64_t patch, int64_t num_classes)
      : nn::Module("VisionTransformer"),
        patch(patch),
        hidden(16),
        conv_proj(nn::Conv2dOptions(3, 16, patch).stride(patch)),
        head(16, num_classes) {
    const int64_t seq = (image / patch) * (image / patch) + 1;
    register_module("conv_proj", conv_proj);
    class_token = register_parameter("class_token", kiln::zeros({1, 1, hidden}));
    pos_embedding = register_parameter("pos_embedding", kiln::empty({1, seq, hidden}));
    init::normal_(pos_embedding, 0.0, 0.02);
    for (int i = 0; i < 2; ++i) layers.push_back(std::make_shared<EncoderBlock>(hidden, 2, 32));
    register_module("layers", layers);
    register_module("ln", ln);
    register_module("head", head);
    const double fan_in = static_cast<double>(3 * patch * patch);
    init::trunc_normal_(conv_proj.weight, 0.0, std::sqrt(1.0 / fan_in));
    init::zeros_(conv_proj.bias);
  }
  Tensor forward(const Tensor& x) override {
    const int64_t n = x.size(0);
    Tensor y = conv_proj(x);                                 // [n, hidden, h/p, w/p]
    y = y.reshape({n, hidden, -1}).permute({0, 2, 1});       // [n, patches, hidden]
    y = kiln::cat({class_token.expand({n, -1, -1}), y}, 1);  // [n, patches + 1, hidden]
    y = y + pos_embedding;
    for (size_t i = 0; i < layers.size(); ++i) y = layers[i](y);
    return head(ln(y).select(1, 0));
  }
};

// ------------------------------------------------------------------------------ U-Net

std::shared_ptr<nn::Sequential> double_conv(int64_t in, int64_t out, int64_t mid) {
  return std::make_shared<nn::Sequential>(
      std::make_shared<nn::Conv2d>(nn::Conv2dOptions(in, mid, 3).padding(1).bias(false)),
      std::make_shared<nn::BatchNorm2d>(mid), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Conv2d>(nn::Conv2dOptions(mid, out, 3).padding(1).bias(false)),
      std::make_shared<nn::BatchNorm2d>(out), std::make_shared<nn::ReLU>());
}

std::shared_ptr<nn::Sequential> down(int64_t in, int64_t out) {
  return std::make_shared<nn::Sequential>(std::make_shared<nn::MaxPool2d>(nn::Pool2dOptions(2)),
                                          double_conv(in, out, out));
}

// Upsample x1, pad it to x2's size (odd sizes), concatenate, DoubleConv.
struct Up : nn::Module {
  nn::Upsample up{F::InterpolateOptions().scale_factor({2}).mode("bilinear").align_corners(true)};
  std::shared_ptr<nn::Sequential> conv;
  Up(int64_t in, int64_t out) : nn::Module("Up"), conv(double_conv(in, out, in / 2)) { register_module("conv", conv); }
  Tensor forward(const Tensor&) override { KILN_FAIL("Up takes two inputs"); }
  Tensor operator()(const Tensor& x1_in, const Tensor& x2) {
    Tensor x1 = up(x1_in);
    const int64_t dy = x2.size(2) - x1.size(2), dx = x2.size(3) - x1.size(3);
    x1 = F::pad(x1, {dx / 2, dx - dx / 2, dy / 2, dy - dy / 2});
    return (*conv)(kiln::cat({x2, x1}, 1));
  }
};

struct TinyUNet : nn::Module {
  std::shared_ptr<nn::Sequential> inc = double_conv(1, 4, 4), down1 = down(4, 8), down2 = down(8, 8);
  Up up1{16, 4}, up2{8, 4};
  nn::Conv2d outc{4, 2, 1};
  TinyUNet() : nn::Module("UNet") {
    register_module("inc", inc);
    register_module("down1", down1);
    register_module("down2", down2);
    register_module("up1", up1);
    register_module("up2", up2);
    register_module("outc", outc);
  }
  Tensor forward(const Tensor& x) override {
    Tensor x1 = (*inc)(x), x2 = (*down1)(x1), x3 = (*down2)(x2);
    return outc(up2(up1(x3, x2), x1));
  }
};

// multiclass dice loss over [N, C, H, W] probabilities and one-hot targets, as the U-Net repo's
Tensor dice_loss(const Tensor& logits, const Tensor& target) {
  Tensor probs = logits.softmax(1);
  Tensor onehot = kiln::one_hot(target, logits.size(1)).permute({0, 3, 1, 2}).to(DType::F32);
  Tensor inter = (probs * onehot).sum({2, 3});
  Tensor sets = probs.sum({2, 3}) + onehot.sum({2, 3});
  return 1.0 - ((2.0 * inter + 1e-6) / (sets + 1e-6)).mean();
}

// ------------------------------------------------------------------------------ LSTM LM

struct RNNModel : nn::Module {
  int64_t ntoken;
  nn::Dropout drop{0.2};
  nn::Embedding encoder;
  nn::LSTM rnn;
  Tensor decoder_bias;  // the decoder's weight is the encoder's (tie_weights)
  RNNModel(int64_t ntoken, int64_t nhid, int64_t nlayers)
      : nn::Module("RNNModel"),
        ntoken(ntoken),
        encoder(ntoken, nhid),
        rnn(nn::LSTMOptions(nhid, nhid).num_layers(nlayers).dropout(0.2)) {
    register_module("encoder", encoder);
    register_module("rnn", rnn);
    decoder_bias = register_parameter("decoder_bias", kiln::zeros({ntoken}));
    init::uniform_(encoder.weight, -0.1, 0.1);
  }
  // input [T, B] -> log-probabilities [T * B, ntoken] and the new hidden state
  std::tuple<Tensor, nn::LSTMState> run(const Tensor& input, const nn::LSTMState& hidden) {
    auto [output, h] = rnn(drop(encoder(input)), hidden);
    Tensor decoded = F::linear(drop(output), encoder.weight, decoder_bias);
    return {F::log_softmax(decoded.view({-1, ntoken}), 1), h};
  }
};

// Its Transformer variant: PositionalEncoding + nn.TransformerEncoder under a causal mask.
struct PositionalEncoding : nn::Module {
  nn::Dropout dropout;
  Tensor pe;  // [max_len, 1, d_model]
  PositionalEncoding(int64_t d_model, double p, int64_t max_len) : nn::Module("PositionalEncoding"), dropout(p) {
    Tensor position = kiln::arange(static_cast<double>(max_len)).unsqueeze(1);
    Tensor div_term = kiln::exp(kiln::arange(0.0, static_cast<double>(d_model), 2.0) * (-std::log(10000.0) / d_model));
    Tensor table = kiln::zeros({max_len, d_model});
    table.slice(1, 0, d_model, 2).copy_(kiln::sin(position * div_term));
    table.slice(1, 1, d_model, 2).copy_(kiln::cos(position * div_term));
    pe = register_buffer("pe", table.unsqueeze(1));
    register_module("dropout", dropout);
  }
  Tensor forward(const Tensor& x) override { return dropout(x + pe.narrow(0, 0, x.size(0))); }
};

struct TransformerModel : nn::Module {
  int64_t ntoken, ninp;
  nn::Embedding encoder;
  PositionalEncoding pos_encoder;
  nn::TransformerEncoder transformer_encoder;
  nn::Linear decoder;
  TransformerModel(int64_t ntoken, int64_t ninp, int64_t nhead, int64_t nhid, int64_t nlayers, double dropout)
      : nn::Module("TransformerModel"),
        ntoken(ntoken),
        ninp(ninp),
        encoder(ntoken, ninp),
        pos_encoder(ninp, dropout, 64),
        transformer_encoder(nn::TransformerEncoderOptions(
            nn::TransformerEncoderLayerOptions(ninp, nhead).dim_feedforward(nhid).dropout(dropout), nlayers)),
        decoder(ninp, ntoken) {
    register_module("encoder", encoder);
    register_module("pos_encoder", pos_encoder);
    register_module("transformer_encoder", transformer_encoder);
    register_module("decoder", decoder);
    init::uniform_(encoder.weight, -0.1, 0.1);
    init::zeros_(decoder.bias);
    init::uniform_(decoder.weight, -0.1, 0.1);
  }
  // src [T, B] -> log-probabilities [T, B, ntoken]; each position sees itself and earlier ones
  Tensor forward(const Tensor& src) override {
    const int64_t T = src.size(0);
    Tensor mask = kiln::zeros({T, T}).masked_fill(kiln::ones({T, T}).triu(1) > 0.5, -INFINITY);
    Tensor x = pos_encoder(encoder(src) * std::sqrt(static_cast<double>(ninp)));
    return F::log_softmax(decoder(transformer_encoder(x, mask)), -1);
  }
};

}  // namespace

TEST_CASE("model zoo: nanoGPT trains", "[model_zoo]") {
  kiln::manual_seed(0);
  NanoGPT gpt(16, 8, 2, 2, 16);
  Tensor data = kiln::randint(0, 16, {4, 9});
  Tensor idx = data.slice(1, 0, 8), targets = data.slice(1, 1, 9);
  // the fused causal attention and nanoGPT's masked fallback agree (eval: no attention dropout)
  Tensor x = kiln::randn({2, 8, 16});
  auto& attn = dynamic_cast<GPTBlock&>(gpt.h[0]).attn;
  gpt.eval();
  CHECK(kiln::allclose(attn.attend(x, true), attn.attend(x, false), 1e-4, 1e-6));
  gpt.train();
  CHECK_FALSE(kiln::allclose(attn.attend(x, true), attn.attend(x, false), 1e-4, 1e-6));  // dropout draws
  CHECK(gpt(idx).sizes() == IntList{4, 8, 16});
  auto losses = train(gpt, 25, 1e-2, [&] {
    Tensor logits = gpt(idx);
    return F::cross_entropy(logits.view({-1, logits.size(-1)}), targets.reshape({-1}), /*ignore_index=*/-1);
  });
  CHECK(losses.front() == Approx(std::log(16.0)).epsilon(0.05));  // small init: near-uniform predictions
  check_trains(losses, 0.4);
}

TEST_CASE("model zoo: ResNet trains", "[model_zoo]") {
  kiln::manual_seed(1);
  TinyResNet net(5);
  Tensor images = kiln::randn({8, 3, 16, 16});
  Tensor labels = kiln::randint(0, 5, {8});
  CHECK(net(images).sizes() == IntList{8, 5});
  auto losses = train(net, 15, 1e-2, [&] { return F::cross_entropy(net(images), labels); });
  check_trains(losses, 0.3);
}

TEST_CASE("model zoo: ViT trains", "[model_zoo]") {
  kiln::manual_seed(2);
  TinyViT vit(8, 4, 3);
  init::zeros_(vit.head.weight);  // torchvision zero-initialises the head
  init::zeros_(vit.head.bias);
  Tensor images = kiln::randn({6, 3, 8, 8});
  Tensor labels = kiln::tensor({0, 1, 2, 0, 1, 2});
  CHECK(vit(images).sizes() == IntList{6, 3});
  auto losses = train(vit, 25, 1e-2, [&] { return F::cross_entropy(vit(images), labels); });
  CHECK(losses.front() == Approx(std::log(3.0)).epsilon(1e-6));  // zero head: uniform
  check_trains(losses, 0.3);
}

TEST_CASE("model zoo: U-Net trains", "[model_zoo]") {
  kiln::manual_seed(3);
  TinyUNet unet;
  Tensor images = kiln::randn({2, 1, 10, 10});  // 10 -> 5 -> 2: the up path pads 4 to 5
  Tensor masks = (images.squeeze(1) > 0.3).to(DType::I64);
  CHECK(unet(images).sizes() == IntList{2, 2, 10, 10});
  auto losses = train(unet, 20, 1e-2, [&] {
    Tensor logits = unet(images);
    return F::cross_entropy(logits, masks) + dice_loss(logits, masks);
  });
  check_trains(losses, 0.6);
}

TEST_CASE("model zoo: LSTM language model trains", "[model_zoo]") {
  kiln::manual_seed(4);
  const int64_t ntoken = 12, bsz = 3, bptt = 5;
  RNNModel model(ntoken, 8, 2);
  // batchify: a token stream as [T, B] columns; each step runs two bptt chunks, the second
  // starting from the first's detached hidden state (repackage_hidden)
  std::vector<int64_t> tokens;
  for (int64_t i = 0; i < 2 * bptt * bsz + bsz; ++i) tokens.push_back((5 * i + 3) % ntoken);  // periodic
  Tensor stream = kiln::tensor(tokens);
  Tensor data = stream.narrow(0, 0, (stream.size(0) / bsz) * bsz).view({bsz, -1}).t().contiguous();
  auto losses = train(model, 40, 3e-2, [&] {
    nn::LSTMState hidden{kiln::zeros({2, bsz, 8}), kiln::zeros({2, bsz, 8})};
    Tensor total = kiln::zeros({});
    for (int64_t i = 0; i + 1 < data.size(0); i += bptt) {
      const int64_t len = std::min(bptt, data.size(0) - 1 - i);
      Tensor input = data.narrow(0, i, len), target = data.narrow(0, i + 1, len).reshape({-1});
      hidden = {std::get<0>(hidden).detach(), std::get<1>(hidden).detach()};
      auto [logp, h] = model.run(input, hidden);
      hidden = h;
      total = total + F::nll_loss(logp, target);
    }
    return total;
  });
  CHECK(losses.front() == Approx(2.0 * std::log(12.0)).epsilon(0.05));
  check_trains(losses, 0.6);
}

TEST_CASE("model zoo: the language model's Transformer variant trains", "[model_zoo]") {
  kiln::manual_seed(5);
  const int64_t ntoken = 12, bsz = 3, bptt = 6;
  TransformerModel model(ntoken, 16, 2, 32, 2, 0.1);
  std::vector<int64_t> tokens;
  for (int64_t i = 0; i < (bptt + 1) * bsz; ++i) tokens.push_back((5 * i + 3) % ntoken);  // periodic
  Tensor data = kiln::tensor(tokens).view({bsz, -1}).t().contiguous();                    // [T + 1, B]
  Tensor input = data.narrow(0, 0, bptt), target = data.narrow(0, 1, bptt).reshape({-1});
  CHECK(model(input).sizes() == IntList{bptt, bsz, ntoken});
  // the causal mask: the first position's predictions do not depend on later tokens
  model.eval();
  Tensor changed = input.clone();
  changed.narrow(0, 1, bptt - 1).fill_(0.0);
  CHECK(kiln::allclose(model(input).select(0, 0), model(changed).select(0, 0), 1e-6, 1e-6));
  CHECK_FALSE(kiln::allclose(model(input).select(0, 2), model(changed).select(0, 2), 1e-6, 1e-6));
  model.train();
  auto losses = train(model, 30, 1e-2, [&] { return F::nll_loss(model(input).view({-1, ntoken}), target); });
  check_trains(losses, 0.4);
}
