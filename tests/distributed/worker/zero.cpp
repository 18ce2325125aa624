// Rank programs of tests/distributed/test_zero.cpp: ZeRO-1 against plain AdamW on the full batch
// (computed in the same process), its memory per rank, and per-rank checkpoints.
#include <kiln/kiln.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kiln/distributed/distributed.h"
#include "kiln/distributed/parallel/zero_redundancy_optimizer.h"
#include "tests/distributed/worker/scenario.h"
#include "tests/distributed/worker/training_util.h"

namespace {

using namespace kiln_test;  // Args, Batch, Net, NetConfig, Tensor
using kiln::distributed::local_optimizer;
using kiln::optim::AdamW;
using kiln::optim::AdamWOptions;

constexpr uint64_t kSeed = 4321;

// Elements of every optimizer state buffer (exp_avg, exp_avg_sq, master) of `opt`'s parameters.
int64_t state_numel(const kiln::optim::Optimizer& opt) {
  int64_t n = 0;
  for (const Tensor& p : opt.parameters()) {
    const auto* s = opt.state(p);
    if (!s) continue;
    for (const auto& [name, t] : s->buffers())
      if (t.defined()) n += t.numel();
    if (s->master.defined()) n += s->master.numel();
  }
  return n;
}

// One step on this rank's slice of step `step`'s global batch (rows per rank).
void backward_on_slice(Net& model, int64_t step, int64_t rows, const NetConfig& config) {
  const int world = kiln::distributed::world_size();
  const int rank = kiln::distributed::rank();
  const Batch b = kiln_test::global_batch(rows * world, config, 200 + step).rows(rank * rows, rows);
  kiln::mse_loss(model.forward(b.x), b.y).backward();
}

}  // namespace

// ZeRO + AdamW (with a StepLR schedule on the local optimizer) against plain AdamW with the same
// schedule on the full batch's gradients. Args: steps, rows (per rank).
KILN_SCENARIO("zero_matches_adamw") {
  Args a(args);
  kiln::distributed::init_process_group("gloo");
  const int world = kiln::distributed::world_size();
  const int64_t steps = a.integer("steps", 5);
  const int64_t rows = a.integer("rows", 4);
  const NetConfig config;
  kiln::manual_seed(kSeed);
  auto model = std::make_shared<Net>(config);
  kiln::manual_seed(kSeed);
  auto ref = std::make_shared<Net>(config);

  const AdamWOptions options = AdamWOptions(1e-2).weight_decay(0.1);
  kiln::optim::ZeroRedundancyOptimizer zero(model->parameters(), local_optimizer<AdamW>(options));
  AdamW plain(ref->parameters(), options);
  kiln::optim::StepLR sched(zero.local_optimizer(), 2, 0.5);
  kiln::optim::StepLR ref_sched(plain, 2, 0.5);

  for (int64_t step = 0; step < steps; ++step) {
    zero.zero_grad();
    backward_on_slice(*model, step, rows, config);
    zero.step();
    sched.step();

    plain.zero_grad();
    const Batch b = kiln_test::global_batch(rows * world, config, 200 + step);
    kiln::mse_loss(ref->forward(b.x), b.y).backward();
    plain.step();
    ref_sched.step();
    KILN_EXPECT(zero.param_groups()[0].lr() == plain.param_groups()[0].lr(), "the schedule drives ZeRO's lr");
  }
  kiln_test::expect_close(kiln_test::flat_parameters(*model), kiln_test::flat_parameters(*ref), 1e-5,
                          "parameters after " + std::to_string(steps) + " steps");
  kiln_test::expect_same_on_all_ranks(kiln_test::flat_parameters(*model), "parameters");

  // Memory: this rank's state covers its slice only.
  const int64_t total = zero.total_numel();
  const int64_t mine = state_numel(zero.local_optimizer());
  const int64_t full = state_numel(plain);
  KILN_EXPECT(total == model->parameter_count(), "total_numel ", total);
  KILN_EXPECT(zero.owned_numel() == (total + world - 1) / world, "owned ", zero.owned_numel());
  KILN_EXPECT(full == 2 * total, "plain AdamW keeps two moments: ", full);
  KILN_EXPECT(mine == 2 * zero.owned_numel(), "ZeRO keeps two moments of the slice: ", mine);
  KILN_EXPECT(mine * world <= full + 2 * world, "state per rank ", mine, " vs plain ", full);
  kiln::distributed::destroy_process_group();
}

// Train 3 steps, save (parameters + per-rank optimizer state), train 2 more; a fresh model and
// optimizer loaded from the save and trained the same 2 steps end bitwise identical.
KILN_SCENARIO("zero_state_dict_resume") {
  kiln::distributed::init_process_group("gloo");
  const NetConfig config;
  const int64_t rows = 4;
  const AdamWOptions options = AdamWOptions(1e-2);
  kiln::manual_seed(kSeed);
  auto model = std::make_shared<Net>(config);
  kiln::optim::ZeroRedundancyOptimizer zero(model->parameters(), local_optimizer<AdamW>(options));
  const auto train = [&](Net& m, kiln::optim::ZeroRedundancyOptimizer& z, int64_t from, int64_t to) {
    for (int64_t step = from; step < to; ++step) {
      z.zero_grad();
      backward_on_slice(m, step, rows, config);
      z.step();
    }
  };
  train(*model, zero, 0, 3);
  const kiln::nn::StateDict saved_model = [&] {
    kiln::nn::StateDict d;
    kiln::NoGradGuard ng;
    for (const auto& [k, v] : model->state_dict()) d.insert(k, v.clone());
    return d;
  }();
  const kiln::distributed::ZeroStateDict saved = zero.state_dict();
  train(*model, zero, 3, 5);

  kiln::manual_seed(kSeed + 99);  // a different start: everything must come from the save
  auto restored = std::make_shared<Net>(config);
  restored->load_state_dict(saved_model);
  kiln::optim::ZeroRedundancyOptimizer zero2(restored->parameters(), local_optimizer<AdamW>(options));
  zero2.load_state_dict(saved);
  train(*restored, zero2, 3, 5);
  KILN_EXPECT(kiln::equal(kiln_test::flat_parameters(*restored), kiln_test::flat_parameters(*model)),
              "resumed training ends where uninterrupted training does");

  // A state saved by another rank is refused.
  if (kiln::distributed::world_size() > 1) {
    kiln::distributed::ZeroStateDict other = saved;
    other.rank = (other.rank + 1) % other.world_size;
    const std::string message = kiln_test::error_of([&] { zero2.load_state_dict(other); });
    KILN_EXPECT(message.find("saved by rank") != std::string::npos, "loading another rank's state is an Error");
  }
  kiln::distributed::destroy_process_group();
}
