// Linear, convolution, normalisation, embedding and the stateless layers: parameters,
// PyTorch's default initialisation, forward through kiln::nn::functional, and printing.
#include <cmath>
#include <sstream>

#include "kiln/core/autograd.h"
#include "kiln/nn/activation.h"
#include "kiln/nn/conv.h"
#include "kiln/nn/embedding.h"
#include "kiln/nn/functional.h"
#include "kiln/nn/init.h"
#include "kiln/nn/linear.h"
#include "kiln/nn/normalization.h"

namespace kiln::nn {

namespace F = functional;

namespace {
std::string pair_str(const Size2& s) {
  return "(" + std::to_string(s.h) + ", " + std::to_string(s.w) + ")";
}
// A shape as a Python tuple: (64,) or (2, 3).
std::string shape_str(const IntList& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}
// PyTorch's default for Linear and Conv: kaiming_uniform_(w, a=sqrt(5)) and b ~ U(+-1/sqrt(fan_in)).
void default_init(Tensor& weight, Tensor& bias) {
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    double bound = 1.0 / std::sqrt(static_cast<double>(init::fans(weight).first));
    init::uniform_(bias, -bound, bound);
  }
}
}  // namespace

// ---------------------------------------------------------------- Linear

Linear::Linear(const LinearOptions& o) : Module("Linear"), options(o) {
  KILN_CHECK(o.in_features() > 0 && o.out_features() > 0, "Linear: feature counts must be positive, got ",
             o.in_features(), " and ", o.out_features());
  weight = register_parameter("weight", empty({o.out_features(), o.in_features()}));
  if (o.bias()) bias = register_parameter("bias", empty({o.out_features()}));
  reset_parameters();
}

void Linear::reset_parameters() { default_init(weight, bias); }

Tensor Linear::forward(const Tensor& x) { return F::linear(x, weight, bias); }

std::string Linear::extra_repr() const {
  return "in_features=" + std::to_string(options.in_features()) +
         ", out_features=" + std::to_string(options.out_features()) +
         ", bias=" + (options.bias() ? "True" : "False");
}

// ---------------------------------------------------------------- convolutions

Conv2d::Conv2d(const Conv2dOptions& o) : ConvModule("Conv2d", o) {
  KILN_CHECK(o.groups() > 0 && o.in_channels() % o.groups() == 0 && o.out_channels() % o.groups() == 0,
             "Conv2d: in_channels (", o.in_channels(), ") and out_channels (", o.out_channels(),
             ") must be divisible by groups (", o.groups(), ")");
  weight = register_parameter("weight", empty({o.out_channels(), o.in_channels() / o.groups(),
                                               o.kernel_size().h, o.kernel_size().w}));
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
  return std::to_string(options.in_channels()) + ", " + std::to_string(options.out_channels()) +
         ", kernel_size=(" + std::to_string(options.kernel_size()) + ",), stride=(" +
         std::to_string(options.stride()) + ",)" + (options.bias() ? "" : ", bias=False");
}

ConvTranspose2d::ConvTranspose2d(const ConvTranspose2dOptions& o) : ConvModule("ConvTranspose2d", o) {
  KILN_CHECK(o.groups() > 0 && o.in_channels() % o.groups() == 0 && o.out_channels() % o.groups() == 0,
             "ConvTranspose2d: channels must be divisible by groups (", o.groups(), ")");
  weight = register_parameter("weight", empty({o.in_channels(), o.out_channels() / o.groups(),
                                               o.kernel_size().h, o.kernel_size().w}));
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

// ---------------------------------------------------------------- normalisation

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
  auto* bn = options.fused_relu() ? &F::batch_norm_relu : &F::batch_norm;
  return bn(x, running_mean, running_var, weight, bias, use_batch_stats, options.momentum(), options.eps());
}

std::string BatchNorm::extra_repr() const {
  std::ostringstream os;
  os << options.num_features() << ", eps=" << float_repr(options.eps()) << ", momentum=" << float_repr(options.momentum())
     << ", affine=" << (options.affine() ? "True" : "False")
     << ", track_running_stats=" << (options.track_running_stats() ? "True" : "False");
  if (options.fused_relu()) os << ", fused_relu=True";
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

std::string GroupNorm::extra_repr() const {
  return std::to_string(num_groups) + ", " + std::to_string(num_channels);
}

RMSNorm::RMSNorm(IntList shape, double e, bool affine) : Module("RMSNorm"), normalized_shape(std::move(shape)), eps(e) {
  if (affine) weight = register_parameter("weight", ones(normalized_shape));
}

Tensor RMSNorm::forward(const Tensor& x) { return F::rms_norm(x, normalized_shape, weight, eps); }

std::string RMSNorm::extra_repr() const {
  return shape_str(normalized_shape) + ", eps=" + float_repr(eps) +
         ", elementwise_affine=" + (weight.defined() ? "True" : "False");
}

// ---------------------------------------------------------------- embedding

Embedding::Embedding(int64_t n, int64_t d) : Module("Embedding"), num_embeddings(n), embedding_dim(d) {
  KILN_CHECK(n > 0 && d > 0, "Embedding: sizes must be positive, got ", n, " and ", d);
  weight = register_parameter("weight", empty({n, d}));
  init::normal_(weight);
}

Tensor Embedding::forward(const Tensor& indices) { return kiln::embedding(weight, indices); }

std::string Embedding::extra_repr() const {
  return std::to_string(num_embeddings) + ", " + std::to_string(embedding_dim);
}

// ---------------------------------------------------------------- stateless layers

Dropout::Dropout(double p) : Module("Dropout"), p(p) {
  KILN_CHECK(p >= 0.0 && p <= 1.0, "Dropout: p must be in [0, 1], got ", p);
}

std::string Flatten::extra_repr() const {
  return "start_dim=" + std::to_string(start_dim) + ", end_dim=" + std::to_string(end_dim);
}

std::string Unflatten::extra_repr() const {
  std::string s = "dim=" + std::to_string(dim) + ", unflattened_size=(";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + (sizes.size() == 1 ? ",)" : ")");
}

std::string Upsample::extra_repr() const {
  std::string s;
  auto tuple = [](const auto& v, auto str) {
    if (v.size() == 1) return str(v[0]);
    std::string t = "(";
    for (size_t i = 0; i < v.size(); ++i) t += (i ? ", " : "") + str(v[i]);
    return t + ")";
  };
  if (!options.scale_factor().empty())
    s = "scale_factor=" + tuple(options.scale_factor(), [](double v) { return float_repr(v); });
  else
    s = "size=" + tuple(options.size(), [](int64_t v) { return std::to_string(v); });
  return s + ", mode='" + options.mode() + "'";
}

std::string Pool2d::extra_repr() const {
  return "kernel_size=" + pair_str(options.kernel_size()) + ", stride=" + pair_str(options.stride()) +
         ", padding=" + pair_str(options.padding());
}

Tensor MaxPool2d::forward(const Tensor& x) {
  return F::max_pool2d(x, options.kernel_size().list(), options.stride().list(), options.padding().list());
}

Tensor AvgPool2d::forward(const Tensor& x) {
  return F::avg_pool2d(x, options.kernel_size().list(), options.stride().list(), options.padding().list());
}

std::string AdaptiveAvgPool2d::extra_repr() const { return "output_size=" + pair_str(output_size); }

}  // namespace kiln::nn
