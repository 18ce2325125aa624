// BatchNorm1d/2d, LayerNorm, GroupNorm and RMSNorm: parameters, running statistics, forward
// through kiln::nn::functional, and printing.
#include "kiln/nn/normalization.h"

#include <sstream>

#include "kiln/core/autograd.h"
#include "kiln/nn/functional.h"
#include "kiln/nn/layer_util.h"

namespace kiln::nn {

namespace F = functional;
using detail::shape_str;

BatchNorm::BatchNorm(const BatchNormOptions& o, const char* type_name, std::initializer_list<int64_t> ranks)
    : Module(type_name), options(o), ranks_(ranks) {
  KILN_CHECK(o.num_features() > 0, type_name, ": num_features must be positive, got ", o.num_features());
  if (o.affine()) {
    weight = register_parameter("weight", ones({o.num_features()}));
    bias = register_parameter("bias", zeros({o.num_features()}));
  }
  if (o.track_running_stats()) {
    running_mean = register_buffer("running_mean", zeros({o.num_features()}));
    running_var = register_buffer("running_var", ones({o.num_features()}));
    num_batches_tracked = register_buffer("num_batches_tracked", zeros({}, DType::I64));
  }
}

void BatchNorm::reset_running_stats() {
  if (!running_mean.defined()) return;
  NoGradGuard ng;
  running_mean.zero_();
  running_var.fill_(1.0);
  num_batches_tracked.zero_();
}

bool BatchNorm::begin_forward(const Tensor& x) {
  bool rank_ok = false;
  for (int64_t r : ranks_) rank_ok = rank_ok || x.dim() == r;
  KILN_CHECK(rank_ok, type_name(), ": expected input with ", ranks_, " dimensions, got sizes ", x.sizes());
  KILN_CHECK(x.size(1) == options.num_features(), type_name(), ": expected ", options.num_features(),
             " channels, got sizes ", x.sizes());
  return count_batch();
}

bool BatchNorm::count_batch() {
  const bool use_batch_stats = is_training() || !running_mean.defined();
  if (is_training() && num_batches_tracked.defined()) {
    NoGradGuard ng;
    num_batches_tracked.add_(1.0);
  }
  return use_batch_stats;
}

Tensor BatchNorm::forward(const Tensor& x) {
  const bool use_batch_stats = begin_forward(x);
  return F::batch_norm(x, running_mean, running_var, weight, bias, use_batch_stats, options.momentum(), options.eps());
}

std::string BatchNorm::extra_repr() const {
  std::ostringstream os;
  os << options.num_features() << ", eps=" << float_repr(options.eps())
     << ", momentum=" << float_repr(options.momentum()) << ", affine=" << (options.affine() ? "True" : "False")
     << ", track_running_stats=" << (options.track_running_stats() ? "True" : "False");
  return os.str();
}

LayerNorm::LayerNorm(const LayerNormOptions& o) : Module("LayerNorm"), options(o) {
  if (o.elementwise_affine()) {
    weight = register_parameter("weight", ones(o.normalized_shape()));
    if (o.bias()) bias = register_parameter("bias", zeros(o.normalized_shape()));
  }
}

Tensor LayerNorm::forward(const Tensor& x) {
  return F::layer_norm(x, options.normalized_shape(), weight, bias, options.eps());
}

std::string LayerNorm::extra_repr() const {
  std::ostringstream os;
  os << shape_str(options.normalized_shape()) << ", eps=" << float_repr(options.eps())
     << ", elementwise_affine=" << (options.elementwise_affine() ? "True" : "False")
     << ", bias=" << (options.bias() ? "True" : "False");
  return os.str();
}

GroupNorm::GroupNorm(int64_t g, int64_t c, double e, bool affine)
    : Module("GroupNorm"), num_groups(g), num_channels(c), eps(e) {
  KILN_CHECK(g > 0 && c % g == 0, "GroupNorm: num_channels (", c, ") must be divisible by num_groups (", g, ")");
  if (affine) {
    weight = register_parameter("weight", ones({c}));
    bias = register_parameter("bias", zeros({c}));
  }
}

Tensor GroupNorm::forward(const Tensor& x) { return F::group_norm(x, num_groups, weight, bias, eps); }

std::string GroupNorm::extra_repr() const { return std::to_string(num_groups) + ", " + std::to_string(num_channels); }

RMSNorm::RMSNorm(IntList shape, double e, bool affine) : Module("RMSNorm"), normalized_shape(std::move(shape)), eps(e) {
  if (affine) weight = register_parameter("weight", ones(normalized_shape));
}

Tensor RMSNorm::forward(const Tensor& x) { return F::rms_norm(x, normalized_shape, weight, eps); }

std::string RMSNorm::extra_repr() const {
  return shape_str(normalized_shape) + ", eps=" + float_repr(eps) +
         ", elementwise_affine=" + (weight.defined() ? "True" : "False");
}

}  // namespace kiln::nn
