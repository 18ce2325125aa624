// Leaky ReLU on the CPU, forward and fused backward (one pass each; the composite
// where(x > 0, x, slope * x) would take three). Branch-free so the loops vectorize.
#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/kernels/activation.h"

namespace kiln::kernels::cpu {

namespace {
// The math, written once: y = f(x) and dx = g * f'(x).
template <class O> inline O leaky(O x, O slope) { return x > O(0) ? x : x * slope; }
template <class O> inline O leaky_grad(O g, O x, O slope) { return x > O(0) ? g : g * slope; }

// The loop of both kernels: out = f(x), or out = g * f'(x) when g is given.
void leaky_relu_loop(const char* op, const Tensor& out, const Tensor* g, const Tensor& x, double slope) {
  const int64_t n = x.numel();
  dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using O = opmath_t<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* outp = static_cast<T*>(out.data_ptr());
    const O s = static_cast<O>(slope);
    if (g) {
      const T* gp = static_cast<const T*>(g->data_ptr());
#pragma omp parallel for simd schedule(static) if (n >= 32768)
      for (int64_t i = 0; i < n; ++i)
        outp[i] = static_cast<T>(leaky_grad(static_cast<O>(gp[i]), static_cast<O>(xp[i]), s));
    } else {
#pragma omp parallel for simd schedule(static) if (n >= 32768)
      for (int64_t i = 0; i < n; ++i) outp[i] = static_cast<T>(leaky(static_cast<O>(xp[i]), s));
    }
  });
}
}  // namespace

void leaky_relu(const Tensor& y, const Tensor& x, double slope) {
  KILN_CHECK(y.is_contiguous() && x.is_contiguous() && y.dtype() == x.dtype(),
             "leaky_relu: kernel expects contiguous operands of one dtype");
  leaky_relu_loop("leaky_relu", y, nullptr, x, slope);
}
KILN_REGISTER_KERNEL(kernels::leaky_relu, CPU, leaky_relu);

void leaky_relu_backward(const Tensor& dx, const Tensor& g, const Tensor& x, double slope) {
  KILN_CHECK(
      dx.is_contiguous() && g.is_contiguous() && x.is_contiguous() && dx.dtype() == x.dtype() && g.dtype() == x.dtype(),
      "leaky_relu_backward: kernel expects contiguous operands of one dtype");
  leaky_relu_loop("leaky_relu_backward", dx, &g, x, slope);
}
KILN_REGISTER_KERNEL(kernels::leaky_relu_backward, CPU, leaky_relu_backward);

}  // namespace kiln::kernels::cpu
