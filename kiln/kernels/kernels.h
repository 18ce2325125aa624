#pragma once
// The raw compute interface: no autograd, no allocation policy beyond what each op needs.
// Every function checks the device of its operands and runs the CPU or the CUDA backend.
// Pointwise math lives in kiln/kernels/math/ as __host__ __device__ functors used by both.
#include <cstdint>

#include "kiln/core/tensor.h"

namespace kiln::kernels {

enum class UnaryOp : uint8_t {
  Neg, Exp, Log, Sqrt, Rsqrt, Abs, Tanh, Sigmoid, Relu, GeluErf, GeluTanh, Silu, Square,
  Reciprocal, Sign,
  PowScalar,   // x^a
  Clamp,       // min(max(x, a), b)
  AddScalar,   // x + a
  MulScalar,   // x * a
  RSubScalar,  // a - x
  RDivScalar,  // a / x
  RPowScalar,  // a^x
  Erf,
  // predicates: output dtype bool
  IsNan, IsInf, IsFinite, LogicalNot,
};

enum class BinaryOp : uint8_t {
  Add,        // a + alpha * b
  Sub,        // a - alpha * b
  Mul, Div, Pow, Maximum, Minimum,
  // fused backward formulas g = a, (x or y) = b
  ReluBackward,      // g * (y > 0)
  SigmoidBackward,   // g * y * (1 - y)
  TanhBackward,      // g * (1 - y^2)
  GeluErfBackward,   // g * gelu'(x)
  GeluTanhBackward,  // g * gelu_tanh'(x)
  SiluBackward,      // g * silu'(x)
  ClampBackward,     // g * (lo <= x <= hi), lo = alpha, hi = beta
  // comparisons: output dtype bool
  Eq, Ne, Lt, Le, Gt, Ge, LogicalAnd, LogicalOr,
};

bool is_predicate(UnaryOp op);
bool is_comparison(BinaryOp op);
const char* op_name(UnaryOp op);
const char* op_name(BinaryOp op);

// out = op(in); `out` has in's shape (or in broadcasts to it). Dtypes: in and out share one,
// except predicates which write bool. a, b are the op's scalar parameters.
void unary(UnaryOp op, const Tensor& out, const Tensor& in, double a = 0, double b = 0);
// out = op(x, y) with x, y broadcast to out's shape; x and y share a dtype.
void binary(BinaryOp op, const Tensor& out, const Tensor& x, const Tensor& y, double alpha = 1,
            double beta = 0);
// out = cond ? x : y
void where(const Tensor& out, const Tensor& cond, const Tensor& x, const Tensor& y);

// dst = src (broadcast), converting dtype; both may be strided and on different devices.
void copy(const Tensor& dst, const Tensor& src, bool non_blocking = false);
void fill(const Tensor& dst, double value);

// Philox random numbers: uniform [0,1), standard normal, or integers in [low, high).
void fill_uniform(const Tensor& dst, uint64_t seed, uint64_t offset);
void fill_normal(const Tensor& dst, uint64_t seed, uint64_t offset);
void fill_randint(const Tensor& dst, int64_t low, int64_t high, uint64_t seed, uint64_t offset);

enum class ReduceOp : uint8_t { Sum, Mean, Max, Min, Prod };
// Reduces `in` over `dims` into out (shape of in with dims set to 1 or removed, contiguous).
void reduce(ReduceOp op, const Tensor& out, const Tensor& in, const IntList& dims);
// Index of the max/min along one dim; out is int64.
void arg_reduce(bool is_max, const Tensor& values, const Tensor& indices, const Tensor& in,
                int64_t dim);

// C = A @ B for 2-D (or batched 3-D) operands; any strides; dtype shared.
void matmul(const Tensor& c, const Tensor& a, const Tensor& b);

// Along the last dimension of a contiguous tensor.
void softmax(const Tensor& out, const Tensor& in, bool log);
// grad_in = y * (g - sum(g*y))  or  g - exp(y) * sum(g)  (log)
void softmax_backward(const Tensor& grad_in, const Tensor& grad_out, const Tensor& out, bool log);

}  // namespace kiln::kernels
