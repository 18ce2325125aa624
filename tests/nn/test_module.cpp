// Module system: registration, dotted names, train/eval, to(), zero_grad, state_dict, printing,
// containers, lint; the design brief's user example compiles and trains.
#include <catch2/catch.hpp>

#include <sstream>

#include <kiln/kiln.h>
#include <kiln/nn/nn.h>

using kiln::Tensor;
namespace nn = kiln::nn;
namespace F = kiln::nn::functional;

namespace {
// The user's view of a module, as docs/guide.md ("Training a model") shows it.
struct Net : nn::Module {
  nn::Conv2d c1{nn::Conv2dOptions(1, 32, 3).padding(1).bias(false)};
  nn::BatchNorm2d b1{32};
  nn::Linear fc{32 * 14 * 14, 10};
  Net() {
    register_module("c1", c1);
    register_module("b1", b1);
    register_module("fc", fc);
  }
  Tensor forward(const Tensor& x) override { return fc(F::max_pool2d(F::relu(b1(c1(x))), 2).flatten(1)); }
};

struct Nested : nn::Module {
  nn::Sequential layer1;
  nn::Linear head{4, 2};
  Nested() {
    layer1.push_back(std::make_shared<nn::Linear>(3, 4));
    layer1.push_back(std::make_shared<nn::ReLU>());
    register_module("layer1", layer1);
    register_module("head", head);
  }
  Tensor forward(const Tensor& x) override { return head(layer1(x)); }
};
}  // namespace

TEST_CASE("the design brief's model trains on the CPU", "[module]") {
  kiln::manual_seed(0);
  Net net;
  auto x = kiln::randn({8, 1, 28, 28});
  auto y = kiln::randint(0, 10, {8});
  auto params = net.parameters();
  REQUIRE(params.size() == 5);  // c1.weight, b1.weight, b1.bias, fc.weight, fc.bias
  double first = 0, last = 0;
  for (int step = 0; step < 20; ++step) {
    auto loss = F::cross_entropy(net.forward(x), y);
    if (step == 0) first = loss.item<double>();
    last = loss.item<double>();
    loss.backward();
    {
      kiln::NoGradGuard ng;
      for (auto& p : params) p.sub_(p.grad() * 0.05);
    }
    net.zero_grad();
    REQUIRE_FALSE(params[0].grad().defined());  // set to none
  }
  REQUIRE(last < first * 0.5);  // memorises 8 samples
}

TEST_CASE("named parameters use dotted paths in registration order", "[module]") {
  Nested m;
  std::vector<std::string> names;
  for (auto& [n, p] : m.named_parameters()) names.push_back(n);
  REQUIRE(names == std::vector<std::string>{"layer1.0.weight", "layer1.0.bias", "head.weight", "head.bias"});
  REQUIRE(m.parameter_count() == 3 * 4 + 4 + 4 * 2 + 2);
  REQUIRE(m.named_parameters(false).empty());
  Net net;
  std::vector<std::string> bufs;
  for (auto& [n, b] : net.named_buffers()) bufs.push_back(n);
  REQUIRE(bufs == std::vector<std::string>{"b1.running_mean", "b1.running_var", "b1.num_batches_tracked"});
  auto mods = m.named_modules();
  REQUIRE(mods.size() == 5);  // self, layer1, layer1.0, layer1.1, head
  REQUIRE(mods[2].first == "layer1.0");
}

TEST_CASE("registration errors", "[module][errors]") {
  nn::Module m("Custom");
  m.register_parameter("w", kiln::zeros({2}));
  REQUIRE_THROWS_AS(m.register_parameter("w", kiln::zeros({2})), kiln::Error);
  REQUIRE_THROWS_AS(m.register_buffer("a.b", kiln::zeros({2})), kiln::Error);
  auto x = kiln::ones({2}, kiln::TensorOptions().requires_grad(true));
  REQUIRE_THROWS_AS(m.register_parameter("nonleaf", x * 2.0), kiln::Error);
  REQUIRE_THROWS_AS(m.forward(kiln::zeros({1})), kiln::Error);
  REQUIRE_THROWS_AS(nn::Conv2d(nn::Conv2dOptions(3, 4, 3).groups(2)), kiln::Error);
}

