#pragma once
// What the layer files of kiln/nn share (internal): PyTorch's default initialisation of Linear and
// Conv weights, and the tuple spellings of their printed options.
#include <cmath>
#include <string>

#include "kiln/core/tensor.h"
#include "kiln/nn/init.h"
#include "kiln/nn/options.h"

namespace kiln::nn::detail {

inline std::string pair_str(const Size2& s) { return "(" + std::to_string(s.h) + ", " + std::to_string(s.w) + ")"; }
// A shape as a Python tuple: (64,) or (2, 3).
inline std::string shape_str(const IntList& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}
// PyTorch's default for Linear and Conv: kaiming_uniform_(w, a=sqrt(5)) and b ~ U(+-1/sqrt(fan_in)).
inline void default_init(Tensor& weight, Tensor& bias) {
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    double bound = 1.0 / std::sqrt(static_cast<double>(init::fans(weight).first));
    init::uniform_(bias, -bound, bound);
  }
}

}  // namespace kiln::nn::detail
