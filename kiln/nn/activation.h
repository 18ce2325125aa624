#pragma once
// Stateless layers: activations, dropout, flatten, pooling, as modules for Sequential models.
#include "kiln/nn/functional.h"
#include "kiln/nn/module.h"
#include "kiln/nn/options.h"

namespace kiln::nn {

class ReLU : public Module {
 public:
  ReLU() : Module("ReLU") {}
  Tensor forward(const Tensor& x) override { return kiln::relu(x); }
};

class GELU : public Module {
 public:
  explicit GELU(std::string approximate = "none") : Module("GELU"), approximate(std::move(approximate)) {}
  Tensor forward(const Tensor& x) override { return kiln::gelu(x, approximate); }
  std::string extra_repr() const override { return "approximate='" + approximate + "'"; }
  std::string approximate;
};

class SiLU : public Module {
 public:
  SiLU() : Module("SiLU") {}
  Tensor forward(const Tensor& x) override { return kiln::silu(x); }
};

class Tanh : public Module {
 public:
  Tanh() : Module("Tanh") {}
  Tensor forward(const Tensor& x) override { return kiln::tanh(x); }
};

class Sigmoid : public Module {
 public:
  Sigmoid() : Module("Sigmoid") {}
  Tensor forward(const Tensor& x) override { return kiln::sigmoid(x); }
};

class LeakyReLU : public Module {
 public:
  explicit LeakyReLU(double negative_slope = 0.01) : Module("LeakyReLU"), negative_slope(negative_slope) {}
  Tensor forward(const Tensor& x) override { return functional::leaky_relu(x, negative_slope); }
  std::string extra_repr() const override { return "negative_slope=" + float_repr(negative_slope); }
  double negative_slope;
};

class Softmax : public Module {
 public:
  explicit Softmax(int64_t dim) : Module("Softmax"), dim(dim) {}
  Tensor forward(const Tensor& x) override { return kiln::softmax(x, dim); }
  std::string extra_repr() const override { return "dim=" + std::to_string(dim); }
  int64_t dim;
};

class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) override { return functional::dropout(x, p, is_training()); }
  std::string extra_repr() const override { return "p=" + float_repr(p) + ", inplace=False"; }
  double p;
};

class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1)
      : Module("Flatten"), start_dim(start_dim), end_dim(end_dim) {}
  Tensor forward(const Tensor& x) override { return x.flatten(start_dim, end_dim); }
  std::string extra_repr() const override;
  int64_t start_dim, end_dim;
};

// Splits dim into `sizes` (one may be -1), as torch.nn.Unflatten: [N, 64] -> [N, 4, 4, 4].
class Unflatten : public Module {
 public:
  Unflatten(int64_t dim, IntList sizes) : Module("Unflatten"), dim(dim), sizes(std::move(sizes)) {}
  Tensor forward(const Tensor& x) override { return x.unflatten(dim, sizes); }
  std::string extra_repr() const override;
  int64_t dim;
  IntList sizes;
};

// F::interpolate as a layer, as torch.nn.Upsample: Upsample(F::InterpolateOptions()
// .scale_factor({2}).mode("bilinear").align_corners(true)).
class Upsample : public Module {
 public:
  explicit Upsample(const functional::InterpolateOptions& options) : Module("Upsample"), options(options) {}
  Tensor forward(const Tensor& x) override { return functional::interpolate(x, options); }
  std::string extra_repr() const override;
  functional::InterpolateOptions options;
};

struct Pool2dOptions {
  Pool2dOptions(Size2 kernel_size) : kernel_size_(kernel_size), stride_(kernel_size) {}  // NOLINT
  KILN_ARG(Size2, kernel_size);
  KILN_ARG(Size2, stride);  // defaults to kernel_size
  KILN_ARG(Size2, padding) = 0;
};

// What MaxPool2d and AvgPool2d share: their options and how they print.
class Pool2d : public Module {
 public:
  std::string extra_repr() const override;
  Pool2dOptions options;

 protected:
  Pool2d(const char* type_name, const Pool2dOptions& options) : Module(type_name), options(options) {}
};

class MaxPool2d : public Pool2d {
 public:
  MaxPool2d(const Pool2dOptions& options) : Pool2d("MaxPool2d", options) {}  // NOLINT
  Tensor forward(const Tensor& x) override;
};

class AvgPool2d : public Pool2d {
 public:
  AvgPool2d(const Pool2dOptions& options) : Pool2d("AvgPool2d", options) {}  // NOLINT
  Tensor forward(const Tensor& x) override;
};

class AdaptiveAvgPool2d : public Module {
 public:
  AdaptiveAvgPool2d(Size2 output_size) : Module("AdaptiveAvgPool2d"), output_size(output_size) {}  // NOLINT
  Tensor forward(const Tensor& x) override { return functional::adaptive_avg_pool2d(x, output_size.list()); }
  std::string extra_repr() const override;
  Size2 output_size;
};

}  // namespace kiln::nn
