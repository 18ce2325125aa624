#pragma once
// A runtime flag as a compile-time one, for kernels whose loops must not test it per element (the
// batch norm kernels' fused ReLU, docs/kernels.md "BatchNorm + ReLU"; CPU and CUDA).
#include <type_traits>

namespace kiln::math {

// Runs f(std::true_type{}) when flag is set, else f(std::false_type{}).
template <class F> void with_flag(bool flag, F&& f) {
  if (flag) f(std::true_type{});
  else f(std::false_type{});
}

}  // namespace kiln::math
