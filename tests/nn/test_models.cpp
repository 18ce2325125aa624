// The model zoo: shapes, parameter counts equal to the reference implementations', gradients
// flow everywhere, GPT's tied head and generation.
#include <catch2/catch.hpp>

#include <kiln/kiln.h>
#include <kiln/nn/nn.h>

using kiln::Tensor;
namespace nn = kiln::nn;
namespace models = kiln::nn::models;

namespace {
void require_all_grads(nn::Module& m) {
  for (auto& [name, p] : m.named_parameters()) {
    INFO(name);
    REQUIRE(p.grad().defined());
    REQUIRE(std::isfinite(p.grad().abs().sum().item<double>()));
  }
}
}  // namespace

TEST_CASE("Fashion-MNIST CNN: shape, parameter count, gradients", "[models]") {
  kiln::manual_seed(0);
  models::FashionCNN net;
  REQUIRE(net.parameter_count() == 288 + 64 + 18432 + 128 + 401536 + 1290);  // = PyTorch's
  auto out = net(kiln::randn({3, 1, 28, 28}));
  REQUIRE(out.sizes() == kiln::IntList{3, 10});
  kiln::cross_entropy(out, kiln::tensor(std::vector<int64_t>{1, 5, 9})).backward();
  require_all_grads(net);
  REQUIRE_THROWS_AS(net(kiln::randn({3, 1, 32, 32})), kiln::Error);
}

TEST_CASE("MLP", "[models]") {
  models::MLP mlp(784, {256, 128}, 10, 0.1);
  REQUIRE(mlp.parameter_count() == 784 * 256 + 256 + 256 * 128 + 128 + 1290);
  REQUIRE(mlp(kiln::randn({2, 1, 28, 28})).sizes() == kiln::IntList{2, 10});
}

TEST_CASE("ResNet-18/34 match torchvision's parameter counts", "[models]") {
  REQUIRE(models::resnet18()->parameter_count() == 11689512);
  REQUIRE(models::resnet34()->parameter_count() == 21797672);
  auto r = models::resnet18(10, 1, models::ResNetStem::CIFAR);
  auto names = r->named_parameters();
  REQUIRE(names[3].first == "layer1.0.conv1.weight");
  bool has_down = false;
  for (auto& [n, p] : names) has_down = has_down || n == "layer2.0.downsample.0.weight";
  REQUIRE(has_down);
  kiln::manual_seed(1);
  auto out = (*r)(kiln::randn({2, 1, 16, 16}));
  REQUIRE(out.sizes() == kiln::IntList{2, 10});
  out.sum().backward();
  require_all_grads(*r);
}

TEST_CASE("GPT: tied head, causal, parameter count formula", "[models]") {
  kiln::manual_seed(2);
  auto cfg = models::GPTConfig::tiny(50, 16);
  models::GPT gpt(cfg);
  const int64_t E = cfg.n_embd(), L = cfg.n_layer();
  int64_t per_block = 2 * (2 * E) + (E * 3 * E + 3 * E) + (E * E + E) + (E * 4 * E + 4 * E) + (4 * E * E + E);
  REQUIRE(gpt.parameter_count() == cfg.vocab_size() * E + cfg.block_size() * E + L * per_block + 2 * E);
  auto idx = kiln::randint(0, 50, {2, 10});
  auto logits = gpt(idx);
  REQUIRE(logits.sizes() == kiln::IntList{2, 10, 50});
  // causal: changing a later token does not change earlier logits
  auto idx2 = idx.clone();
  idx2[0][9].fill_(static_cast<double>((idx[0][9].item<int64_t>() + 1) % 50));
  auto logits2 = gpt(idx2);
  REQUIRE(kiln::allclose(logits.slice(1, 0, 9), logits2.slice(1, 0, 9), 1e-5, 1e-6));
  REQUIRE_FALSE(kiln::allclose(logits.select(1, 9), logits2.select(1, 9)));
  kiln::cross_entropy(logits.reshape({-1, 50}), idx.reshape({-1})).backward();
  require_all_grads(gpt);
  auto sample = gpt.generate(idx.slice(0, 0, 1), 5);
  REQUIRE(sample.sizes() == kiln::IntList{1, 15});
  REQUIRE(sample.max().item<int64_t>() < 50);
  REQUIRE_THROWS_AS(gpt(kiln::randint(0, 50, {1, 17})), kiln::Error);  // longer than block_size
}
