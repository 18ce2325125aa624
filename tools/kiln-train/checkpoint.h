#pragma once
// kiln-train's resumable checkpoints: the model, the optimizer (this rank's share under --zero),
// the LR schedule, the EMA weights, the RNG and where in the run they were written.
#include <cstdint>
#include <string>

#include <kiln/kiln.h>

#include "options.h"

namespace kiln_train {

// Where a run is: what a checkpoint restores besides the tensors.
struct Position {
  int64_t epoch = 0;           // the epoch to run next (or in progress)
  int64_t batch_in_epoch = 0;  // batches of it already trained
  int64_t step = 0;            // optimizer steps so far
  double train_seconds = 0;
  int64_t samples = 0;
};

void save_checkpoint(const std::string& path, const Options& o, kiln::nn::Module& model, kiln::optim::Optimizer& opt,
                     kiln::optim::LRScheduler* sched, kiln::optim::EMA* ema, const Position& pos);

// Restores what save_checkpoint wrote; a kiln::Error names the file and what does not match
// (another model, other settings, not a kiln-train checkpoint, corrupt metadata).
Position load_checkpoint(const std::string& path, const Options& o, kiln::nn::Module& model,
                         kiln::optim::Optimizer& opt, kiln::optim::LRScheduler* sched, kiln::optim::EMA* ema);

// With --zero each rank's checkpoint holds its own share of the optimizer state: rank r > 0
// reads and writes "<name>.rank<r>.safetensors" next to rank 0's file.
std::string rank_path(const Options& o, const std::string& path);

}  // namespace kiln_train