TEST_CASE("train and eval propagate; BatchNorm uses running stats in eval", "[module]") {
  kiln::manual_seed(1);
  Net net;
  REQUIRE(net.is_training());
  net.eval();
  REQUIRE_FALSE(net.b1.is_training());
  auto x = kiln::randn({2, 1, 28, 28});
  Tensor a, b;
  {
    kiln::NoGradGuard ng;
    a = net.forward(x);
    b = net.forward(x);
  }
  REQUIRE(kiln::equal(a, b));
  REQUIRE(net.b1.num_batches_tracked.item<int64_t>() == 0);
  net.train();
  net.forward(x);
  REQUIRE(net.b1.num_batches_tracked.item<int64_t>() == 1);
}

TEST_CASE("to(dtype) converts in place so handles and optimizers follow", "[module]") {
  nn::Linear l(3, 2);
  Tensor w = l.weight;  // another handle, like an optimizer's
  l.to(kiln::DType::F64);
  REQUIRE(w.dtype() == kiln::DType::F64);
  REQUIRE(l.weight.dtype() == kiln::DType::F64);
  REQUIRE(w.requires_grad());
  auto y = l(kiln::randn({4, 3}, kiln::DType::F64));
  REQUIRE(y.dtype() == kiln::DType::F64);
  REQUIRE_THROWS_AS(l.to(kiln::DType::I64), kiln::Error);
}

TEST_CASE("channels-last parameters keep their values", "[module]") {
  nn::Conv2d c(nn::Conv2dOptions(3, 8, 3));
  Tensor before = c.weight.clone();
  c.to(kiln::MemoryFormat::ChannelsLast);
  REQUIRE(c.weight.strides() == kiln::IntList{27, 1, 9, 3});
  REQUIRE(kiln::equal(c.weight, before));
}

TEST_CASE("zero_grad(false) zeroes instead of dropping", "[module]") {
  nn::Linear l(3, 2);
  l(kiln::randn({4, 3})).sum().backward();
  REQUIRE(l.weight.grad().defined());
  l.zero_grad(false);
  REQUIRE(l.weight.grad().defined());
  REQUIRE(l.weight.grad().abs().sum().item<double>() == 0.0);
}

TEST_CASE("state_dict round trip and strict key checking", "[module]") {
  kiln::manual_seed(2);
  Nested a, b;
  REQUIRE_FALSE(kiln::equal(a.head.weight, b.head.weight));
  b.load_state_dict(a.state_dict());
  REQUIRE(kiln::equal(a.head.weight, b.head.weight));
  REQUIRE(kiln::equal(a.layer1.at<nn::Linear>(0).bias, b.layer1.at<nn::Linear>(0).bias));
  // loading copies values: b's tensors stay its own
  {
    kiln::NoGradGuard ng;
    a.head.weight.fill_(7.0);
  }
  REQUIRE(b.head.weight[0][0].item<double>() != 7.0);

  nn::StateDict partial;
  partial.insert("head.weight", kiln::zeros({2, 4}));
  partial.insert("extra.thing", kiln::zeros({1}));
  try {
    b.load_state_dict(partial);
    FAIL("strict load should throw");
  } catch (const kiln::Error& e) {
    std::string msg = e.what();
    REQUIRE(msg.find("missing: [layer1.0.weight, layer1.0.bias, head.bias]") != std::string::npos);
    REQUIRE(msg.find("unexpected: [extra.thing]") != std::string::npos);
  }
  b.load_state_dict(partial, /*strict=*/false);
  REQUIRE(b.head.weight.abs().sum().item<double>() == 0.0);
  nn::StateDict wrong;
  wrong.insert("head.weight", kiln::zeros({3, 4}));
  REQUIRE_THROWS_WITH(b.load_state_dict(wrong, false), Catch::Contains("head.weight") && Catch::Contains("[3, 4]"));
}

