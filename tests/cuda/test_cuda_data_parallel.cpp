// DistributedDataParallel, ZeroRedundancyOptimizer and init_process_group over the "nccl" group on
// one GPU. In a world of one rank every average is the identity, so DDP's gradients and ZeRO's
// steps must equal a plain model's bit for bit: what this checks is the CUDA side of both
// (buckets on the device, their all-reduces issued from backward's hooks and ordered against the
// compute stream, the copies back into .grad, the unused-parameter map and the bucket rebuild's
// broadcast as device tensors, ZeRO's reduce-scatter / all-gather around the local step). The
// multi-rank logic is tested with 2-4 processes on the CPU (tests/distributed).
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include <kiln/distributed/parallel/data_parallel.h>
#include <kiln/distributed/distributed.h>
#include <kiln/distributed/parallel/zero_redundancy_optimizer.h>
#include <kiln/kiln.h>

#include "cuda_test_util.h"
#include "nccl_world.h"

namespace dist = kiln::distributed;
namespace nn = kiln::nn;
using kiln::Tensor;
using kiln_cuda_test::for_each_parameter_pair;
using kiln_cuda_test::kGpu;

namespace {

// Linear (no bias before the norm) -> BatchNorm1d -> ReLU -> Linear, and a Linear that only
// takes part when `use_extra` is set (for find_unused_parameters).
class Net : public nn::Module {
 public:
  Net() : nn::Module("Net") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(nn::LinearOptions(13, 37).bias(false)));
    bn = register_module("bn", std::make_shared<nn::BatchNorm1d>(37));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(37, 5));
    extra = register_module("extra", std::make_shared<nn::Linear>(13, 5));
  }
  Tensor forward(const Tensor& x) override {
    Tensor y = fc2->forward(bn->forward(fc1->forward(x)).relu());
    return use_extra ? y + extra->forward(x) : y;
  }
  std::shared_ptr<nn::Linear> fc1, fc2, extra;
  std::shared_ptr<nn::BatchNorm1d> bn;
  bool use_extra = true;
};

// Two nets with the same parameters, on the GPU.
std::pair<std::shared_ptr<Net>, std::shared_ptr<Net>> twin_nets() {
  kiln::manual_seed(11);
  auto a = std::make_shared<Net>();
  kiln::manual_seed(11);
  auto b = std::make_shared<Net>();
  a->to(kGpu);
  b->to(kGpu);
  return {a, b};
}

struct Batch {
  Tensor x, y;
};
Batch batch(uint64_t seed, int64_t rows = 9) {
  kiln::manual_seed(seed);
  return {kiln::randn({rows, 13}).to(kGpu), kiln::randn({rows, 5}).to(kGpu)};
}

// rtol 0: bitwise. Where the optimizer sees other tensors than the reference's (ZeRO's flat shard,
// gradients viewing a bucket at an offset that is not a multiple of the vector width), its
// kernels may take their scalar path where the reference takes the vector one, so those results
// are compared within a rounding or two.
bool same(const Tensor& a, const Tensor& b, double rtol = 0) {
  return rtol == 0 ? kiln::equal(a.cpu(), b.cpu()) : kiln::allclose(a.cpu(), b.cpu(), rtol, rtol);
}

// Every parameter's gradient of `model` equals the reference's (both undefined counts).
void require_same_grads(const nn::Module& model, const nn::Module& ref, double rtol = 0) {
  for_each_parameter_pair(model, ref, [&](const std::string& name, const Tensor& p, const Tensor& q) {
    INFO("gradient of " << name);
    const Tensor& g = p.grad();
    const Tensor& r = q.grad();
    REQUIRE(g.defined() == r.defined());
    if (r.defined()) {
      REQUIRE(g.device() == kGpu);
      REQUIRE(same(g, r, rtol));
    }
  });
}

void require_same_parameters(const nn::Module& model, const nn::Module& ref, double rtol = 0) {
  for_each_parameter_pair(model, ref, [&](const std::string& name, const Tensor& p, const Tensor& q) {
    INFO("parameter " << name);
    REQUIRE(same(p, q, rtol));
  });
}

}  // namespace

