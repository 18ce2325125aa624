// Linear: parameters, PyTorch's default initialisation, forward and printing.
#include "kiln/nn/linear.h"

#include "kiln/nn/functional.h"
#include "kiln/nn/layer_util.h"

namespace kiln::nn {

namespace F = functional;
using detail::default_init;

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
         ", out_features=" + std::to_string(options.out_features()) + ", bias=" + (options.bias() ? "True" : "False");
}

}  // namespace kiln::nn
