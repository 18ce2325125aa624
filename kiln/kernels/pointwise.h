#pragma once
// Pointwise kernels: one op enum per arity, mapped by both backends to the shared functors of
// kiln/kernels/math/pointwise.h through kiln/kernels/op_table.h; the unary ops are the rows of
// kiln/core/unary_ops.h. CPU: kernels/cpu/pointwise.cpp;
// CUDA: kernels/cuda/pointwise.cu. No autograd.
#include <cstddef>
#include <cstdint>

#include "kiln/core/tensor.h"
#include "kiln/core/unary_ops.h"
#include "kiln/kernels/dispatch.h"

namespace kiln::kernels {

// The unary ops, one per row of kiln/core/unary_ops.h (their declaration: names, dtypes, backward).
enum class UnaryOp : uint8_t {
#define KILN_UNARY_ENUMERATOR(OP, ...) OP,
  KILN_UNARY_OPS(KILN_UNARY_ENUMERATOR)
#undef KILN_UNARY_ENUMERATOR
};
#define KILN_UNARY_ONE(...) +1
inline constexpr size_t kUnaryOpCount = 0 KILN_UNARY_OPS(KILN_UNARY_ONE);
#undef KILN_UNARY_ONE

// A unary op's dtype rule, its row's Types column: Floating (f32, f64, f16, bf16; kiln/ops
// computes integer input in f32), Numeric (every dtype but bool), Predicate (every dtype, bool output).
enum class UnaryTypes : uint8_t { Floating, Numeric, Predicate };
constexpr UnaryTypes unary_types(UnaryOp op) {
  switch (op) {
#define KILN_UNARY_TYPES_CASE(OP, NAME, TYPES, ...) \
  case UnaryOp::OP: return UnaryTypes::TYPES;
    KILN_UNARY_OPS(KILN_UNARY_TYPES_CASE)
#undef KILN_UNARY_TYPES_CASE
  }
  return UnaryTypes::Floating;  // not reached: the switch names every op
}
constexpr bool is_predicate(UnaryOp op) { return unary_types(op) == UnaryTypes::Predicate; }

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
