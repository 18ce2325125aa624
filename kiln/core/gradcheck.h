#pragma once
// gradcheck: compares autograd's gradients with central finite differences, in float64.
// Every op's test uses it.
#include <functional>
#include <vector>

#include "kiln/core/tensor.h"

namespace kiln {

// fn maps the inputs to one output tensor (any shape). Inputs that require grad must be
// float64 CPU tensors. Checks every element of d(output)/d(input) — the full Jacobian — by
// backpropagating each output element's unit vector. Returns true, or throws kiln::Error
// naming the input, the element, and both values.
bool gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& inputs,
               double eps = 1e-6, double atol = 1e-5, double rtol = 1e-3);

}  // namespace kiln
