// linspace and full_like.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <string>

#include "kiln/core/autograd.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"

namespace kiln {

// ---------------------------------------------------------------- creation

Tensor linspace(double start, double end, int64_t steps, const TensorOptions& opts) {
  KILN_CHECK(steps >= 0, "linspace: number of steps must be non-negative, got ", steps);
  Tensor host = empty({steps}, TensorOptions().dtype(DType::F64));
  auto* p = host.data_ptr<double>();
  if (steps == 1) p[0] = start;
  if (steps > 1) {
    // from both ends, as PyTorch, so that the last value is exactly `end`
    const double step = (end - start) / static_cast<double>(steps - 1);
    const int64_t half = steps / 2;
    for (int64_t i = 0; i < steps; ++i)
      p[i] = i < half ? start + step * static_cast<double>(i) : end - step * static_cast<double>(steps - 1 - i);
  }
  Tensor t = host.to(opts.device(), opts.dtype());
  if (opts.requires_grad()) t.requires_grad_(true);
  return t;
}

Tensor full_like(const Tensor& t, double value, const TensorOptions& opts) {
  TensorOptions o = t.options();
  if (opts.has_dtype()) o.dtype(opts.dtype());
  o.requires_grad(opts.requires_grad());
  return full(t.sizes(), value, o);
}

}  // namespace kiln
