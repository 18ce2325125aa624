// kiln-train: the main job. Trains a model-zoo model with every speed-up switchable from the
// command line, evaluates it each epoch, and writes metrics, TensorBoard events, a plot, the
// final model and resumable checkpoints (trainer.h). The last line of stdout is a JSON summary.
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include <kiln/kiln.h>
#include <kiln/utils/utils.h>

#include "options.h"
#include "parallel.h"
#include "tasks.h"
#include "trainer.h"

namespace {

using kiln::Tensor;
using kiln_train::Options;
namespace optim = kiln::optim;
namespace fs = std::filesystem;

// The LR range test on `task`'s model (which it trains: the caller discards or restores it).
optim::LRFinderResult range_test(const Options& o, kiln_train::Task& task) {
  auto& model = task.model();
  auto opt = kiln_train::make_optimizer(o, model.parameters());
  auto& loader = task.train_loader();
  auto it = loader.begin();
  auto step = [&]() {
    if (it == loader.end()) it = loader.begin();
    Tensor loss = task.loss(*it);
    loss.backward();
    opt->step();
    opt->zero_grad();
    ++it;
    return loss.item<double>();
  };
  return optim::lr_range_test(*opt, step);
}

// --find-lr: the LR range test instead of training.
int find_lr(const Options& o, kiln_train::Task& task) {
  const auto r = range_test(o, task);
  fs::create_directories(o.out);
  kiln::utils::CsvWriter csv(o.out + "/lr_find.csv", {"lr", "loss", "smoothed_loss"});
  for (size_t i = 0; i < r.lrs.size(); ++i) csv.write_row({r.lrs[i], r.losses[i], r.smoothed[i]});
  kiln::utils::Series s{"smoothed loss", r.lrs, r.smoothed};
  s.log_x = true;
  kiln::utils::write_line_plot_png(o.out + "/lr_find.png", "LR range test", {s},
                                   kiln::utils::PlotOptions().x_label("learning rate"));
  std::printf(
      "LR range test: %zu steps from %.1e%s; steepest descent at lr = %.3g (try it as --lr, or up to ~10x "
      "it as the max LR of --schedule onecycle)\n",
      r.lrs.size(), r.lrs.front(), r.diverged ? ", stopped at divergence" : "", r.suggested_lr);
  std::printf("wrote %s/lr_find.csv and %s/lr_find.png\n", o.out.c_str(), o.out.c_str());
  std::printf("%s\n", nlohmann::json{{"model", o.model}, {"suggested_lr", r.suggested_lr}}.dump().c_str());
  return 0;
}

// --auto-lr: the range test trains a throwaway model of its own (the data is loaded again, which
// lr_find_seconds leaves out); then the RNG is seeded again, so the model that trains starts
// from the same weights as it would without --auto-lr.
void pick_lr(Options& o) {
  auto probe = kiln_train::make_task(o);
  const auto start = std::chrono::steady_clock::now();
  const auto r = range_test(o, *probe);
  o.lr_find_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  KILN_CHECK(r.suggested_lr > 0, "--auto-lr: the LR range test found no learning rate (the loss diverged after ",
             r.lrs.size(), " steps); pass --lr instead");
  o.lr = r.suggested_lr;
  if (o.rank == 0)
    std::printf("--auto-lr: LR range test of %zu steps in %.1f s; training at its suggestion, lr = %.3g\n",
                r.lrs.size(), o.lr_find_seconds, o.lr);
  kiln::manual_seed(o.seed);
}

int run(Options o) {
  kiln_train::validate(o, kiln::cuda::is_available());
  kiln_train::init_parallel(o);  // under a launcher: joins the job, o.batch_size becomes this rank's share
  if (o.threads > 0) omp_set_num_threads(o.threads);
  // After the thread count: the setting is applied to the OpenMP pool as it is now.
  if (o.flush_denormal) kiln::set_flush_denormal(true);
  KILN_CHECK(!(o.auto_lr && o.distributed), "--auto-lr under a launcher: each rank would pick its own LR from its ",
             "own shard; run kiln-train --find-lr alone first and pass its suggestion as --lr");
  kiln::manual_seed(o.seed);
  if (o.device == "cuda") {
    kiln::cudnn::set_benchmark(o.cudnn_benchmark);
    kiln::cuda::set_allow_tf32(true);
  }
  if (o.auto_lr) pick_lr(o);
  auto task = kiln_train::make_task(o);
  if (o.find_lr) return find_lr(o, *task);
  kiln_train::Trainer trainer(o, std::move(task));
  return trainer.run();
}

}  // namespace

int main(int argc, char** argv) {
  Options o = kiln_train::parse(argc, argv);
  try {
    return run(o);
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "kiln-train: %s\n", e.what());
    return 2;
  }
}
