#pragma once
// Pointwise math, written once for both backends (docs/architecture.md, "Kernels and dispatch"). Each functor computes
// in T = opmath type (float for the 16-bit dtypes, else the dtype itself); the CPU loops in kernels/cpu and the CUDA
// kernels in kernels/cuda only differ in how they launch these.
#include <cmath>
#include <type_traits>

#include "kiln/core/macros.h"
#include "kiln/kernels/math/fast_math.h"

namespace kiln::math {

// The float and double overloads of the math functions, visible unqualified here (and ahead of
// kiln's tensor ops of the same names): <cmath>'s on the host, CUDA's global ones under nvcc.
#if defined(__CUDACC__)
using ::cos;
using ::erf;
using ::exp;
using ::expm1;
using ::log;
using ::pow;
using ::sin;
using ::sqrt;
using ::tanh;
#else
using std::cos;
using std::erf;
using std::exp;
using std::expm1;
using std::log;
using std::pow;
using std::sin;
using std::sqrt;
using std::tanh;
#endif

// ---- unary
struct Neg {
  template <class T> KILN_INLINE T operator()(T x) const { return -x; }
};
struct Exp {
  template <class T> KILN_INLINE T operator()(T x) const { return exp_(x); }
};
struct Log {
  template <class T> KILN_INLINE T operator()(T x) const { return log(x); }
};
struct Sqrt {
  template <class T> KILN_INLINE T operator()(T x) const { return sqrt(x); }
};
struct Rsqrt {
  template <class T> KILN_INLINE T operator()(T x) const { return T(1) / sqrt(x); }
};
struct Abs {
  template <class T> KILN_INLINE T operator()(T x) const {
    if constexpr (std::is_unsigned_v<T>) return x;
    else return x < T(0) ? -x : x;
  }
};
struct Erf {
  template <class T> KILN_INLINE T operator()(T x) const { return erf(x); }
};
struct Tanh {
  template <class T> KILN_INLINE T operator()(T x) const { return tanh(x); }
};
struct Sin {
  template <class T> KILN_INLINE T operator()(T x) const { return sin(x); }
};
struct Cos {
  template <class T> KILN_INLINE T operator()(T x) const { return cos(x); }
};
// e^x - 1 without the cancellation of exp(x) - 1 near 0; expm1(-inf) = -1, expm1(-0) = -0
struct Expm1 {
  template <class T> KILN_INLINE T operator()(T x) const { return expm1(x); }
};
struct Square {
  template <class T> KILN_INLINE T operator()(T x) const { return x * x; }
};
struct Reciprocal {
  template <class T> KILN_INLINE T operator()(T x) const { return T(1) / x; }
};
struct Sign {
  template <class T> KILN_INLINE T operator()(T x) const {
    if constexpr (std::is_unsigned_v<T>) return T(x != T(0));
    else return T((T(0) < x) - (x < T(0)));
  }
};
// `x <= 0 ? 0 : x`, not `x > 0 ? x : 0`: a NaN passes through, as torch.relu (docs/guide.md, "NaN and Inf").
struct Relu {
  template <class T> KILN_INLINE T operator()(T x) const { return x <= T(0) ? T(0) : x; }
};

struct Sigmoid {
  template <class T> KILN_INLINE T operator()(T x) const { return T(1) / (T(1) + exp_(-x)); }
};

// x * sigmoid(x)
struct Silu {
  template <class T> KILN_INLINE T operator()(T x) const { return x / (T(1) + exp_(-x)); }
};

// GELU, exact form: x * Phi(x) = x * 0.5 * (1 + erf(x / sqrt(2))). This is the fused GELU of
// docs/guide.md, speed-up 18: one read, one write instead of five passes.
struct GeluErf {
  template <class T> KILN_INLINE T operator()(T x) const {
    return x * T(0.5) * (T(1) + gelu_erf_(x * T(0.70710678118654752440)));
  }
};

// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
// Computed as x * sigmoid(2 inner), which equals 0.5 x (1 + tanh(inner)): no tanh call (a scalar
// library call on the CPU; exp_ vectorizes) and no cancellation in 1 + tanh for negative x.
struct GeluTanh {
  template <class T> KILN_INLINE T operator()(T x) const {
    T inner = T(0.79788456080286535588) * (x + T(0.044715) * x * x * x);
    return x / (T(1) + exp_(T(-2) * inner));
  }
};

// ---- unary with scalar parameters (a, b)
struct PowScalar {
  double a;
  template <class T> KILN_INLINE T operator()(T x) const {
    if constexpr (!std::is_floating_point_v<T>) {  // integer base, non-negative integer exponent
      T r = 1;
      for (long long e = static_cast<long long>(a); e > 0; --e) r *= x;
      return r;
    }
    if (a == 2.0) return x * x;
    if (a == 1.0) return x;
    if (a == 0.5) return sqrt(x);
    return pow(x, T(a));
  }
};
struct Clamp {
  double lo, hi;
  template <class T> KILN_INLINE T operator()(T x) const {
    T l = T(lo), h = T(hi);
    return x != x ? x : (x < l ? l : (x > h ? h : x));  // NaN passes through
  }
};
struct AddScalar {
  double a;
  template <class T> KILN_INLINE T operator()(T x) const { return x + T(a); }
};
struct MulScalar {
  double a;
  template <class T> KILN_INLINE T operator()(T x) const { return x * T(a); }
};
struct RSubScalar {
  double a;
  template <class T> KILN_INLINE T operator()(T x) const { return T(a) - x; }
};
struct RDivScalar {
  double a;
  template <class T> KILN_INLINE T operator()(T x) const { return T(a) / x; }
};
struct RPowScalar {
  double a;
  template <class T> KILN_INLINE T operator()(T x) const { return pow(T(a), x); }
};

// ---- predicates (bool result)
struct IsNan {
  template <class T> KILN_INLINE bool operator()(T x) const { return x != x; }
};
struct IsInf {
  template <class T> KILN_INLINE bool operator()(T x) const { return x == x && (x - x) != (x - x); }
};
struct IsFinite {
  template <class T> KILN_INLINE bool operator()(T x) const { return (x - x) == (x - x); }
};
struct LogicalNot {
  template <class T> KILN_INLINE bool operator()(T x) const { return !(x != T(0)); }
};

// ---- binary
struct Add {
  double alpha;
  template <class T> KILN_INLINE T operator()(T x, T y) const { return alpha == 1.0 ? x + y : x + T(alpha) * y; }
};
struct Sub {
  double alpha;
  template <class T> KILN_INLINE T operator()(T x, T y) const { return alpha == 1.0 ? x - y : x - T(alpha) * y; }
};
struct Mul {
  template <class T> KILN_INLINE T operator()(T x, T y) const { return x * y; }
};
struct Div {
  template <class T> KILN_INLINE T operator()(T x, T y) const { return x / y; }
};
struct Pow {
  template <class T> KILN_INLINE T operator()(T x, T y) const { return pow(x, y); }
};
struct Maximum {
  template <class T> KILN_INLINE T operator()(T x, T y) const { return (x != x || x > y) ? x : y; }
};
struct Minimum {
  template <class T> KILN_INLINE T operator()(T x, T y) const { return (x != x || x < y) ? x : y; }
};

// ---- fused backward formulas: (g, saved) -> dL/dx
struct ReluBackward {  // saved = y; PyTorch's threshold_backward: a NaN output lets g through
  template <class T> KILN_INLINE T operator()(T g, T y) const { return y <= T(0) ? T(0) : g; }
};
struct SigmoidBackward {  // saved = y
  template <class T> KILN_INLINE T operator()(T g, T y) const { return g * y * (T(1) - y); }
};
struct TanhBackward {  // saved = y
  template <class T> KILN_INLINE T operator()(T g, T y) const { return g * (T(1) - y * y); }
};
struct GeluErfBackward {  // saved = x: Phi(x) + x * phi(x)
  template <class T> KILN_INLINE T operator()(T g, T x) const {
    T cdf = T(0.5) * (T(1) + gelu_erf_(x * T(0.70710678118654752440)));
    T pdf = T(0.39894228040143267794) * exp_(T(-0.5) * x * x);
    return g * (cdf + x * pdf);
  }
};
struct GeluTanhBackward {  // saved = x; with s = sigmoid(2 inner): s + 2 x s (1 - s) inner'
  template <class T> KILN_INLINE T operator()(T g, T x) const {
    const T k = T(0.79788456080286535588), c = T(0.044715);
    T x2 = x * x;
    T s = T(1) / (T(1) + exp_(T(-2) * k * (x + c * x2 * x)));
    T dinner = k * (T(1) + T(3) * c * x2);
    return g * (s + T(2) * x * s * (T(1) - s) * dinner);
  }
};
struct SiluBackward {  // saved = x: s * (1 + x * (1 - s))
  template <class T> KILN_INLINE T operator()(T g, T x) const {
    T s = T(1) / (T(1) + exp_(-x));
    return g * s * (T(1) + x * (T(1) - s));
  }
};
struct ClampBackward {  // saved = x; gradient flows where lo <= x <= hi
  double lo, hi;
  template <class T> KILN_INLINE T operator()(T g, T x) const { return (x >= T(lo) && x <= T(hi)) ? g : T(0); }
};

// ---- comparisons (bool result)
struct Eq {
  template <class T> KILN_INLINE bool operator()(T x, T y) const { return x == y; }
};
struct Ne {
  template <class T> KILN_INLINE bool operator()(T x, T y) const { return x != y; }
};
struct Lt {
  template <class T> KILN_INLINE bool operator()(T x, T y) const { return x < y; }
};
struct Le {
  template <class T> KILN_INLINE bool operator()(T x, T y) const { return x <= y; }
};
struct Gt {
  template <class T> KILN_INLINE bool operator()(T x, T y) const { return x > y; }
};
struct Ge {
  template <class T> KILN_INLINE bool operator()(T x, T y) const { return x >= y; }
};
struct LogicalAnd {
  template <class T> KILN_INLINE bool operator()(T x, T y) const { return (x != T(0)) && (y != T(0)); }
};
struct LogicalOr {
  template <class T> KILN_INLINE bool operator()(T x, T y) const { return (x != T(0)) || (y != T(0)); }
};

}  // namespace kiln::math
