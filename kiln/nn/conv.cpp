// Conv1d, Conv2d and ConvTranspose2d: parameters, PyTorch's default initialisation, forward through
// kiln::nn::functional, and printing.
#include "kiln/nn/conv.h"

#include "kiln/nn/functional.h"
#include "kiln/nn/layer_util.h"

namespace kiln::nn {

namespace F = functional;
using detail::default_init;
using detail::pair_str;

Conv2d::Conv2d(const Conv2dOptions& o) : ConvModule("Conv2d", o) {
  KILN_CHECK(o.groups() > 0 && o.in_channels() % o.groups() == 0 && o.out_channels() % o.groups() == 0,
             "Conv2d: in_channels (", o.in_channels(), ") and out_channels (", o.out_channels(),
             ") must be divisible by groups (", o.groups(), ")");
  weight = register_parameter(
      "weight", empty({o.out_channels(), o.in_channels() / o.groups(), o.kernel_size().h, o.kernel_size().w}));
  if (o.bias()) bias = register_parameter("bias", empty({o.out_channels()}));
  reset_parameters();
}

void Conv2d::reset_parameters() { default_init(weight, bias); }

F::Conv2dParams Conv2d::params() const {
  F::Conv2dParams p;
  p.stride = options.stride().list();
  p.padding = options.padding().list();
  p.dilation = options.dilation().list();
  p.groups = options.groups();
  return p;
}

Tensor Conv2d::forward(const Tensor& x) { return F::conv2d(x, weight, bias, params()); }

std::string Conv2d::extra_repr() const {
  std::string s = std::to_string(options.in_channels()) + ", " + std::to_string(options.out_channels()) +
                  ", kernel_size=" + pair_str(options.kernel_size()) + ", stride=" + pair_str(options.stride());
  if (!(options.padding() == Size2(0))) s += ", padding=" + pair_str(options.padding());
  if (!(options.dilation() == Size2(1))) s += ", dilation=" + pair_str(options.dilation());
  if (options.groups() != 1) s += ", groups=" + std::to_string(options.groups());
  if (!options.bias()) s += ", bias=False";
  return s;
}

Conv1d::Conv1d(const Conv1dOptions& o) : ConvModule("Conv1d", o) {
  KILN_CHECK(o.groups() > 0 && o.in_channels() % o.groups() == 0 && o.out_channels() % o.groups() == 0,
             "Conv1d: in_channels (", o.in_channels(), ") and out_channels (", o.out_channels(),
             ") must be divisible by groups (", o.groups(), ")");
  weight = register_parameter("weight", empty({o.out_channels(), o.in_channels() / o.groups(), o.kernel_size()}));
  if (o.bias()) bias = register_parameter("bias", empty({o.out_channels()}));
  default_init(weight, bias);
}

Tensor Conv1d::forward(const Tensor& x) {
  return F::conv1d(x, weight, bias, options.stride(), options.padding(), options.dilation(), options.groups());
}

std::string Conv1d::extra_repr() const {
  return std::to_string(options.in_channels()) + ", " + std::to_string(options.out_channels()) + ", kernel_size=(" +
         std::to_string(options.kernel_size()) + ",), stride=(" + std::to_string(options.stride()) + ",)" +
         (options.bias() ? "" : ", bias=False");
}

ConvTranspose2d::ConvTranspose2d(const ConvTranspose2dOptions& o) : ConvModule("ConvTranspose2d", o) {
  KILN_CHECK(o.groups() > 0 && o.in_channels() % o.groups() == 0 && o.out_channels() % o.groups() == 0,
             "ConvTranspose2d: channels must be divisible by groups (", o.groups(), ")");
  weight = register_parameter(
      "weight", empty({o.in_channels(), o.out_channels() / o.groups(), o.kernel_size().h, o.kernel_size().w}));
  if (o.bias()) bias = register_parameter("bias", empty({o.out_channels()}));
  // PyTorch computes fan_in from weight.size(1) * k * k for transposed convs too.
  default_init(weight, bias);
}

Tensor ConvTranspose2d::forward(const Tensor& x) {
  F::ConvTranspose2dParams p;
  p.stride = options.stride().list();
  p.padding = options.padding().list();
  p.output_padding = options.output_padding().list();
  p.dilation = options.dilation().list();
  p.groups = options.groups();
  return F::conv_transpose2d(x, weight, bias, p);
}

std::string ConvTranspose2d::extra_repr() const {
  return std::to_string(options.in_channels()) + ", " + std::to_string(options.out_channels()) +
         ", kernel_size=" + pair_str(options.kernel_size()) + ", stride=" + pair_str(options.stride()) +
         (options.bias() ? "" : ", bias=False");
}

}  // namespace kiln::nn
