// Rank programs of tests/distributed/test_ddp.cpp. Each rank trains a DDP replica on its slice of
// a global batch and, in the same process, a single-process reference model on the whole batch;
// gradients and parameters must agree with the reference and across ranks.
#include <kiln/kiln.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kiln/distributed/parallel/data_parallel.h"
#include "kiln/distributed/distributed.h"
#include "tests/distributed/worker/scenario.h"
#include "tests/distributed/worker/training_util.h"

namespace {

using namespace kiln_test;  // Args, Batch, Net, NetConfig, Tensor
using kiln::distributed::DistributedDataParallel;
using kiln::distributed::DistributedDataParallelOptions;

constexpr uint64_t kSeed = 1234;
constexpr double kRtol = 1e-5;

// A Net of `config` whose parameters are drawn after manual_seed(seed).
std::shared_ptr<Net> seeded_net(const NetConfig& config, uint64_t seed = kSeed) {
  kiln::manual_seed(seed);
  return std::make_shared<Net>(config);
}

std::vector<Tensor> buffer_copies(const kiln::nn::Module& m) {
  kiln::NoGradGuard ng;
  std::vector<Tensor> out;
  for (const auto& b : m.buffers()) out.push_back(b.clone());
  return out;
}

void load_buffers(kiln::nn::Module& m, const std::vector<Tensor>& values) {
  kiln::NoGradGuard ng;
  auto bufs = m.buffers();
  for (size_t i = 0; i < bufs.size(); ++i) bufs[i].copy_(values[i]);
}

void expect_grads_match(const Net& model, const Net& ref, const std::string& when) {
  auto mine = model.named_parameters();
  auto theirs = ref.named_parameters();
  for (size_t i = 0; i < mine.size(); ++i) {
    const Tensor& g = mine[i].second.grad();
    const Tensor& r = theirs[i].second.grad();
    const std::string what = when + ", gradient of " + mine[i].first;
    if (!r.defined()) {
      KILN_EXPECT(!g.defined(), what, ": the reference has none, DDP has one");
      continue;
    }
    KILN_EXPECT(g.defined(), what, ": DDP left it undefined");
    kiln_test::expect_close(g, r, kRtol, what);
  }
}

}  // namespace

