// nn::fuse: a user-written Sequential CNN with odd sizes gives the unfused model's outputs,
// gradients and BatchNorm state in training and eval; chains whose fused kernels' preconditions
// are not met still fuse and run the unfused ops; Linear -> GELU fuses; chains declared by
// hand-written forwards (a user module, ResNet) fuse; the Fashion-MNIST CNN's state_dict is
// unchanged by fusion.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include <kiln/kiln.h>
#include "tests/test_util.h"

using namespace kiln_test;

namespace {

namespace nn = kiln::nn;
using kiln::DType;
using kiln::Tensor;

std::shared_ptr<nn::Conv2d> conv(int64_t in, int64_t out, int64_t k, int64_t pad, bool bias = false,
                                 int64_t stride = 1) {
  return std::make_shared<nn::Conv2d>(nn::Conv2dOptions(in, out, k).padding(pad).stride(stride).bias(bias));
}
std::shared_ptr<nn::MaxPool2d> pool(int64_t k) { return std::make_shared<nn::MaxPool2d>(nn::Pool2dOptions(k)); }

// [5, 3, 13, 11] -> conv 3->5 (27-tap patch: the small-patch kernel) -> 13x11 -> pool 6x5 ->
// conv 5->6 (45 taps: conv + statistics epilogue + BN/ReLU/pool kernel) -> 4x3 -> pool 2x1 ->
// flatten 12 -> Linear -> GELU -> Linear.
std::shared_ptr<nn::Sequential> user_cnn() {
  auto s = std::make_shared<nn::Sequential>();
  for (auto m : std::vector<std::shared_ptr<nn::Module>>{
           conv(3, 5, 3, 1), std::make_shared<nn::BatchNorm2d>(nn::BatchNormOptions(5).momentum(0.3)),
           std::make_shared<nn::ReLU>(), pool(2), conv(5, 6, 3, 0), std::make_shared<nn::BatchNorm2d>(6),
           std::make_shared<nn::ReLU>(), pool(2), std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(12, 7),
           std::make_shared<nn::GELU>(), std::make_shared<nn::Linear>(7, 3)})
    s->push_back(m);
  s->to(DType::F64);
  return s;
}

// Two copies of one model: `plain` as built, `fused` with the same state and nn::fuse applied.
template <class Make>
std::pair<std::shared_ptr<nn::Sequential>, std::shared_ptr<nn::Sequential>> twins(Make make, int64_t want_fused) {
  auto plain = make(), fused = make();
  fused->load_state_dict(plain->state_dict());
  const auto keys = fused->state_dict().keys();
  CHECK(nn::fuse(*fused) == want_fused);
  CHECK(fused->state_dict().keys() == keys);
  CHECK(nn::fuse(*fused) == 0);  // nothing left to fuse
  return {plain, fused};
}

// Runs a forward (and, when training, a backward with a fixed upstream gradient) on both models
// and compares outputs, every parameter's gradient, every buffer and the input's gradient.
void check_same_step(nn::Module& plain, nn::Module& fused, const Tensor& x0, bool x_grad, const std::string& what) {
  INFO(what);
  plain.zero_grad();
  fused.zero_grad();
  Tensor xa = x_grad ? x0.clone().requires_grad_() : x0, xb = x_grad ? x0.clone().requires_grad_() : x0;
  Tensor ya = plain(xa), yb = fused(xb);
  check_close(yb, values(ya), 1e-8, 1e-10, "output");
  if (plain.is_training()) {
    Tensor g = kiln::randn(ya.sizes(), DType::F64);
    (ya * g).sum().backward();
    (yb * g).sum().backward();
    auto pa = plain.named_parameters(), pb = fused.named_parameters();
    REQUIRE(pa.size() == pb.size());
    for (size_t i = 0; i < pa.size(); ++i) {
      REQUIRE(pa[i].first == pb[i].first);
      REQUIRE(pb[i].second.grad().defined());
      check_close(pb[i].second.grad(), values(pa[i].second.grad()), 1e-7, 1e-10, "grad of " + pa[i].first);
    }
    if (x_grad) check_close(xb.grad(), values(xa.grad()), 1e-7, 1e-10, "grad of the input");
  }
  auto ba = plain.named_buffers(), bb = fused.named_buffers();
  REQUIRE(ba.size() == bb.size());
  for (size_t i = 0; i < ba.size(); ++i) check_close(bb[i].second, values(ba[i].second), 1e-9, 1e-12, ba[i].first);
}

}  // namespace

