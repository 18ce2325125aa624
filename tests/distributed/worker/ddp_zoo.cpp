// DDP on the model zoo's FashionCNN (conv, BatchNorm, pooling) and a tiny GPT (embeddings,
// attention, LayerNorm, weight tying): N ranks with B/N samples each against one process over the
// same B samples, several AdamW steps, with gradient accumulation under no_sync.
#include <cmath>
#include <optional>

#include "kiln/kiln.h"
#include "tests/distributed/worker/scenario.h"
#include "tests/distributed/worker/training_util.h"

namespace {

using kiln::Tensor;

constexpr double kRtol = 1e-5;

struct ZooBatch {
  Tensor x, y;
};

// In f64: AdamW divides by the gradient's running RMS, so f32 rounding differences between the
// reduction orders of the two runs (sums over ranks vs over micro-batches) would grow into
// parameter differences far above the tolerance where a gradient is tiny.
std::shared_ptr<kiln::nn::Module> make_zoo_model(const std::string& name) {
  std::shared_ptr<kiln::nn::Module> m;
  if (name == "cnn") {
    m = std::make_shared<kiln::nn::models::FashionCNN>();
  } else {
    m = std::make_shared<kiln::nn::models::GPT>(kiln::nn::models::GPTConfig::tiny(11, 8));
  }
  m->to(kiln::DType::F64);
  return m;
}

// The loss of rows [begin, begin + n) of the global batch.
Tensor zoo_loss(kiln::nn::Module& model, const std::string& name, const ZooBatch& b, int64_t begin, int64_t n) {
  Tensor x = b.x.narrow(0, begin, n), y = b.y.narrow(0, begin, n);
  Tensor out = model.forward(x);
  if (name == "cnn") return kiln::nn::functional::cross_entropy(out, y);
  return kiln::nn::functional::cross_entropy(out.reshape({-1, out.size(-1)}), y.reshape({-1}));
}

ZooBatch zoo_batch(const std::string& name, int64_t rows, uint64_t seed) {
  kiln::manual_seed(seed);
  if (name == "cnn") {
    return {kiln::randn({rows, 1, 28, 28}, kiln::TensorOptions().dtype(kiln::DType::F64)),
            (kiln::rand({rows}) * 10.0).to(kiln::DType::I64)};
  }
  return {(kiln::rand({rows, 8}) * 11.0).to(kiln::DType::I64), (kiln::rand({rows, 8}) * 11.0).to(kiln::DType::I64)};
}

}  // namespace

// Args: model=cnn|gpt, steps, accum (micro-batches per step), rows (per rank and micro-batch).
KILN_SCENARIO("ddp_zoo") {
  kiln_test::Args a(args);
  kiln::distributed::init_process_group("gloo");
  const int world = kiln::distributed::world_size();
  const int rank = kiln::distributed::rank();
  const std::string name = a.str("model", "cnn");
  const int64_t steps = a.integer("steps", 3), accum = a.integer("accum", 2), rows = a.integer("rows", 3);

  kiln::manual_seed(77);
  auto ref = make_zoo_model(name);
  kiln::manual_seed(77 + rank);  // DDP must copy rank 0's parameters
  auto model = make_zoo_model(name);
  kiln::distributed::DistributedDataParallel ddp(model);
  kiln::optim::AdamW opt(ddp.parameters(), kiln::optim::AdamWOptions(3e-3));
  kiln::optim::AdamW ref_opt(ref->parameters(), kiln::optim::AdamWOptions(3e-3));

  for (int64_t step = 0; step < steps; ++step) {
    const ZooBatch b = zoo_batch(name, rows * accum * world, 500 + step);
    const auto begin = [&](int64_t r, int64_t k) { return (r * accum + k) * rows; };
    opt.zero_grad();
    for (int64_t k = 0; k < accum; ++k) {
      ddp.before_forward();
      std::optional<kiln::distributed::DistributedDataParallel::NoSyncGuard> guard;
      if (k + 1 < accum) guard.emplace(ddp.no_sync());
      (zoo_loss(*model, name, b, begin(rank, k), rows) / static_cast<double>(accum)).backward();
    }
    // The reference: every rank's micro-batches through one model, each loss weighted so the
    // sum is the mean over the global batch (BatchNorm normalises each micro-batch on its own in
    // both runs, so the slices are the same; GPT's mean over equal slices is the global mean).
    ref_opt.zero_grad();
    for (int s = 0; s < world; ++s)
      for (int64_t k = 0; k < accum; ++k)
        (zoo_loss(*ref, name, b, begin(s, k), rows) / static_cast<double>(world * accum)).backward();
    auto mine = model->named_parameters();
    auto theirs = ref->named_parameters();
    for (size_t i = 0; i < mine.size(); ++i) {
      kiln_test::expect_close(mine[i].second.grad(), theirs[i].second.grad(), kRtol,
                              name + " step " + std::to_string(step) + ", gradient of " + mine[i].first);
    }
    opt.step();
    ref_opt.step();
  }
  kiln_test::expect_close(kiln_test::flat_parameters(*model), kiln_test::flat_parameters(*ref), kRtol,
                          name + ": parameters after " + std::to_string(steps) + " AdamW steps");
  kiln_test::expect_same_on_all_ranks(kiln_test::flat_parameters(*model), name + ": parameters");
  kiln::distributed::destroy_process_group();
}