// Args: model=mlp|bn|unused|branch|swapped, steps, accum (micro-batches per step, all but the
// last under no_sync), rows (per rank and micro-batch), cap_bytes (bucket cap, also the first
// bucket), view=0|1 (gradient_as_bucket_view), find_unused=0|1, extra_micro (model=branch:
// the micro-batch in which rank 0 uses `extra`; -1, the default: all of them).
KILN_SCENARIO("ddp_train") {
  Args a(args);
  kiln::distributed::init_process_group("gloo");
  const int world = kiln::distributed::world_size();
  const int rank = kiln::distributed::rank();
  const std::string model_name = a.str("model", "mlp");
  const NetConfig config = kiln_test::net_config(model_name);
  const int64_t steps = a.integer("steps", 3);
  const int64_t accum = a.integer("accum", 1);
  const int64_t rows = a.integer("rows", 4);
  const double cap_bytes = a.real("cap_bytes", 0);

  auto ref = seeded_net(config);
  // Other ranks start elsewhere: DDP must copy rank 0's parameters.
  auto model = seeded_net(config, kSeed + static_cast<uint64_t>(rank));
  // model=branch: `extra` takes part on rank 0 only (in micro-batch extra_micro, or all).
  const int64_t extra_micro = a.integer("extra_micro", -1);
  const auto extra_active = [&](int r, int64_t k) {
    return model_name != "branch" || (r == 0 && (extra_micro < 0 || k == extra_micro));
  };

  auto group = std::make_shared<kiln_test::RecordingGroup>(kiln::distributed::default_group());
  DistributedDataParallelOptions options;
  options.find_unused_parameters(a.integer("find_unused", 0) != 0).gradient_as_bucket_view(a.integer("view", 0) != 0);
  if (cap_bytes > 0) options.bucket_cap_mb(cap_bytes / (1 << 20)).first_bucket_mb(cap_bytes / (1 << 20));
  DistributedDataParallel ddp(model, options, group);
  KILN_EXPECT(kiln::equal(kiln_test::flat_parameters(*model), kiln_test::flat_parameters(*ref)),
              "after construction every rank holds rank 0's parameters");
  if (cap_bytes > 0) KILN_EXPECT(ddp.bucket_indices().size() > 1, "a tiny bucket cap makes several buckets");

  kiln::optim::AdamW opt(ddp.parameters(), kiln::optim::AdamWOptions(1e-2));
  kiln::optim::AdamW ref_opt(ref->parameters(), kiln::optim::AdamWOptions(1e-2));
  // BatchNorm's statistics and the rank-dependent branch are per rank, so their reference is the
  // mean of the per-slice gradients (what DDP computes by definition); the others use the full
  // batch at once.
  const bool per_slice_reference = config.batch_norm || config.extra;

  for (int64_t step = 0; step < steps; ++step) {
    const Batch batch = kiln_test::global_batch(rows * accum * world, config, 100 + step);
    const auto slice = [&](int64_t r, int64_t k) { return batch.rows((r * accum + k) * rows, rows); };

    opt.zero_grad();
    for (int64_t k = 0; k < accum; ++k) {
      const Batch b = slice(rank, k);
      model->use_extra = extra_active(rank, k);
      if (k + 1 < accum) {
        auto guard = ddp.no_sync();
        const uint64_t before = group->sequence_number();
        Tensor loss = kiln::mse_loss(ddp.forward(b.x), b.y) / static_cast<double>(accum);
        loss.backward();
        KILN_EXPECT(group->sequence_number() == before, "step ", step, " micro-batch ", k, ": no_sync issued ",
                    group->sequence_number() - before, " collectives");
      } else {
        Tensor loss = kiln::mse_loss(ddp.forward(b.x), b.y) / static_cast<double>(accum);
        loss.backward();
      }
    }

    ref_opt.zero_grad();
    if (!per_slice_reference) {
      Tensor loss = kiln::mse_loss(ref->forward(batch.x), batch.y);
      loss.backward();
    } else {
      // Rank 0's buffers are the ones every rank starts the next forward from.
      const std::vector<Tensor> start = buffer_copies(*ref);
      std::vector<Tensor> after_rank0, after_mine;
      for (int s = 0; s < world; ++s) {
        load_buffers(*ref, start);
        for (int64_t k = 0; k < accum; ++k) {
          const Batch b = slice(s, k);
          ref->use_extra = extra_active(s, k);
          Tensor loss = kiln::mse_loss(ref->forward(b.x), b.y) / static_cast<double>(world * accum);
          loss.backward();
        }
        if (s == 0) after_rank0 = buffer_copies(*ref);
        if (s == rank) after_mine = buffer_copies(*ref);
      }
      load_buffers(*ref, after_rank0);
      if (config.batch_norm) {
        auto mine = model->named_buffers();
        for (size_t i = 0; i < mine.size(); ++i)
          kiln_test::expect_close(mine[i].second, after_mine[i], kRtol,
                                  "step " + std::to_string(step) + ", buffer " + mine[i].first);
      }
    }
    expect_grads_match(*model, *ref, "step " + std::to_string(step));
    if (options.gradient_as_bucket_view()) {
      // The gradients are views into their bucket: one storage per bucket.
      const auto params = model->parameters();
      for (const auto& bucket : ddp.bucket_indices()) {
        std::shared_ptr<kiln::Storage> storage;
        for (size_t i : bucket) {
          const Tensor& g = params[i].grad();
          if (!g.defined()) continue;  // no rank used it
          if (!storage) storage = g.storage();
          KILN_EXPECT(g.storage() == storage, "gradient_as_bucket_view: parameter ", i,
                      "'s gradient is not in its bucket");
        }
      }
    }
    opt.step();
    ref_opt.step();
  }
  kiln_test::expect_close(kiln_test::flat_parameters(*model), kiln_test::flat_parameters(*ref), kRtol,
                          "parameters after " + std::to_string(steps) + " AdamW steps");
  kiln_test::expect_same_on_all_ranks(kiln_test::flat_parameters(*model), "parameters after training");
  KILN_EXPECT(ddp.buckets_rebuilt(), "the buckets are rebuilt after the first iteration");
  kiln::distributed::destroy_process_group();
}

