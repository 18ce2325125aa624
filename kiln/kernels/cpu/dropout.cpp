// Dropout on the CPU: out[i] = u_i >= p ? in[i] / (1 - p) : 0, where u_i is the Philox uniform of
// element i (philox::uniform_f(seed, offset, i)) - the same bits a CUDA thread for element i will
// draw, so masks agree across backends and thread counts. The backward of dropout is this kernel
// applied to the gradient with the same (seed, offset): the mask is regenerated, not stored.
#include <cstdint>

#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/core/philox.h"
#include "kiln/kernels/dropout.h"
#include "kiln/kernels/activation.h"

namespace kiln::kernels::cpu {

void dropout(const Tensor& out, const Tensor& in, double p, uint64_t seed, uint64_t offset) {
  KILN_CHECK(out.is_contiguous() && in.is_contiguous() && out.dtype() == in.dtype() &&
                 out.numel() == in.numel(),
             "dropout: kernel expects contiguous operands of one dtype and size, got sizes ",
             in.sizes(), " and ", out.sizes());
  KILN_CHECK(p >= 0.0 && p < 1.0, "dropout: kernel expects 0 <= p < 1, got ", p);
  const int64_t n = in.numel();
  const float pf = static_cast<float>(p);
  dispatch_floating(in.dtype(), "dropout", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using O = opmath_t<T>;
    const O scale = static_cast<O>(1.0 / (1.0 - p));
    const T* ip = static_cast<const T*>(in.data_ptr());
    T* op = static_cast<T*>(out.data_ptr());
#pragma omp parallel for schedule(static) if (n >= 8192)
    for (int64_t i = 0; i < n; ++i) {
      const float u = philox::uniform_f(seed, offset, static_cast<uint64_t>(i));
      op[i] = static_cast<T>(u >= pf ? static_cast<O>(ip[i]) * scale : O(0));
    }
  });
}
KILN_REGISTER_KERNEL(kernels::dropout, CPU, dropout);

}  // namespace kiln::kernels::cpu
