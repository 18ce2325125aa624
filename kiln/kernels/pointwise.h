#pragma once
// Pointwise kernels: one op enum per arity, mapped by both backends to the shared functors of
// kiln/kernels/math/pointwise.h through kiln/kernels/op_table.h. CPU: kernels/cpu/pointwise.cpp;
// CUDA: kernels/cuda/pointwise.cu. No autograd.
#include <cstdint>

#include "kiln/core/tensor.h"
#include "kiln/kernels/dispatch.h"

namespace kiln::kernels {

enum class UnaryOp : uint8_t {
  Neg,
  Exp,
  Log,
  Sqrt,
  Rsqrt,
  Abs,
  Tanh,
  Sigmoid,
  Relu,
  GeluErf,
  GeluTanh,
  Silu,
  Square,
  Reciprocal,
  Sign,
  PowScalar,   // x^a
  Clamp,       // min(max(x, a), b)
  AddScalar,   // x + a
  MulScalar,   // x * a
  RSubScalar,  // a - x
  RDivScalar,  // a / x
  RPowScalar,  // a^x
  Erf,
  Sin,
  Cos,
  // predicates: output dtype bool
  IsNan,
  IsInf,
  IsFinite,
  LogicalNot,
};

enum class BinaryOp : uint8_t {
  Add,  // a + alpha * b
  Sub,  // a - alpha * b
  Mul,
  Div,
  Pow,
  Maximum,
  Minimum,
  // fused backward formulas g = a, (x or y) = b
  ReluBackward,      // y <= 0 ? 0 : g (a NaN y passes g, as PyTorch)
  SigmoidBackward,   // g * y * (1 - y)
  TanhBackward,      // g * (1 - y^2)
  GeluErfBackward,   // g * gelu'(x)
  GeluTanhBackward,  // g * gelu_tanh'(x)
  SiluBackward,      // g * silu'(x)
  ClampBackward,     // g * (lo <= x <= hi), lo = alpha, hi = beta
  // comparisons: output dtype bool
  Eq,
  Ne,
  Lt,
  Le,
  Gt,
  Ge,
  LogicalAnd,
  LogicalOr,
};

bool is_predicate(UnaryOp op);
bool is_comparison(BinaryOp op);
const char* op_name(UnaryOp op);
const char* op_name(BinaryOp op);

// out = op(in); `out` has in's shape (or in broadcasts to it). Dtypes: in and out share one,
// except predicates which write bool. a, b are the op's scalar parameters (0 when unused).
inline Kernel<void(UnaryOp op, const Tensor& out, const Tensor& in, double a, double b)> unary{"unary"};
// out = op(x, y) with x, y broadcast to out's shape; x and y share a dtype. Add/Sub take
// alpha (a + alpha * b; pass 1 otherwise); ClampBackward takes lo = alpha, hi = beta.
inline Kernel<void(BinaryOp op, const Tensor& out, const Tensor& x, const Tensor& y, double alpha, double beta)> binary{
    "binary"};
// out = cond ? x : y
inline Kernel<void(const Tensor& out, const Tensor& cond, const Tensor& x, const Tensor& y)> where{"where"};

}  // namespace kiln::kernels