// fc2 is registered before fc1, so the initial buckets (reverse registration order) put fc1
// first while backward produces fc2's gradients first: fc2's bucket must wait for fc1's. After
// the first iteration the buckets follow the observed order and fc2's goes first.
KILN_SCENARIO("ddp_bucket_order") {
  kiln::distributed::init_process_group("gloo");
  const int rank = kiln::distributed::rank();
  const NetConfig config = kiln_test::net_config("swapped");
  auto model = seeded_net(config);
  auto group = std::make_shared<kiln_test::RecordingGroup>(kiln::distributed::default_group());
  // 100 bytes: fc1 (weight 512 B + bias 64 B) and fc2 (256 B + 16 B) land in one bucket each.
  const double cap = 100.0 / (1 << 20);
  DistributedDataParallel ddp(model, DistributedDataParallelOptions().bucket_cap_mb(cap).first_bucket_mb(cap), group);
  // named_parameters: fc2.weight 0, fc2.bias 1, fc1.weight 2, fc1.bias 3
  using Buckets = std::vector<std::vector<size_t>>;
  KILN_EXPECT((ddp.bucket_indices() == Buckets{{3, 2}, {1, 0}}), "initial buckets in reverse order");
  const int64_t fc1_numel = 16 * 8 + 16, fc2_numel = 4 * 16 + 4;

  const auto all_reduces_of_one_step = [&](int64_t step) {
    const Batch b = kiln_test::global_batch(4 * kiln::distributed::world_size(), config, 7 + step).rows(rank * 4, 4);
    group->calls.clear();
    Tensor loss = kiln::mse_loss(ddp.forward(b.x), b.y);
    loss.backward();
    std::vector<int64_t> sizes;
    for (const auto& c : group->calls)
      if (c.op == "all_reduce") sizes.push_back(c.numel);
    return sizes;
  };
  auto first = all_reduces_of_one_step(0);
  KILN_EXPECT((first == std::vector<int64_t>{fc1_numel, fc2_numel}),
              "iteration 1 launches fc1's bucket, then fc2's (bucket order, not readiness)");
  KILN_EXPECT(ddp.buckets_rebuilt(), "rebuilt after the first iteration");
  const Buckets rebuilt = ddp.bucket_indices();
  KILN_EXPECT(rebuilt.size() == 2 && rebuilt[0].size() == 2 && rebuilt[0][0] <= 1 && rebuilt[0][1] <= 1,
              "after the rebuild fc2 (indices 0, 1) comes first");
  // Overlap: when the first of fc1's gradients arrives (fc1's bucket is still incomplete), fc2's
  // bucket has been launched already - during backward, not after it.
  int64_t launched_before_fc1 = -1;
  for (Tensor* p : {&model->fc1->weight, &model->fc1->bias}) {
    p->register_post_accumulate_grad_hook([&](Tensor&) {
      if (launched_before_fc1 >= 0) return;
      launched_before_fc1 = 0;
      for (const auto& c : group->calls) launched_before_fc1 += c.op == "all_reduce";
    });
  }
  auto second = all_reduces_of_one_step(1);
  KILN_EXPECT((second == std::vector<int64_t>{fc2_numel, fc1_numel}), "iteration 2 launches fc2's bucket first");
  KILN_EXPECT(launched_before_fc1 == 1, "fc2's bucket is launched while backward still runs (", launched_before_fc1,
              " all-reduces before fc1's gradient)");
  kiln_test::expect_same_on_all_ranks(kiln_test::flat_parameters(*model), "parameters");
  for (const auto& p : model->parameters()) kiln_test::expect_same_on_all_ranks(p.grad().reshape({-1}), "gradients");
  kiln::distributed::destroy_process_group();
}

// A parameter that never gets a gradient, without find_unused_parameters: an Error naming it
// and the option, on every rank, at the end of backward and again at the next forward.
KILN_SCENARIO("ddp_unused_error") {
  kiln::distributed::init_process_group("gloo");
  const NetConfig config = kiln_test::net_config("unused");
  auto model = seeded_net(config);
  DistributedDataParallel ddp(model);
  const Batch b = kiln_test::global_batch(4, config, 3);
  const std::string message = kiln_test::error_of([&] { kiln::mse_loss(ddp.forward(b.x), b.y).backward(); });
  KILN_EXPECT(!message.empty(), "backward with an unused parameter must throw");
  KILN_EXPECT(
      message.find("'unused.weight'") != std::string::npos && message.find("'unused.bias'") != std::string::npos,
      "the error names the parameters: ", message);
  KILN_EXPECT(message.find("find_unused_parameters(true)") != std::string::npos,
              "the error names the option: ", message);
  const std::string again = kiln_test::error_of([&] { ddp.forward(b.x); });
  KILN_EXPECT(again.find("'unused.weight'") != std::string::npos, "the next forward raises the same error");
  kiln::distributed::destroy_process_group();
}

// Rank 1 builds another model: construction fails on every rank with an Error naming the
// parameter and what each rank has. Args: kind=shape|count.
KILN_SCENARIO("ddp_mismatch") {
  Args a(args);
  kiln::distributed::init_process_group("gloo");
  const int rank = kiln::distributed::rank();
  const std::string kind = a.str("kind", "shape");
  NetConfig config;
  if (rank == 1 && kind == "shape") config.hidden = 17;
  if (rank == 1 && kind == "count") config.unused = true;
  auto model = std::make_shared<Net>(config);
  const std::string message = kiln_test::error_of([&] { DistributedDataParallel ddp(model); });
  KILN_EXPECT(!message.empty(), "DDP over different models must throw");
  if (kind == "shape") {
    KILN_EXPECT(message.find("parameter 0 ('fc1.weight'") != std::string::npos &&
                    message.find("rank 0 has float32 [16, 8]") != std::string::npos &&
                    message.find("rank 1 has float32 [17, 8]") != std::string::npos,
                "the error names the parameter and both shapes: ", message);
  } else {
    KILN_EXPECT(message.find("rank 0 has 4 parameters") != std::string::npos &&
                    message.find("rank 1 has 6 parameters") != std::string::npos,
                "the error names the counts: ", message);
  }
  kiln::distributed::destroy_process_group();
}

