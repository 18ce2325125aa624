#pragma once
#include "kiln/nn/module.h"
#include "kiln/nn/options.h"

namespace kiln::nn {

struct BatchNormOptions {
  BatchNormOptions(int64_t num_features) : num_features_(num_features) {}  // NOLINT
  KILN_ARG(int64_t, num_features);
  KILN_ARG(double, eps) = 1e-5;
  KILN_ARG(double, momentum) = 0.1;
  KILN_ARG(bool, affine) = true;
  KILN_ARG(bool, track_running_stats) = true;
};

// Batch normalisation over [N, C] / [N, C, L] (1d) or [N, C, H, W] (2d): batch statistics in
// training (running statistics updated with momentum), running statistics in eval. Followed by a
// ReLU in a Sequential or a declared chain, nn::fuse runs the two as one fused op.
class BatchNorm : public Module {
 public:
  BatchNorm(const BatchNormOptions& options, const char* type_name, std::initializer_list<int64_t> ranks);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  void reset_running_stats();
  // What forward() does before normalising: counts a training batch in num_batches_tracked and
  // returns whether batch statistics are used (training, or no running statistics). A fused
  // module that runs this layer's normalisation inside a bigger op (nn::ConvBatchNormReLU2d)
  // calls it once per forward, so the layer's state evolves as if it ran itself.
  bool count_batch();

  BatchNormOptions options;
  Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 private:
  // Checks x's rank and channels, counts the batch; returns whether batch statistics are used.
  bool begin_forward(const Tensor& x);
  std::vector<int64_t> ranks_;
};

class BatchNorm1d : public BatchNorm {
 public:
  BatchNorm1d(const BatchNormOptions& options) : BatchNorm(options, "BatchNorm1d", {2, 3}) {}  // NOLINT
};

class BatchNorm2d : public BatchNorm {
 public:
  BatchNorm2d(const BatchNormOptions& options) : BatchNorm(options, "BatchNorm2d", {4}) {}  // NOLINT
};

struct LayerNormOptions {
  LayerNormOptions(IntList normalized_shape) : normalized_shape_(std::move(normalized_shape)) {}  // NOLINT
  KILN_ARG(IntList, normalized_shape);
  KILN_ARG(double, eps) = 1e-5;
  KILN_ARG(bool, elementwise_affine) = true;
  KILN_ARG(bool, bias) = true;  // with elementwise_affine: a learnable bias beside the weight
};

class LayerNorm : public Module {
 public:
  LayerNorm(const LayerNormOptions& options);                     // NOLINT
  LayerNorm(int64_t dim) : LayerNorm(LayerNormOptions({dim})) {}  // NOLINT
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  LayerNormOptions options;
  Tensor weight, bias;
};

class GroupNorm : public Module {
 public:
  GroupNorm(int64_t num_groups, int64_t num_channels, double eps = 1e-5, bool affine = true);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  int64_t num_groups, num_channels;
  double eps;
  Tensor weight, bias;
};

class RMSNorm : public Module {
 public:
  RMSNorm(IntList normalized_shape, double eps = 1e-6, bool elementwise_affine = true);
  RMSNorm(int64_t dim) : RMSNorm(IntList{dim}) {}  // NOLINT
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  IntList normalized_shape;
  double eps;
  Tensor weight;
};

}  // namespace kiln::nn