TEST_CASE("nn::fuse: a user CNN gives the unfused outputs, gradients and running statistics", "[fuse][module]") {
  kiln::manual_seed(41);
  auto [plain, fused] = twins(user_cnn, 3);
  CHECK(fused->fused_run_count() == 3);
  CHECK(fused->extra_repr() == "fused: ConvBatchNormReLU2d[0..3], ConvBatchNormReLU2d[4..7], LinearGELU[9..10]");
  CHECK(plain->extra_repr().empty());
  for (int step = 0; step < 3; ++step) {
    Tensor x = kiln::randn({5, 3, 13, 11}, DType::F64) * 1.5 + 0.2;
    check_same_step(*plain, *fused, x, false, "training step " + std::to_string(step));
  }
  check_same_step(*plain, *fused, kiln::randn({5, 3, 13, 11}, DType::F64), true, "training, input gradient");
  CHECK(fused->at<nn::BatchNorm2d>(1).num_batches_tracked.item<int64_t>() == 4);
  plain->eval();
  fused->eval();
  check_same_step(*plain, *fused, kiln::randn({2, 3, 13, 11}, DType::F64), false, "eval");
  CHECK(fused->at<nn::BatchNorm2d>(5).num_batches_tracked.item<int64_t>() == 4);  // eval counts nothing
  // checkpoint_sequential runs the fused runs inside its segments fused, with the same gradients
  plain->train();
  fused->train();
  Tensor x = kiln::randn({5, 3, 13, 11}, DType::F64);
  Tensor ya = kiln::checkpoint_sequential(*plain, 3, x), yb = kiln::checkpoint_sequential(*fused, 3, x);
  check_close(yb, values(ya), 1e-8, 1e-10, "checkpoint_sequential");
  // unfuse: the layers one by one again
  fused->unfuse();
  CHECK(fused->fused_run_count() == 0);
  check_same_step(*plain, *fused, x, false, "after unfuse");
}

TEST_CASE("nn::fuse: chains the fused kernels cannot take run the unfused ops", "[fuse][module]") {
  kiln::manual_seed(42);
  // a conv bias, a stride-2 conv, groups, a 3x3 pool the fused op does not compute (it stays a
  // separate layer after the fused conv -> BN -> ReLU) and BatchNorm without running statistics
  auto make = [] {
    auto s = std::make_shared<nn::Sequential>(
        conv(2, 4, 3, 1, /*bias=*/true), std::make_shared<nn::BatchNorm2d>(4), std::make_shared<nn::ReLU>(), pool(3),
        conv(4, 6, 3, 1, false, /*stride=*/2), std::make_shared<nn::BatchNorm2d>(6), std::make_shared<nn::ReLU>(),
        pool(2), std::make_shared<nn::Conv2d>(nn::Conv2dOptions(6, 4, 1).groups(2).bias(false)),
        std::make_shared<nn::BatchNorm2d>(nn::BatchNormOptions(4).track_running_stats(false)),
        std::make_shared<nn::ReLU>());
    s->to(DType::F64);
    return s;
  };
  auto [plain, fused] = twins(make, 3);
  CHECK(fused->extra_repr() ==
        "fused: ConvBatchNormReLU2d[0..2], ConvBatchNormReLU2d[4..7], ConvBatchNormReLU2d[8..10]");
  for (int step = 0; step < 2; ++step)
    check_same_step(*plain, *fused, kiln::randn({3, 2, 15, 13}, DType::F64), step == 1, "training");
  // channels-last memory: the fused op runs conv2d + batch_norm_relu + max_pool2d
  Tensor x = kiln::randn({3, 2, 15, 13}, DType::F64);
  plain->to(kiln::MemoryFormat::ChannelsLast);
  fused->to(kiln::MemoryFormat::ChannelsLast);
  check_same_step(*plain, *fused, x.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2}), true, "channels-last");
  plain->eval();
  fused->eval();
  check_same_step(*plain, *fused, x, false, "eval");
}

