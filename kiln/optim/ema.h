#pragma once
// Exponential moving average of a model's weights: shadow = decay * shadow +
// (1 - decay) * param after each optimizer step; evaluate with the averaged weights swapped in.
//
//   kiln::optim::EMA ema(model, 0.999);
//   ... opt.step(); ema.update();
//   { auto swap = ema.average_parameters(); evaluate(model); }   // originals restored after
#include <vector>

#include "kiln/nn/module.h"

namespace kiln::optim {

class EMA {
 public:
  // Tracks every floating parameter and buffer of `model` (BatchNorm running statistics are
  // averaged too, so the swapped-in model is self-consistent).
  EMA(nn::Module& model, double decay);
  // One update; call after each optimizer step. The first `warmup` updates use a smaller decay,
  // min(decay, (1 + n) / (10 + n)), so the average is not dominated by the random init.
  void update();
  double decay() const { return decay_; }
  int64_t num_updates() const { return updates_; }
  bool warmup() const { return warmup_; }
  void set_warmup(bool on) { warmup_ = on; }

  // RAII: copies the averages into the model, and the originals back when destroyed.
  class Swap {
   public:
    explicit Swap(EMA& ema);
    ~Swap();
    Swap(const Swap&) = delete;
    Swap& operator=(const Swap&) = delete;

   private:
    EMA& ema_;
    std::vector<Tensor> saved_;
  };
  Swap average_parameters() { return Swap(*this); }
  // Copies the averages into the model permanently.
  void copy_to_model();

  // For checkpoints: "ema.<name>" -> shadow tensor, and the update count.
  nn::StateDict state_dict() const;
  void load_state_dict(const nn::StateDict& dict);

 private:
  nn::Module& model_;
  double decay_;
  bool warmup_ = true;
  int64_t updates_ = 0;
  std::vector<std::string> names_;
  std::vector<Tensor> live_;    // the model's tensors (same handles)
  std::vector<Tensor> shadow_;  // their averages
};

}  // namespace kiln::optim