TEST_CASE("printing shows the tree as PyTorch does", "[module]") {
  Net net;
  std::string s = net.str();
  REQUIRE(s.find("(c1): Conv2d(1, 32, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1), bias=False)") !=
          std::string::npos);
  REQUIRE(s.find("(fc): Linear(in_features=6272, out_features=10, bias=True)") != std::string::npos);
  REQUIRE(s.find("parameters") == std::string::npos);  // no lines of kiln's own
  REQUIRE(net.parameter_count() == 288 + 64 + 62730);
}

TEST_CASE("printing: the mirrored modules print as print(module) in PyTorch 2.15", "[module]") {
  // each string is PyTorch's own output for the same module, but for out_proj's class (torch's
  // NonDynamicallyQuantizableLinear is a Linear)
  CHECK(nn::LayerNorm(64).str() == "LayerNorm((64,), eps=1e-05, elementwise_affine=True, bias=True)");
  CHECK(nn::RMSNorm(kiln::IntList{6}, 1e-6).str() == "RMSNorm((6,), eps=1e-06, elementwise_affine=True)");
  CHECK(nn::Dropout(0.1).str() == "Dropout(p=0.1, inplace=False)");
  CHECK(nn::MultiheadAttention(nn::MultiheadAttentionOptions(8, 2)).str() ==
        "MultiheadAttention(\n  (out_proj): Linear(in_features=8, out_features=8, bias=True)\n)");
  CHECK(nn::TransformerEncoderLayer(nn::TransformerEncoderLayerOptions(8, 2).dim_feedforward(16)).str() ==
        "TransformerEncoderLayer(\n"
        "  (self_attn): MultiheadAttention(\n"
        "    (out_proj): Linear(in_features=8, out_features=8, bias=True)\n"
        "  )\n"
        "  (linear1): Linear(in_features=8, out_features=16, bias=True)\n"
        "  (dropout): Dropout(p=0.1, inplace=False)\n"
        "  (linear2): Linear(in_features=16, out_features=8, bias=True)\n"
        "  (norm1): LayerNorm((8,), eps=1e-05, elementwise_affine=True, bias=True)\n"
        "  (norm2): LayerNorm((8,), eps=1e-05, elementwise_affine=True, bias=True)\n"
        "  (dropout1): Dropout(p=0.1, inplace=False)\n"
        "  (dropout2): Dropout(p=0.1, inplace=False)\n"
        ")");
}

TEST_CASE("printing: floats as Python's repr, a newline at the end", "[module]") {
  REQUIRE(nn::float_repr(0.1) == "0.1");
  REQUIRE(nn::float_repr(1.0) == "1.0");
  REQUIRE(nn::float_repr(100.0) == "100.0");
  REQUIRE(nn::float_repr(0.0) == "0.0");
  REQUIRE(nn::float_repr(1e-5) == "1e-05");
  REQUIRE(nn::float_repr(2.5e-7) == "2.5e-07");
  REQUIRE(nn::float_repr(0.0001) == "0.0001");
  REQUIRE(nn::float_repr(1.0 / 3) == "0.3333333333333333");
  REQUIRE(nn::float_repr(-123.456) == "-123.456");
  REQUIRE(nn::float_repr(1e16) == "1e+16");
  REQUIRE(nn::Dropout(0.1).extra_repr() == "p=0.1, inplace=False");
  REQUIRE(nn::LeakyReLU(0.2).extra_repr() == "negative_slope=0.2");
  REQUIRE(nn::BatchNorm2d(8).extra_repr() == "8, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True");
  nn::Dropout d(0.1);
  std::ostringstream os;
  os << d;
  REQUIRE(os.str() == "Dropout(p=0.1, inplace=False)\n");
}

TEST_CASE("lint flags a biased conv feeding BatchNorm, not the zoo", "[module][lint]") {
  nn::Sequential bad(std::make_shared<nn::Conv2d>(nn::Conv2dOptions(3, 8, 3)), std::make_shared<nn::BatchNorm2d>(8),
                     std::make_shared<nn::ReLU>());
  auto w = nn::lint(bad, false);
  REQUIRE(w.size() == 1);
  REQUIRE(w[0].find("0 (Conv2d) has a bias but feeds 1 (BatchNorm2d)") != std::string::npos);
  nn::models::FashionCNN cnn;
  REQUIRE(nn::lint(cnn, false).empty());
  REQUIRE(nn::lint(*nn::models::resnet18(10, 1, nn::models::ResNetStem::CIFAR), false).empty());
}

