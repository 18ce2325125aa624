#pragma once
// Parameter initialisation, in place and without recording autograd, with PyTorch's formulas
// (fan_in / fan_out of a [out, in, k...] weight; gain per nonlinearity).
#include <string>

#include "kiln/core/tensor.h"

namespace kiln::nn::init {

enum class FanMode { FanIn, FanOut };

double calculate_gain(const std::string& nonlinearity, double param = 0.01);
// fan_in = size(1) * receptive field, fan_out = size(0) * receptive field
std::pair<int64_t, int64_t> fans(const Tensor& t);

Tensor& uniform_(Tensor& t, double low = 0.0, double high = 1.0);
Tensor& normal_(Tensor& t, double mean = 0.0, double std = 1.0);
Tensor& constant_(Tensor& t, double value);
Tensor& zeros_(Tensor& t);
Tensor& ones_(Tensor& t);
Tensor& xavier_uniform_(Tensor& t, double gain = 1.0);
Tensor& xavier_normal_(Tensor& t, double gain = 1.0);
// a: the negative slope of the rectifier after this layer (leaky_relu); PyTorch's default layer
// init is kaiming_uniform_(w, a = sqrt(5)), which gives bound = 1 / sqrt(fan_in).
Tensor& kaiming_uniform_(Tensor& t, double a = 0.0, FanMode mode = FanMode::FanIn,
                         const std::string& nonlinearity = "leaky_relu");
Tensor& kaiming_normal_(Tensor& t, double a = 0.0, FanMode mode = FanMode::FanIn,
                        const std::string& nonlinearity = "leaky_relu");
// N(mean, std) restricted to [a, b] (absolute bounds, as torch.nn.init.trunc_normal_): values
// outside are redrawn until every one lies inside. [a, b] must hold a usable share of the mass
// (the draw gives up with an Error after 1000 rounds).
Tensor& trunc_normal_(Tensor& t, double mean = 0.0, double std = 1.0, double a = -2.0, double b = 2.0);
// (Semi-)orthogonal rows or columns from a QR decomposition of a Gaussian matrix, times gain.
Tensor& orthogonal_(Tensor& t, double gain = 1.0);

}  // namespace kiln::nn::init
