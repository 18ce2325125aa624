// Activation checkpointing gives the same gradients as running without it, with identical
// dropout masks in the recomputation, and keeps fewer tensors alive between forward and backward.
#include <catch2/catch.hpp>

#include <kiln/kiln.h>
#include <kiln/nn/checkpoint.h>

using kiln::Tensor;
namespace nn = kiln::nn;

namespace {
// Appends `layers` pairs of Linear(width, width) and the activation Act to `seq`.
template <class Act> void add_linear_stack(nn::Sequential& seq, int layers, int64_t width) {
  for (int i = 0; i < layers; ++i) {
    seq.push_back(std::make_shared<nn::Linear>(width, width));
    seq.push_back(std::make_shared<Act>());
  }
}

struct Block : nn::Module {
  nn::Linear a{16, 64}, b{64, 16};
  nn::Dropout drop{0.3};
  Block() : nn::Module("Block") {
    register_module("a", a);
    register_module("drop", drop);
    register_module("b", b);
  }
  Tensor forward(const Tensor& x) override { return b(drop(kiln::gelu(a(x)))) + x; }
};

std::vector<Tensor> grads_of(nn::Module& m, const Tensor& x, bool use_checkpoint) {
  m.zero_grad();
  Tensor xin = x.detach().requires_grad_(true);
  kiln::manual_seed(42);
  Tensor y = use_checkpoint ? kiln::checkpoint([&](const std::vector<Tensor>& in) { return m.forward(in[0]); }, {xin})
                            : m.forward(xin);
  (y * y).sum().backward();
  std::vector<Tensor> g{xin.grad()};
  for (auto& p : m.parameters()) g.push_back(p.grad());
  return g;
}
}  // namespace

TEST_CASE("checkpointed gradients equal plain ones, dropout included", "[checkpoint]") {
  kiln::manual_seed(1);
  Block blk;
  Tensor x = kiln::randn({8, 16});
  auto plain = grads_of(blk, x, false);
  auto ckpt = grads_of(blk, x, true);
  REQUIRE(plain.size() == ckpt.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    INFO("gradient " << i);
    REQUIRE(ckpt[i].defined());
    REQUIRE(kiln::allclose(ckpt[i], plain[i], 1e-5, 1e-6));
  }
}

TEST_CASE("checkpoint_sequential matches the plain Sequential", "[checkpoint]") {
  kiln::manual_seed(2);
  nn::Sequential seq;
  add_linear_stack<nn::Tanh>(seq, 4, 12);
  Tensor x = kiln::randn({5, 12});
  seq(x).sum().backward();
  std::vector<Tensor> plain;
  for (auto& p : seq.parameters()) plain.push_back(p.grad().clone());
  seq.zero_grad();
  kiln::checkpoint_sequential(seq, 3, x).sum().backward();
  auto params = seq.parameters();
  for (size_t i = 0; i < params.size(); ++i) REQUIRE(kiln::allclose(params[i].grad(), plain[i], 1e-6, 1e-7));
}

TEST_CASE("checkpointing keeps the segment's activations out of memory", "[checkpoint]") {
  kiln::manual_seed(3);
  nn::Linear l(32, 32);
  Tensor x = kiln::randn({64, 32}, kiln::TensorOptions().requires_grad(true));
  std::weak_ptr<kiln::Storage> inner;  // the intermediate's data
  auto seg = [&](const std::vector<Tensor>& in) {
    Tensor h = l(in[0]).exp();  // exp saves its output
    inner = h.storage();
    return h.tanh();
  };
  Tensor y = kiln::checkpoint(seg, {x});
  REQUIRE(inner.expired());  // the intermediate was not kept by the graph
  Tensor z = seg({x});
  REQUIRE_FALSE(inner.expired());  // without checkpointing it is
  (y.sum() + z.sum()).backward();
  REQUIRE(x.grad().defined());
}

TEST_CASE("checkpointing lowers the CPU allocator's peak over a deep stack", "[checkpoint]") {
  kiln::manual_seed(4);
  nn::Sequential seq;
  add_linear_stack<nn::GELU>(seq, 8, 256);
  Tensor x = kiln::randn({512, 256}, kiln::TensorOptions().requires_grad(true));
  auto peak_of = [&](bool checkpointed) {
    kiln::reset_cpu_peak_memory();
    const size_t base = kiln::cpu_memory_stats().allocated_bytes;
    Tensor y = checkpointed ? kiln::checkpoint_sequential(seq, 4, x) : seq(x);
    y.sum().backward();
    seq.zero_grad();
    x.set_grad(Tensor());
    return kiln::cpu_memory_stats().peak_allocated_bytes - base;
  };
  const size_t plain = peak_of(false), ckpt = peak_of(true);
  INFO("peak above baseline: plain " << plain << " bytes, checkpointed " << ckpt << " bytes");
  // 16 layers each keeping a 512x256 f32 activation (512 KiB) without checkpointing; 4 segments
  // keep only their inputs plus one segment's recomputed activations.
  REQUIRE(plain >= size_t{16} * 512 * 256 * 4 / 2);
  REQUIRE(ckpt < plain * 3 / 4);
}