TEST_CASE("containers: Sequential chains, ModuleList and ModuleDict index", "[module]") {
  nn::Sequential s(std::make_shared<nn::Linear>(2, 3), std::make_shared<nn::Tanh>(),
                   std::make_shared<nn::Linear>(3, 1));
  auto y = s(kiln::randn({5, 2}));
  REQUIRE(y.sizes() == kiln::IntList{5, 1});
  REQUIRE(s.size() == 3);
  REQUIRE_THROWS_AS(s[3], kiln::Error);
  REQUIRE_THROWS_AS(s.at<nn::Linear>(1), kiln::Error);
  nn::ModuleDict d;
  d.insert("enc", std::make_shared<nn::Linear>(2, 2));
  REQUIRE(d.contains("enc"));
  REQUIRE_THROWS_AS(d["dec"], kiln::Error);
  REQUIRE(d.named_parameters()[0].first == "enc.weight");
}

TEST_CASE("default initialisation follows PyTorch's bounds", "[module][init]") {
  kiln::manual_seed(3);
  nn::Linear l(400, 300);
  double bound = 1.0 / std::sqrt(400.0);
  REQUIRE(l.weight.abs().max().item<double>() <= bound);
  REQUIRE(l.weight.abs().max().item<double>() > 0.95 * bound);
  REQUIRE(l.bias.abs().max().item<double>() <= bound);
  auto w = kiln::empty({64, 32});
  nn::init::orthogonal_(w);
  auto wtw = kiln::matmul(w.t(), w);  // columns orthonormal: w^T w = I (32x32)
  auto eye = kiln::zeros({32, 32});
  for (int i = 0; i < 32; ++i) eye[i][i].fill_(1.0);
  REQUIRE(kiln::allclose(wtw, eye, 1e-4, 1e-5));
  auto k = kiln::empty({256, 128});
  nn::init::kaiming_normal_(k, 0.0, nn::init::FanMode::FanIn, "relu");
  REQUIRE(k.std({0, 1}).item<double>() == Approx(std::sqrt(2.0 / 128)).epsilon(0.03));
  auto vec = kiln::empty({3});
  REQUIRE_THROWS_AS(nn::init::xavier_uniform_(vec), kiln::Error);
}

TEST_CASE("trunc_normal_ stays inside [a, b] with the truncated normal's mean", "[module][init]") {
  kiln::manual_seed(4);
  auto w = kiln::empty({200, 100});
  nn::init::trunc_normal_(w, 0.5, 1.0, -0.5, 1.0);
  REQUIRE(w.min().item<double>() >= -0.5);
  REQUIRE(w.max().item<double>() <= 1.0);
  REQUIRE(w.min().item<double>() < -0.49);
  REQUIRE(w.max().item<double>() > 0.99);
  // mean of N(0.5, 1) cut to [-0.5, 1]: 0.5 + (phi(-1) - phi(0.5)) / (Phi(0.5) - Phi(-1)) = 0.29335
  REQUIRE(w.mean().item<double>() == Approx(0.29335).margin(0.015));
  auto v = kiln::empty({256, 128});
  nn::init::trunc_normal_(v, 0.0, 0.02);  // [-2, 2] is 100 std away: a plain N(0, 0.02^2)
  REQUIRE(v.std({0, 1}).item<double>() == Approx(0.02).epsilon(0.03));
  auto s = kiln::empty({4});
  REQUIRE_THROWS_WITH(nn::init::trunc_normal_(s, 0.0, 1.0, 1.0, 1.0), Catch::Contains("must be below"));
  REQUIRE_THROWS_WITH(nn::init::trunc_normal_(s, 0.0, 0.0), Catch::Contains("std must be positive"));
  REQUIRE_THROWS_WITH(nn::init::trunc_normal_(s, 0.0, 1.0, 10.0, 11.0), Catch::Contains("holds too little"));
}
