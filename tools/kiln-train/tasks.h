#pragma once
// What kiln-train trains: the model, its data, how a batch becomes a loss, and how it is
// evaluated. Vision tasks (cnn, mlp, resnet18) run on Fashion-MNIST; gpt on a text corpus.
#include <memory>
#include <optional>
#include <utility>
#include <string>

#include <kiln/kiln.h>

#include "options.h"

namespace kiln_train {

struct Evaluation {
  double accuracy = 0;
  int64_t samples = 0;  // evaluated: images, or tokens for the gpt
};

class Task {
 public:
  virtual ~Task() = default;
  virtual kiln::nn::Module& model() = 0;
  virtual kiln::data::DataLoader& train_loader() = 0;
  // The loss of one batch (mean over its samples), recorded for backward.
  virtual kiln::Tensor loss(const kiln::data::Batch& batch) = 0;
  // Accuracy on the held-out split, in eval mode and (unless --eval-no-grad false) under no_grad.
  virtual Evaluation evaluate() = 0;
  // Something to show at the end (gpt: a generated sample); empty for vision.
  virtual std::string sample() { return ""; }
  virtual int64_t samples_per_batch(const kiln::data::Batch& b) const { return b.size(); }
  // The mean and standard deviation of one batch of training inputs as the model receives them
  // (after the loader's transforms); std::nullopt where inputs are not values (token ids).
  virtual std::optional<std::pair<double, double>> input_stats() { return std::nullopt; }
};

std::unique_ptr<Task> make_task(const Options& o);
// The training loader's sampling: shuffled, drop_last, and under a launcher this rank's shard of
// each epoch (a DistributedSampler over the dataset's `n` samples).
kiln::data::LoaderOptions train_loader_options(const Options& o, int64_t n);
// The device --device resolved to (after validate()).
inline kiln::Device device_of(const Options& o) {
  return o.device == "cuda" ? kiln::Device::cuda(o.cuda_device) : kiln::Device::cpu();
}

}  // namespace kiln_train
