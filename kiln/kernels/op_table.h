#pragma once
// The one table from op enums to the shared functors and the dtypes each accepts. Both
// backends' launchers visit it. The unary cases are made from the rows of kiln/core/unary_ops.h;
// a binary op is one line here (plus its functor).
//
//   visit_unary(op, a, b, [&](auto functor, auto types) { ... launch ... });
#include <type_traits>

#include "kiln/kernels/copy_fill.h"
#include "kiln/kernels/matmul.h"
#include "kiln/kernels/pointwise.h"
#include "kiln/kernels/reduce.h"
#include "kiln/kernels/softmax.h"
#include "kiln/core/unary_ops.h"
#include "kiln/kernels/math/pointwise.h"

namespace kiln::kernels {

// Which dtypes an op accepts, as types so that a functor is only instantiated for those.
namespace op_types {
struct Floating {};   // f32, f64, f16, bf16
struct Numeric {};    // every dtype but bool
struct Predicate {};  // any input dtype, bool output
}  // namespace op_types

template <class Types> constexpr bool is_predicate_op = std::is_same_v<Types, op_types::Predicate>;

// The element type an op writes for inputs of type T: bool for predicates, else T.
template <class Types, class T> using op_out_t = std::conditional_t<is_predicate_op<Types>, bool, T>;

// One case per row of kiln/core/unary_ops.h: the row's functor, built from its Scalars (a, b),
// and its Types.
// clang-format off
#define KILN_UNARY_FUNCTOR_0(OP) math::OP{}
#define KILN_UNARY_FUNCTOR_1(OP) math::OP{a}
#define KILN_UNARY_FUNCTOR_2(OP) math::OP{a, b}
// clang-format on
#define KILN_UNARY_VISIT_CASE(OP, NAME, TYPES, SCALARS, ...) \
  case UnaryOp::OP: return v(KILN_UNARY_FUNCTOR_##SCALARS(OP), op_types::TYPES{});
template <class V> void visit_unary(UnaryOp op, double a, double b, V&& v) {
  switch (op) { KILN_UNARY_OPS(KILN_UNARY_VISIT_CASE) }
}
#undef KILN_UNARY_VISIT_CASE
#undef KILN_UNARY_FUNCTOR_0
#undef KILN_UNARY_FUNCTOR_1
#undef KILN_UNARY_FUNCTOR_2

template <class V> void visit_binary(BinaryOp op, double alpha, double beta, V&& v) {
  using namespace math;
  switch (op) {
    case BinaryOp::Add: return v(Add{alpha}, op_types::Numeric{});
    case BinaryOp::Sub: return v(Sub{alpha}, op_types::Numeric{});
    case BinaryOp::Mul: return v(Mul{}, op_types::Numeric{});
    case BinaryOp::Div: return v(Div{}, op_types::Floating{});
    case BinaryOp::Pow: return v(Pow{}, op_types::Floating{});
    case BinaryOp::Maximum: return v(Maximum{}, op_types::Numeric{});
    case BinaryOp::Minimum: return v(Minimum{}, op_types::Numeric{});
    case BinaryOp::ReluBackward: return v(ReluBackward{}, op_types::Floating{});
    case BinaryOp::SigmoidBackward: return v(SigmoidBackward{}, op_types::Floating{});
    case BinaryOp::TanhBackward: return v(TanhBackward{}, op_types::Floating{});
    case BinaryOp::GeluErfBackward: return v(GeluErfBackward{}, op_types::Floating{});
    case BinaryOp::GeluTanhBackward: return v(GeluTanhBackward{}, op_types::Floating{});
    case BinaryOp::SiluBackward: return v(SiluBackward{}, op_types::Floating{});
    case BinaryOp::ClampBackward: return v(ClampBackward{alpha, beta}, op_types::Floating{});
    case BinaryOp::Eq: return v(Eq{}, op_types::Predicate{});
    case BinaryOp::Ne: return v(Ne{}, op_types::Predicate{});
    case BinaryOp::Lt: return v(Lt{}, op_types::Predicate{});
    case BinaryOp::Le: return v(Le{}, op_types::Predicate{});
    case BinaryOp::Gt: return v(Gt{}, op_types::Predicate{});
    case BinaryOp::Ge: return v(Ge{}, op_types::Predicate{});
    case BinaryOp::LogicalAnd: return v(LogicalAnd{}, op_types::Predicate{});
    case BinaryOp::LogicalOr: return v(LogicalOr{}, op_types::Predicate{});
  }
}

// Runs f(TypeTag<T>) for the input dtype if the op accepts it (else a clear error).
template <class F> void dispatch_op_types(op_types::Floating, DType dt, const char* name, F&& f) {
  dispatch_floating(dt, name, f);
}
template <class F> void dispatch_op_types(op_types::Numeric, DType dt, const char* name, F&& f) {
  dispatch_numeric(dt, name, f);
}
template <class F> void dispatch_op_types(op_types::Predicate, DType dt, const char* name, F&& f) {
  dispatch_all(dt, name, f);
}

}  // namespace kiln::kernels
