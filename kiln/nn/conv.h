#pragma once
#include "kiln/nn/functional.h"
#include "kiln/nn/module.h"
#include "kiln/nn/options.h"

namespace kiln::nn {

// The constructor and fields every convolution's options share, `Size` being int64_t (1-D) or
// Size2 (2-D). A macro rather than a base struct: KILN_ARG's setters return the struct they are
// declared in, and a chain such as `ConvTranspose2dOptions(...).stride(2).output_padding(1)`
// must keep the full type.
#define KILN_CONV_OPTIONS(Options, Size)                                                     \
  Options(int64_t in_channels, int64_t out_channels, Size kernel_size)                       \
      : in_channels_(in_channels), out_channels_(out_channels), kernel_size_(kernel_size) {} \
  KILN_ARG(int64_t, in_channels);                                                            \
  KILN_ARG(int64_t, out_channels);                                                           \
  KILN_ARG(Size, kernel_size);                                                               \
  KILN_ARG(Size, stride) = 1;                                                                \
  KILN_ARG(Size, padding) = 0;                                                               \
  KILN_ARG(Size, dilation) = 1;                                                              \
  KILN_ARG(int64_t, groups) = 1;                                                             \
  KILN_ARG(bool, bias) = true

// The members every convolution module has: its options, its weight and its bias (undefined
// without bias).
template <class Options> class ConvModule : public Module {
 public:
  Options options;
  Tensor weight, bias;

 protected:
  ConvModule(const char* type_name, const Options& options) : Module(type_name), options(options) {}
};

struct Conv2dOptions {
  KILN_CONV_OPTIONS(Conv2dOptions, Size2);
};

// [N, C_in, H, W] -> [N, C_out, H', W']; weight [C_out, C_in / groups, kH, kW].
class Conv2d : public ConvModule<Conv2dOptions> {
 public:
  explicit Conv2d(const Conv2dOptions& options);
  Conv2d(int64_t in, int64_t out, int64_t kernel) : Conv2d(Conv2dOptions(in, out, kernel)) {}
  Tensor forward(const Tensor& x) override;
  functional::Conv2dParams params() const;  // stride, padding, dilation, groups for F::conv2d
  std::string extra_repr() const override;
  void reset_parameters();
};

struct Conv1dOptions {
  KILN_CONV_OPTIONS(Conv1dOptions, int64_t);
};

// [N, C_in, L] -> [N, C_out, L'].
class Conv1d : public ConvModule<Conv1dOptions> {
 public:
  explicit Conv1d(const Conv1dOptions& options);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
};

struct ConvTranspose2dOptions {
  KILN_CONV_OPTIONS(ConvTranspose2dOptions, Size2);
  KILN_ARG(Size2, output_padding) = 0;
};

// weight [C_in, C_out / groups, kH, kW]
class ConvTranspose2d : public ConvModule<ConvTranspose2dOptions> {
 public:
  explicit ConvTranspose2d(const ConvTranspose2dOptions& options);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
};

}  // namespace kiln::nn
