#include "kiln/nn/models/models.h"

#include <cmath>

#include "kiln/core/autograd.h"
#include "kiln/nn/functional.h"
#include "kiln/nn/init.h"

namespace kiln::nn::models {

namespace F = functional;

// ---------------------------------------------------------------- MLP

MLP::MLP(int64_t in, std::vector<int64_t> hidden, int64_t out, double dropout) : Module("MLP") {
  int64_t prev = in;
  for (int64_t hdim : hidden) {
    layers.push_back(std::make_shared<Linear>(prev, hdim));
    layers.push_back(std::make_shared<ReLU>());
    if (dropout > 0) layers.push_back(std::make_shared<Dropout>(dropout));
    prev = hdim;
  }
  layers.push_back(std::make_shared<Linear>(prev, out));
  register_module("layers", layers);
}

Tensor MLP::forward(const Tensor& x) { return layers(x.flatten(1)); }

// ---------------------------------------------------------------- Fashion-MNIST CNN

FashionCNN::FashionCNN(const FashionCNNOptions& options) : Sequential("FashionCNN") {
  // created in this order so that a seed gives the same initial weights as before the layers
  // were a Sequential
  const bool bias = options.conv_bias();
  conv1 = std::make_shared<Conv2d>(Conv2dOptions(1, 32, 3).padding(1).bias(bias));
  conv2 = std::make_shared<Conv2d>(Conv2dOptions(32, 64, 3).padding(1).bias(bias));
  bn1 = std::make_shared<BatchNorm2d>(32);
  bn2 = std::make_shared<BatchNorm2d>(64);
  fc1 = std::make_shared<Linear>(64 * 7 * 7, 128);
  fc2 = std::make_shared<Linear>(128, 10);
  push_back("conv1", conv1);
  push_back("bn1", bn1);
  push_back("relu1", std::make_shared<ReLU>());
  push_back("pool1", std::make_shared<MaxPool2d>(Pool2dOptions(2)));
  push_back("conv2", conv2);
  push_back("bn2", bn2);
  push_back("relu2", std::make_shared<ReLU>());
  push_back("pool2", std::make_shared<MaxPool2d>(Pool2dOptions(2)));
  push_back("flatten", std::make_shared<Flatten>());
  push_back("fc1", fc1);
  push_back("relu3", std::make_shared<ReLU>());
  push_back("fc2", fc2);
}

Tensor FashionCNN::forward(const Tensor& x) {
  KILN_CHECK(x.dim() == 4 && x.size(1) == 1 && x.size(2) == 28 && x.size(3) == 28,
             "FashionCNN: expected [N, 1, 28, 28] images, got sizes ", x.sizes());
  return Sequential::forward(x);
}

// ---------------------------------------------------------------- ResNet

BasicBlock::BasicBlock(int64_t in_planes, int64_t planes, int64_t stride)
    : Module("BasicBlock"),
      conv1(Conv2dOptions(in_planes, planes, 3).stride(stride).padding(1).bias(false)),
      bn1(planes),
      conv2(Conv2dOptions(planes, planes, 3).padding(1).bias(false)),
      bn2(planes) {
  register_module("conv1", conv1);
  register_module("bn1", bn1);
  register_module("relu", relu);
  register_module("conv2", conv2);
  register_module("bn2", bn2);
  declare_chain({&conv1, &bn1, &relu});
  if (stride != 1 || in_planes != planes) {
    downsample = std::make_shared<Sequential>(
        std::make_shared<Conv2d>(Conv2dOptions(in_planes, planes, 1).stride(stride).bias(false)),
        std::make_shared<BatchNorm2d>(planes));
    register_module("downsample", downsample);
  }
}

Tensor BasicBlock::forward(const Tensor& x) {
  Tensor out = run_chain(0, x);  // relu(bn1(conv1(x))), fused after nn::fuse
  out = bn2(conv2(out));
  return relu(out + (downsample ? (*downsample)(x) : x));
}

ResNet::ResNet(const ResNetOptions& o)
    : Module("ResNet"),
      conv1(o.stem() == ResNetStem::ImageNet ? Conv2dOptions(o.in_channels(), 64, 7).stride(2).padding(3).bias(false)
                                             : Conv2dOptions(o.in_channels(), 64, 3).stride(1).padding(1).bias(false)),
      bn1(64),
      fc(512, o.num_classes()),
      stem(o.stem()) {
  KILN_CHECK(o.blocks().size() == 4, "ResNet: expected 4 stage sizes, got ", o.blocks());
  register_module("conv1", conv1);
  register_module("bn1", bn1);
  register_module("relu", relu);
  declare_chain({&conv1, &bn1, &relu});
  Sequential* stages[4] = {&layer1, &layer2, &layer3, &layer4};
  const char* names[4] = {"layer1", "layer2", "layer3", "layer4"};
  int64_t in_planes = 64;
  for (int s = 0; s < 4; ++s) {
    int64_t planes = 64 << s;
    for (int64_t b = 0; b < o.blocks()[s]; ++b) {
      stages[s]->push_back(std::make_shared<BasicBlock>(in_planes, planes, (b == 0 && s > 0) ? 2 : 1));
      in_planes = planes;
    }
    register_module(names[s], *stages[s]);
  }
  register_module("fc", fc);
  // torchvision's init: kaiming normal (fan_out, relu) for convs; BN weight 1, bias 0.
  apply([](Module& m) {
    if (auto* c = dynamic_cast<Conv2d*>(&m)) init::kaiming_normal_(c->weight, 0.0, init::FanMode::FanOut, "relu");
  });
}

Tensor ResNet::forward_stem(const Tensor& x) {
  Tensor h = run_chain(0, x);  // relu(bn1(conv1(x))), fused after nn::fuse
  return stem == ResNetStem::ImageNet ? F::max_pool2d(h, {3, 3}, {2, 2}, {1, 1}) : h;
}

Tensor ResNet::forward(const Tensor& x) {
  Tensor h = forward_stem(x);
  h = layer4(layer3(layer2(layer1(h))));
  h = F::adaptive_avg_pool2d(h, {1, 1}).flatten(1);
  return fc(h);
}

std::shared_ptr<ResNet> resnet18(int64_t num_classes, int64_t in_channels, ResNetStem stem) {
  return std::make_shared<ResNet>(
      ResNetOptions({2, 2, 2, 2}).num_classes(num_classes).in_channels(in_channels).stem(stem));
}

std::shared_ptr<ResNet> resnet34(int64_t num_classes, int64_t in_channels, ResNetStem stem) {
  return std::make_shared<ResNet>(
      ResNetOptions({3, 4, 6, 3}).num_classes(num_classes).in_channels(in_channels).stem(stem));
}

// ---------------------------------------------------------------- GPT

GPT::GPT(const GPTConfig& c)
    : Module("GPT"), config(c), wte(c.vocab_size(), c.n_embd()), wpe(c.block_size(), c.n_embd()), ln_f(c.n_embd()) {
  register_module("wte", wte);
  register_module("wpe", wpe);
  for (int64_t i = 0; i < c.n_layer(); ++i) {
    h.push_back(std::make_shared<TransformerBlock>(
        TransformerBlockOptions(c.n_embd(), c.n_head()).dropout(c.dropout()).bias(c.bias())));
  }
  register_module("h", h);
  register_module("ln_f", ln_f);
  // GPT-2's init: N(0, 0.02) for weights and embeddings, zero biases, and residual projections
  // scaled by 1/sqrt(2 n_layer).
  const double resid_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer()));
  apply([&](Module& m) {
    if (auto* l = dynamic_cast<Linear*>(&m)) {
      init::normal_(l->weight, 0.0, 0.02);
      if (l->bias.defined()) init::zeros_(l->bias);
    } else if (auto* e = dynamic_cast<Embedding*>(&m)) {
      init::normal_(e->weight, 0.0, 0.02);
    }
  });
  for (const auto& blk : h) {
    auto& b = dynamic_cast<TransformerBlock&>(*blk);
    init::normal_(b.attn.out_proj.weight, 0.0, resid_std);
    init::normal_(b.proj.weight, 0.0, resid_std);
  }
}