// A hand-written module whose forward runs conv -> bn -> relu through a declared chain, then a
// second conv -> BN without a ReLU (not a fusable stretch, and not declared).
struct ChainBlock : nn::Module {
  nn::Conv2d conv{nn::Conv2dOptions(2, 3, 3).padding(1).bias(false)};
  nn::BatchNorm2d bn{3};
  nn::ReLU relu;
  nn::Conv2d conv2{nn::Conv2dOptions(3, 4, 3).bias(false)};
  nn::BatchNorm2d bn2{4};
  ChainBlock() : Module("ChainBlock") {
    register_module("conv", conv);
    register_module("bn", bn);
    register_module("relu", relu);
    register_module("conv2", conv2);
    register_module("bn2", bn2);
    declare_chain({&conv, &bn, &relu});
  }
  Tensor forward(const Tensor& x) override { return bn2(conv2(run_chain(0, x))); }
};

TEST_CASE("nn::fuse: a chain declared by a hand-written forward fuses, names and results unchanged", "[fuse][module]") {
  kiln::manual_seed(46);
  ChainBlock plain, fused;
  plain.to(DType::F64);
  fused.to(DType::F64);
  fused.load_state_dict(plain.state_dict());
  const std::string printed = fused.str();
  REQUIRE(fused.chains().size() == 1);
  CHECK(nn::fuse(fused) == 1);
  CHECK(nn::fuse(fused) == 0);
  CHECK(fused.chains()[0]->extra_repr() == "fused: ConvBatchNormReLU2d[0..2]");
  CHECK(fused.str() == printed);  // a chain is not a child: the tree prints as before
  CHECK(fused.state_dict().keys() == plain.state_dict().keys());
  for (int step = 0; step < 2; ++step)
    check_same_step(plain, fused, kiln::randn({2, 2, 9, 7}, DType::F64), true, "training");
  plain.eval();
  fused.eval();
  check_same_step(plain, fused, kiln::randn({3, 2, 6, 5}, DType::F64), false, "eval");
  fused.chains()[0]->unfuse();
  CHECK(fused.chains()[0]->fused_run_count() == 0);
}

TEST_CASE("nn::fuse: ResNet's stem and every block's conv1 -> bn1 -> relu fuse", "[fuse][module][models]") {
  kiln::manual_seed(47);
  auto plain = nn::models::resnet18(5, 1, nn::models::ResNetStem::CIFAR);
  auto fused = nn::models::resnet18(5, 1, nn::models::ResNetStem::CIFAR);
  plain->to(DType::F64);
  fused->to(DType::F64);
  fused->load_state_dict(plain->state_dict());
  const std::string printed = fused->str();
  CHECK(nn::fuse(*fused) == 9);  // the stem and 8 basic blocks
  CHECK(fused->str() == printed);
  // the ReLU is a child, as in torchvision's blocks
  CHECK(printed.find("(relu): ReLU()") != std::string::npos);
  check_same_step(*plain, *fused, kiln::randn({2, 1, 8, 8}, DType::F64), true, "training");
  plain->eval();
  fused->eval();
  check_same_step(*plain, *fused, kiln::randn({2, 1, 8, 8}, DType::F64), false, "eval");
}

TEST_CASE("nn::fuse: a conv block with too small an output for the pool still runs", "[fuse][module]") {
  kiln::manual_seed(43);
  // the conv output is 1x1 (3x3 input, 3x3 kernel, no padding): max_pool2d's error, as unfused
  auto make = [] {
    auto s = std::make_shared<nn::Sequential>(conv(1, 2, 3, 0), std::make_shared<nn::BatchNorm2d>(2),
                                              std::make_shared<nn::ReLU>(), pool(2));
    s->to(DType::F64);
    return s;
  };
  {
    auto [plain, fused] = twins(make, 1);
    Tensor x = kiln::randn({2, 1, 3, 3}, DType::F64);
    REQUIRE_THROWS_AS((*plain)(x), kiln::Error);
    REQUIRE_THROWS_AS((*fused)(x), kiln::Error);
  }
  // a 4x4 input gives a 2x2 conv output: one window
  auto [plain, fused] = twins(make, 1);
  check_same_step(*plain, *fused, kiln::randn({2, 1, 4, 4}, DType::F64), false, "2x2 conv output");
}

