#include "kiln/nn/fused/linear_gelu.h"

#include "kiln/nn/functional.h"

namespace kiln::nn {

LinearGELU::LinearGELU(std::shared_ptr<Linear> linear_layer, std::shared_ptr<GELU> gelu_layer)
    : Module("LinearGELU"), linear(std::move(linear_layer)), gelu(std::move(gelu_layer)) {
  KILN_CHECK(linear && gelu, type_name(), ": the Linear and the GELU must be given");
  register_module("linear", linear);
  register_module("gelu", gelu);
}

Tensor LinearGELU::forward(const Tensor& x) {
  return functional::linear_gelu(x, linear->weight, linear->bias, gelu->approximate);
}

}  // namespace kiln::nn
