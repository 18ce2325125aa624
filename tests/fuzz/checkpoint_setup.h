#pragma once
// The run whose checkpoints the checkpoint fuzz target reads, and the seed maker writes.
#include <memory>

#include <kiln/kiln.h>

#include "checkpoint.h"

namespace kiln_fuzz {

struct CheckpointSetup {
  kiln_train::Options options;
  kiln::nn::Sequential model;
  std::unique_ptr<kiln::optim::SGD> optimizer;
  std::unique_ptr<kiln::optim::OneCycleLR> scheduler;
  std::unique_ptr<kiln::optim::EMA> ema;

  CheckpointSetup() {
    model.push_back(std::make_shared<kiln::nn::Linear>(3, 2));
    optimizer = std::make_unique<kiln::optim::SGD>(model.parameters(), kiln::optim::SGDOptions(0.1).momentum(0.9));
    scheduler = std::make_unique<kiln::optim::OneCycleLR>(*optimizer, 0.1, 10);
    ema = std::make_unique<kiln::optim::EMA>(model, 0.9);
  }
};

}  // namespace kiln_fuzz