// A measurement, not a check (run by hand: kiln-run or spawn it with a long deadline): mean time
// of forward + backward of a deeper MLP on this rank's rows (a) alone, (b) followed by one
// blocking all-reduce of every gradient, (c) under DDP, whose bucket all-reduces start during
// backward. Args: layers, width, rows, iters, cap_mb.
KILN_SCENARIO("ddp_overlap") {
  Args a(args);
  kiln::distributed::init_process_group("gloo");
  const int64_t layers = a.integer("layers", 6), width = a.integer("width", 512);
  const int64_t rows = a.integer("rows", 64), iters = a.integer("iters", 10);
  kiln::manual_seed(kSeed);
  auto model = std::make_shared<kiln::nn::Sequential>();
  for (int64_t l = 0; l < layers; ++l) {
    model->push_back(std::make_shared<kiln::nn::Linear>(width, width));
    model->push_back(std::make_shared<kiln::nn::ReLU>());
  }
  const Tensor x = kiln::randn({rows, width}), y = kiln::randn({rows, width});
  using clock = std::chrono::steady_clock;
  const auto time = [&](const std::function<void()>& body) {
    body();  // warm-up (and DDP's bucket rebuild)
    kiln::distributed::barrier();
    const auto t0 = clock::now();
    for (int64_t i = 0; i < iters; ++i) body();
    return std::chrono::duration<double, std::milli>(clock::now() - t0).count() / static_cast<double>(iters);
  };
  const double alone = time([&] {
    model->zero_grad();
    kiln::mse_loss(model->forward(x), y).backward();
  });
  const double after = time([&] {
    model->zero_grad();
    kiln::mse_loss(model->forward(x), y).backward();
    std::vector<Tensor> grads;
    for (const auto& p : model->parameters()) grads.push_back(p.grad().reshape({-1}));
    Tensor flat = kiln::cat(grads, 0);
    kiln::distributed::all_reduce(flat, kiln::distributed::ReduceOp::Avg);
  });
  DistributedDataParallel ddp(model, DistributedDataParallelOptions().bucket_cap_mb(a.real("cap_mb", 25)));
  const double overlapped = time([&] {
    ddp.zero_grad();
    kiln::mse_loss(ddp.forward(x), y).backward();
  });
  if (kiln::distributed::rank() == 0) {
    std::printf(
        "ddp_overlap: %lld params in %zu buckets, %d ranks: fwd+bwd %.2f ms, "
        "+ all-reduce after %.2f ms, DDP %.2f ms\n",
        static_cast<long long>(model->parameter_count()), ddp.bucket_indices().size(), kiln::distributed::world_size(),
        alone, after, overlapped);
  }
  kiln::distributed::destroy_process_group();
}

// `extra` takes part on rank 0 only, without find_unused_parameters: the other ranks raise the
// Error naming it at the end of backward and leave; rank 0, whose bucket went out alone, gets an
// Error from the collective when they are gone - no rank hangs.
KILN_SCENARIO("ddp_unused_on_some_ranks") {
  kiln::distributed::init_process_group("gloo");
  const int rank = kiln::distributed::rank();
  const NetConfig config = kiln_test::net_config("branch");
  auto model = seeded_net(config);
  model->use_extra = rank == 0;
  DistributedDataParallel ddp(model);
  const Batch b = kiln_test::global_batch(4, config, 3);
  const std::string message = kiln_test::error_of([&] { kiln::mse_loss(ddp.forward(b.x), b.y).backward(); });
  if (rank == 0) {
    KILN_EXPECT(message.find("DistributedDataParallel: the all-reduce of gradient bucket 0 of 1 "
                             "failed") != std::string::npos,
                "rank 0's all-reduce must fail once its peers left: ", message);
  } else {
    KILN_EXPECT(message.find("'extra.weight'") != std::string::npos &&
                    message.find("find_unused_parameters(true)") != std::string::npos,
                "the error names the parameter and the option: ", message);
  }
  std::printf("rank %d: %s\n", rank, message.c_str());
  kiln::distributed::destroy_process_group();
}
