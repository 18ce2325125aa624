// The stateless layers (Dropout, Flatten, Unflatten, Upsample, MaxPool2d, AvgPool2d): forward
// through kiln::nn::functional, and printing.
#include "kiln/nn/activation.h"

#include "kiln/nn/functional.h"
#include "kiln/nn/layer_util.h"

namespace kiln::nn {

namespace F = functional;
using detail::pair_str;

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
  else s = "size=" + tuple(options.size(), [](int64_t v) { return std::to_string(v); });
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
