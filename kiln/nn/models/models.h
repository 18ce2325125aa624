#pragma once
// The model zoo. Every conv/linear that feeds a BatchNorm has bias=false (GUIDE-TIPS #15).
#include <memory>

#include "kiln/nn/activation.h"
#include "kiln/nn/attention.h"
#include "kiln/nn/container.h"
#include "kiln/nn/conv.h"
#include "kiln/nn/embedding.h"
#include "kiln/nn/linear.h"
#include "kiln/nn/normalization.h"

namespace kiln::nn::models {

// Fully connected: in -> hidden... -> out with ReLU (and optional dropout) between layers.
// Flattens [N, ...] inputs to [N, in].
class MLP : public Module {
 public:
  MLP(int64_t in_features, std::vector<int64_t> hidden, int64_t out_features, double dropout = 0.0);
  Tensor forward(const Tensor& x) override;
  Sequential layers;
};

// The Fashion-MNIST CNN: conv3x3(1->32)+BN+ReLU+maxpool, conv3x3(32->64)+BN+ReLU+maxpool,
// linear 3136->128, ReLU, linear 128->10. Input [N, 1, 28, 28]. bn1 and bn2 are BatchNorm2d with
// fused_relu; their parameter/buffer names are the plain layer's. block1 runs as one op on the CPU
// (F::conv2d_batch_norm_relu_max_pool2d: the conv output is never written), block2 through the
// same call as conv2d with the BN statistics taken in its epilogue + one BN + ReLU + pool kernel.
class FashionCNN : public Module {
 public:
  FashionCNN();
  Tensor forward(const Tensor& x) override;  // head(block2(block1(x)))
  // The pieces of forward, for recomputing the blocks in backward (kiln::checkpoint):
  // conv -> BN -> ReLU -> 2x2 max pool each (fused as above), then the MLP head.
  Tensor block1(const Tensor& x);
  Tensor block2(const Tensor& h);
  Tensor head(const Tensor& h);
  Conv2d conv1, conv2;
  BatchNorm2d bn1, bn2;
  Linear fc1, fc2;
};

// ResNet basic block: conv3x3-BN-ReLU-conv3x3-BN, plus the identity or a 1x1 conv + BN shortcut.
// bn1 has fused_relu (BN+ReLU in one kernel), as has the stem's bn1 in ResNet.
class BasicBlock : public Module {
 public:
  BasicBlock(int64_t in_planes, int64_t planes, int64_t stride);
  Tensor forward(const Tensor& x) override;
  Conv2d conv1, conv2;
  BatchNorm2d bn1, bn2;
  std::shared_ptr<Sequential> downsample;  // null: identity
};

enum class ResNetStem { ImageNet, CIFAR };  // 7x7/2 conv + 3x3/2 max-pool, or one 3x3/1 conv

struct ResNetOptions {
  ResNetOptions(std::vector<int64_t> blocks) : blocks_(std::move(blocks)) {}  // NOLINT
  KILN_OPTION(std::vector<int64_t>, blocks);
  KILN_OPTION(int64_t, num_classes) = 1000;
  KILN_OPTION(int64_t, in_channels) = 3;
  KILN_OPTION(ResNetStem, stem) = ResNetStem::ImageNet;
};

class ResNet : public Module {
 public:
  explicit ResNet(const ResNetOptions& options);
  Tensor forward(const Tensor& x) override;
  Conv2d conv1;
  BatchNorm2d bn1;
  Sequential layer1, layer2, layer3, layer4;
  Linear fc;
  ResNetStem stem;
};

std::shared_ptr<ResNet> resnet18(int64_t num_classes = 1000, int64_t in_channels = 3,
                                 ResNetStem stem = ResNetStem::ImageNet);
std::shared_ptr<ResNet> resnet34(int64_t num_classes = 1000, int64_t in_channels = 3,
                                 ResNetStem stem = ResNetStem::ImageNet);

struct GPTConfig {
  int64_t vocab_size = 50304;  // GPT-2's 50257 padded to a multiple of 64 (tensor-core friendly)
  int64_t block_size = 1024;
  int64_t n_layer = 12, n_head = 12, n_embd = 768;
  double dropout = 0.0;
  bool bias = true;
  static GPTConfig gpt2_124m() { return {}; }
  static GPTConfig tiny(int64_t vocab_size, int64_t block_size = 64) {
    GPTConfig c;
    c.vocab_size = vocab_size;
    c.block_size = block_size;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 32;
    return c;
  }
};

// GPT-2: token + learned position embeddings, pre-norm blocks, final LayerNorm, LM head tied to
// the token embedding. forward(idx [B, T] int64) -> logits [B, T, vocab].
class GPT : public Module {
 public:
  explicit GPT(const GPTConfig& config);
  Tensor forward(const Tensor& idx) override;
  // Samples `max_new_tokens` tokens after `idx` [1, T] (temperature, optional top-k), no grad.
  Tensor generate(const Tensor& idx, int64_t max_new_tokens, double temperature = 1.0, int64_t top_k = 0);

  GPTConfig config;
  Embedding wte, wpe;
  ModuleList h;
  LayerNorm ln_f;
};

}  // namespace kiln::nn::models