TEST_CASE("nccl DDP in a world of one: gradients and AdamW steps equal the plain model's",
          "[cuda][distributed][nccl][ddp]") {
  SKIP_WITHOUT_NCCL();
  // 16 bytes: below the smallest parameter (a 5-element bias), so a bucket per parameter and
  // several NCCL Works in flight, every slot at its bucket's start. 0: the default caps, one
  // bucket, slots at offsets like 20 bytes.
  for (double cap_bytes : {16.0, 0.0}) {
    for (bool view : {false, true}) {
      INFO("bucket cap " << cap_bytes << " bytes, gradient_as_bucket_view " << view);
      auto pg = kiln_test::nccl_world_of_one();
      auto [model, ref] = twin_nets();
      auto options = dist::DistributedDataParallelOptions().gradient_as_bucket_view(view);
      if (cap_bytes > 0) options.bucket_cap_mb(cap_bytes / (1 << 20)).first_bucket_mb(cap_bytes / (1 << 20));
      dist::DistributedDataParallel ddp(model, options, pg);
      REQUIRE(ddp.bucket_indices().size() == (cap_bytes > 0 ? model->parameters().size() : 1));
      REQUIRE_FALSE(ddp.buckets_rebuilt());
      kiln::optim::AdamW opt(ddp.parameters(), kiln::optim::AdamWOptions(1e-2).weight_decay(0.1));
      kiln::optim::AdamW ref_opt(ref->parameters(), kiln::optim::AdamWOptions(1e-2).weight_decay(0.1));
      const double rtol = cap_bytes > 0 || !view ? 0 : 1e-5;

      for (uint64_t step = 0; step < 3; ++step) {
        INFO("step " << step);
        const Batch b = batch(100 + step);
        opt.zero_grad();
        const uint64_t before = pg->sequence_number();
        kiln::mse_loss(ddp.forward(b.x), b.y).backward();
        // At least one all-reduce per bucket ran (and after the first, the rebuild's broadcast).
        REQUIRE(pg->sequence_number() - before >= ddp.bucket_indices().size());

        ref_opt.zero_grad();
        kiln::mse_loss(ref->forward(b.x), b.y).backward();
        require_same_grads(*model, *ref, step == 0 ? 0 : rtol);
        opt.step();
        ref_opt.step();
        require_same_parameters(*model, *ref, rtol);
      }
      REQUIRE(ddp.buckets_rebuilt());
      REQUIRE(same(model->bn->buffers()[0], ref->bn->buffers()[0], rtol));
    }
  }
}

TEST_CASE("nccl DDP in a world of one: no_sync issues no collective and reduces the sum after",
          "[cuda][distributed][nccl][ddp]") {
  SKIP_WITHOUT_NCCL();
  auto pg = kiln_test::nccl_world_of_one();
  auto [model, ref] = twin_nets();
  dist::DistributedDataParallel ddp(model, {}, pg);
  const Batch a = batch(7), b = batch(8);
  {
    auto guard = ddp.no_sync();
    const uint64_t before = pg->sequence_number();
    (kiln::mse_loss(ddp.forward(a.x), a.y) * 0.5).backward();
    REQUIRE(pg->sequence_number() == before);
  }
  const uint64_t before = pg->sequence_number();
  (kiln::mse_loss(ddp.forward(b.x), b.y) * 0.5).backward();
  REQUIRE(pg->sequence_number() > before);

  (kiln::mse_loss(ref->forward(a.x), a.y) * 0.5).backward();
  (kiln::mse_loss(ref->forward(b.x), b.y) * 0.5).backward();
  require_same_grads(*model, *ref);
}

TEST_CASE("nccl DDP in a world of one: unused parameters, found or named in an Error",
          "[cuda][distributed][nccl][ddp]") {
  SKIP_WITHOUT_NCCL();
  auto pg = kiln_test::nccl_world_of_one();
  {
    auto [model, ref] = twin_nets();
    model->use_extra = ref->use_extra = false;
    dist::DistributedDataParallel ddp(model, dist::DistributedDataParallelOptions().find_unused_parameters(true), pg);
    for (uint64_t step = 0; step < 2; ++step) {
      const Batch b = batch(30 + step);
      ddp.zero_grad();
      ref->zero_grad();
      kiln::mse_loss(ddp.forward(b.x), b.y).backward();
      kiln::mse_loss(ref->forward(b.x), b.y).backward();
      // `extra` took no part: its gradients stay undefined, as in the plain model.
      REQUIRE_FALSE(model->extra->parameters()[0].grad().defined());
      require_same_grads(*model, *ref);
    }
  }
  {
    auto [model, ref] = twin_nets();
    model->use_extra = false;
    dist::DistributedDataParallel ddp(model, {}, pg);
    const Batch b = batch(40);
    REQUIRE_THROWS_WITH(
        kiln::mse_loss(ddp.forward(b.x), b.y).backward(),
        Catch::Matchers::Contains("extra.weight") && Catch::Matchers::Contains("find_unused_parameters"));
  }
}

