#pragma once
// Linear -> GELU as one module running F::linear_gelu (the bias and the GELU in the GEMM's
// epilogue on CUDA, one bias + GELU kernel after the GEMM on the CPU), with the GELU's
// approximation. It holds the original layers, so parameters and checkpoint keys are theirs;
// nn::fuse builds it from such a chain in a Sequential.
#include <memory>

#include "kiln/nn/activation.h"
#include "kiln/nn/linear.h"

namespace kiln::nn {

class LinearGELU : public Module {
 public:
  LinearGELU(std::shared_ptr<Linear> linear, std::shared_ptr<GELU> gelu);
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<Linear> linear;
  std::shared_ptr<GELU> gelu;
};

}  // namespace kiln::nn