TEST_CASE("nn::fuse: Linear -> GELU becomes LinearGELU, both approximations", "[fuse][module]") {
  kiln::manual_seed(44);
  for (std::string approx : {"none", "tanh"}) {
    INFO(approx);
    auto make = [&] {
      auto s = std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(6, 5), std::make_shared<nn::GELU>(approx),
                                                std::make_shared<nn::Linear>(5, 4));
      s->to(DType::F64);
      return s;
    };
    auto [plain, fused] = twins(make, 1);
    CHECK(fused->extra_repr() == "fused: LinearGELU[0..1]");
    check_same_step(*plain, *fused, kiln::randn({3, 2, 6}, DType::F64), true, "training");
  }
  // a subclass of a fusable layer keeps its own forward: not fused
  struct ScaledGELU : nn::GELU {
    Tensor forward(const Tensor& x) override { return nn::GELU::forward(x) * 2.0; }
  };
  nn::Sequential s(std::make_shared<nn::Linear>(3, 3), std::make_shared<ScaledGELU>());
  CHECK(nn::fuse(s) == 0);
}

TEST_CASE("nn::fuse: the Fashion-MNIST CNN keeps its state_dict and checkpoints load either way", "[fuse][models]") {
  kiln::manual_seed(45);
  nn::models::FashionCNN plain, fused;
  fused.load_state_dict(plain.state_dict());
  const nn::StateDict before = fused.state_dict();
  CHECK(nn::fuse(fused) == 2);
  CHECK(fused.extra_repr() == "fused: ConvBatchNormReLU2d[0..3], ConvBatchNormReLU2d[4..7]");
  const nn::StateDict after = fused.state_dict();
  REQUIRE(after.keys() == before.keys());
  for (const auto& [k, v] : before) CHECK(after.at(k).data_ptr() == v.data_ptr());  // the same tensors
  CHECK(fused.parameters().size() == plain.parameters().size());
  // same results as the plain model (f32), then a checkpoint of the fused one loads into a plain one
  Tensor x = kiln::randn({4, 1, 28, 28});
  check_close(fused(x), values(plain(x)), 1e-4, 1e-5, "forward");
  nn::models::FashionCNN reloaded;
  reloaded.load_state_dict(fused.state_dict());
  for (const auto& [k, v] : fused.state_dict()) CHECK(kiln::equal(reloaded.state_dict().at(k), v));
  REQUIRE_THROWS_AS(fused(kiln::randn({2, 1, 32, 32})), kiln::Error);  // the input check stays
}

// declare_chain refuses a module that is not a registered child; run_chain an unknown chain.
struct BadChain : nn::Module {
  nn::ReLU relu, stray;
  BadChain() : Module("BadChain") { register_module("relu", relu); }
  void declare_stray() { declare_chain({&relu, &stray}); }
  Tensor run(size_t i, const Tensor& x) { return run_chain(i, x); }
};

TEST_CASE("nn::Module chains: an unregistered module or an unknown chain is an Error", "[fuse][module]") {
  BadChain m;
  CHECK_THROWS_AS(m.declare_stray(), kiln::Error);
  CHECK_THROWS_AS(m.run(0, kiln::zeros({2})), kiln::Error);
}

TEST_CASE("nn::fuse: the Fashion-MNIST CNN with a bias before BatchNorm fuses and gives the plain results",
          "[fuse][models]") {
  kiln::manual_seed(46);
  const auto with_bias = nn::models::FashionCNNOptions().conv_bias(true);
  nn::models::FashionCNN plain(with_bias), fused(with_bias);
  fused.load_state_dict(plain.state_dict());
  CHECK(plain.parameters().size() == nn::models::FashionCNN().parameters().size() + 2);  // conv1.bias, conv2.bias
  CHECK(nn::fuse(fused) == 2);
  Tensor x = kiln::randn({4, 1, 28, 28});
  check_close(fused(x), values(plain(x)), 1e-4, 1e-5, "forward with conv biases");
}