TEST_CASE(
    "nccl ZeRO-1 in a world of one: AdamW on the flat shard equals plain AdamW, and its "
    "state resumes",
    "[cuda][distributed][nccl][zero]") {
  SKIP_WITHOUT_NCCL();
  auto pg = kiln_test::nccl_world_of_one();
  auto [model, ref] = twin_nets();
  const auto options = kiln::optim::AdamWOptions(1e-2).weight_decay(0.1);
  dist::ZeroRedundancyOptimizer zero(model->parameters(), dist::local_optimizer<kiln::optim::AdamW>(options), pg);
  kiln::optim::AdamW plain(ref->parameters(), options);
  REQUIRE(zero.shards().size() == 1);
  REQUIRE(zero.shards()[0].device() == kGpu);
  REQUIRE(zero.owned_numel() == zero.total_numel());

  auto train_step = [](nn::Module& m, uint64_t seed) {
    const Batch b = batch(seed);
    kiln::mse_loss(m.forward(b.x), b.y).backward();
  };
  for (uint64_t step = 0; step < 3; ++step) {
    INFO("step " << step);
    zero.zero_grad();
    train_step(*model, 200 + step);
    const uint64_t before = pg->sequence_number();
    zero.step();
    REQUIRE(pg->sequence_number() - before == 2);  // reduce-scatter, all-gather
    plain.zero_grad();
    train_step(*ref, 200 + step);
    plain.step();
    require_same_parameters(*model, *ref, 1e-6);
  }

  // A second optimizer loaded with the first one's state takes the same next step.
  auto [copy, unused] = twin_nets();
  {
    kiln::NoGradGuard ng;
    auto src = model->parameters();
    auto dst = copy->parameters();
    for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  }
  dist::ZeroRedundancyOptimizer resumed(copy->parameters(), dist::local_optimizer<kiln::optim::AdamW>(options), pg);
  resumed.load_state_dict(zero.state_dict());
  zero.zero_grad();
  train_step(*model, 300);
  zero.step();
  resumed.zero_grad();
  train_step(*copy, 300);
  resumed.step();
  require_same_parameters(*copy, *model);
}

TEST_CASE("init_process_group(\"auto\") in a world of one routes CUDA tensors to nccl", "[cuda][distributed][nccl]") {
  SKIP_WITHOUT_NCCL();
  dist::TCPStoreOptions so;
  so.world_size = 1;
  so.is_server = true;
  dist::InitOptions init;
  init.rank = 0;
  init.world_size = 1;
  init.store = std::make_shared<dist::TCPStore>("127.0.0.1", 0, so);
  init.timeout = std::chrono::seconds(60);
  dist::init_process_group(init);
  struct Teardown {
    ~Teardown() { dist::destroy_process_group(); }
  } teardown;
  REQUIRE(dist::is_initialized());
  REQUIRE(dist::world_size() == 1);
  REQUIRE(dist::backend_name() == (dist::gloo_available() ? "gloo,nccl" : "nccl"));

  Tensor x = kiln::arange(0, 1001, 1, kiln::TensorOptions().dtype(kiln::DType::F32)).to(kGpu);
  const Tensor expect = x.clone();
  dist::all_reduce(x, dist::ReduceOp::Avg);
  REQUIRE(same(x, expect));
  auto work = dist::broadcast(x, 0, /*async_op=*/true);
  work->wait();
  REQUIRE(same(x, expect));
  dist::barrier();
  if (dist::gloo_available()) {  // "auto" also built gloo: CPU tensors go there
    Tensor c = kiln::ones({5});
    dist::all_reduce(c);
    REQUIRE(kiln::equal(c, kiln::ones({5})));
  }
}