Tensor GPT::forward(const Tensor& idx) {
  KILN_CHECK(idx.dim() == 2, "GPT: expected token indices [B, T], got sizes ", idx.sizes());
  const int64_t T = idx.size(1);
  KILN_CHECK(T <= config.block_size(), "GPT: sequence length ", T, " exceeds block_size ", config.block_size());
  Tensor pos = arange(static_cast<double>(T), TensorOptions().dtype(DType::I64).device(idx.device()));
  Tensor x = wte(idx) + wpe(pos);
  for (const auto& blk : h) x = blk->forward(x);
  return F::linear(ln_f(x), wte.weight);  // tied LM head
}

Tensor GPT::generate(const Tensor& idx_in, int64_t max_new_tokens, double temperature, int64_t top_k) {
  KILN_CHECK(temperature > 0, "GPT::generate: temperature must be positive");
  return generate(idx_in, max_new_tokens, SamplingOptions().temperature(temperature).top_k(top_k));
}

Tensor GPT::generate(const Tensor& idx_in, int64_t max_new_tokens, const SamplingOptions& sampling,
                     Generator* generator) {
  KILN_CHECK(idx_in.dim() == 2 && idx_in.size(0) == 1, "GPT::generate: expected [1, T] indices, got ", idx_in.sizes());
  NoGradGuard ng;
  bool was_training = is_training();
  eval();
  std::vector<int64_t> tokens;
  Tensor host = idx_in.to(Device::cpu(), DType::I64).contiguous();
  for (int64_t i = 0; i < host.numel(); ++i) tokens.push_back(host.data_ptr<int64_t>()[i]);
  for (int64_t step = 0; step < max_new_tokens; ++step) {
    int64_t start = std::max<int64_t>(0, static_cast<int64_t>(tokens.size()) - config.block_size());
    std::vector<int64_t> window(tokens.begin() + start, tokens.end());
    Tensor ctx = kiln::tensor(window).view({1, -1}).to(wte.weight.device());  // the model's device
    Tensor logits = forward(ctx).select(1, -1).squeeze(0);
    tokens.push_back(sample_next_token(logits, sampling, generator).item<int64_t>());
  }
  train(was_training);
  return kiln::tensor(tokens).view({1, -1});
}

}  // namespace kiln::nn::models
