#pragma once
// The model zoo. Every conv/linear that feeds a BatchNorm has bias=false (the BatchNorm's shift
// makes a bias there a no-op; see docs/guide.md).
#include <memory>

#include "kiln/nn/activation.h"
#include "kiln/nn/attention.h"
#include "kiln/nn/container.h"
#include "kiln/nn/conv.h"
#include "kiln/nn/embedding.h"
#include "kiln/nn/linear.h"
#include "kiln/nn/normalization.h"
#include "kiln/nn/sampling.h"

namespace kiln::nn::models {

// Fully connected: in -> hidden... -> out with ReLU (and optional dropout) between layers.
// Flattens [N, ...] inputs to [N, in].
class MLP : public Module {
 public:
  MLP(int64_t in_features, std::vector<int64_t> hidden, int64_t out_features, double dropout = 0.0);
  Tensor forward(const Tensor& x) override;
  Sequential layers;
};

// The Fashion-MNIST CNN, a plain Sequential: conv3x3(1->32) -> BN -> ReLU -> maxpool2,
// conv3x3(32->64) -> BN -> ReLU -> maxpool2, flatten, linear 3136->128, ReLU, linear 128->10.
// Input [N, 1, 28, 28]. The layers are named (conv1, bn1, relu1, pool1, conv2, ..., fc2), so the
// state_dict keys read "conv1.weight", "bn1.running_mean", "fc2.bias". nn::fuse(cnn) turns both
// conv blocks into nn::ConvBatchNormReLU2d (kiln-train does so).
struct FashionCNNOptions {
  // A bias in each conv that feeds a BatchNorm: the "bias before BN" habit the guides warn
  // against (docs/guide.md, speed-up 15), for measuring what it costs. The bias changes nothing
  // the BatchNorm outputs, and the fused conv-block kernels take none, so nn::fuse leaves those
  // blocks on the general path.
  KILN_ARG(bool, conv_bias) = false;
};

class FashionCNN : public Sequential {
 public:
  explicit FashionCNN(const FashionCNNOptions& options = {});
  Tensor forward(const Tensor& x) override;  // checks the input size, then the layers in order
  // The layers, also reachable by index (0 conv1 ... 11 fc2).
  std::shared_ptr<Conv2d> conv1, conv2;
  std::shared_ptr<BatchNorm2d> bn1, bn2;
  std::shared_ptr<Linear> fc1, fc2;
};

// ResNet basic block, as torchvision's: conv3x3-BN-ReLU-conv3x3-BN, plus the identity or a 1x1
// conv + BN shortcut, then ReLU (the one relu module serves both). conv1 -> bn1 -> relu is a
// declared chain, which nn::fuse runs as one fused module (as the stem's in ResNet).
class BasicBlock : public Module {
 public:
  BasicBlock(int64_t in_planes, int64_t planes, int64_t stride);
  Tensor forward(const Tensor& x) override;
  Conv2d conv1;
  BatchNorm2d bn1;
  ReLU relu;
  Conv2d conv2;
  BatchNorm2d bn2;
  std::shared_ptr<Sequential> downsample;  // null: identity
};

enum class ResNetStem { ImageNet, CIFAR };  // 7x7/2 conv + 3x3/2 max-pool, or one 3x3/1 conv

struct ResNetOptions {
  ResNetOptions(std::vector<int64_t> blocks) : blocks_(std::move(blocks)) {}  // NOLINT
  KILN_ARG(std::vector<int64_t>, blocks);
  KILN_ARG(int64_t, num_classes) = 1000;
  KILN_ARG(int64_t, in_channels) = 3;
  KILN_ARG(ResNetStem, stem) = ResNetStem::ImageNet;
};

class ResNet : public Module {
 public:
  explicit ResNet(const ResNetOptions& options);
  Tensor forward(const Tensor& x) override;
  // The stem: conv1 -> bn1 -> relu (a declared chain), then the 3x3/2 max-pool of the ImageNet stem.
  Tensor forward_stem(const Tensor& x);
  Conv2d conv1;
  BatchNorm2d bn1;
  ReLU relu;
  Sequential layer1, layer2, layer3, layer4;
  Linear fc;
  ResNetStem stem;
};

std::shared_ptr<ResNet> resnet18(int64_t num_classes = 1000, int64_t in_channels = 3,
                                 ResNetStem stem = ResNetStem::ImageNet);
std::shared_ptr<ResNet> resnet34(int64_t num_classes = 1000, int64_t in_channels = 3,
                                 ResNetStem stem = ResNetStem::ImageNet);

struct GPTConfig {
  static GPTConfig gpt2_124m() { return {}; }
  static GPTConfig tiny(int64_t vocab_size, int64_t block_size = 64) {
    return GPTConfig().vocab_size(vocab_size).block_size(block_size).n_layer(2).n_head(2).n_embd(32);
  }
  KILN_ARG(int64_t, vocab_size) = 50304;  // GPT-2's 50257 padded to a multiple of 64 (tensor-core friendly)
  KILN_ARG(int64_t, block_size) = 1024;
  KILN_ARG(int64_t, n_layer) = 12;
  KILN_ARG(int64_t, n_head) = 12;
  KILN_ARG(int64_t, n_embd) = 768;
  KILN_ARG(double, dropout) = 0.0;
  KILN_ARG(bool, bias) = true;
};

// GPT-2: token + learned position embeddings, pre-norm blocks, final LayerNorm, LM head tied to
// the token embedding. forward(idx [B, T] int64) -> logits [B, T, vocab].
class GPT : public Module {
 public:
  explicit GPT(const GPTConfig& config);
  Tensor forward(const Tensor& idx) override;
  // Samples `max_new_tokens` tokens after `idx` [1, T] (temperature, optional top-k), no grad.
  Tensor generate(const Tensor& idx, int64_t max_new_tokens, double temperature = 1.0, int64_t top_k = 0);
  // The same with every sampling option (temperature 0: greedy; top_k; top_p), drawing from
  // `generator` (the CPU default generator when null); see kiln/nn/sampling.h.
  Tensor generate(const Tensor& idx, int64_t max_new_tokens, const SamplingOptions& sampling,
                  Generator* generator = nullptr);

  GPTConfig config;
  Embedding wte, wpe;
  ModuleList h;
  LayerNorm ln_f;
};

}  // namespace kiln::nn::models
