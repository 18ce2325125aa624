#pragma once
// The unary pointwise ops, each declared once, as one row (docs/architecture.md, "Ops declared
// once"): what PyTorch splits over native_functions.yaml and derivatives.yaml. Everything else is
// made from the rows: the `UnaryOp` enum, the op names, the dtype rule and the kernel table
// (kiln/kernels/pointwise.h, op_table.h), the recorded backward and the function bodies
// (kiln/ops/pointwise.cpp), and the declarations of the functions and Tensor methods
// (kiln/core/tensor.h). Adding a unary op is its row here, its functor in
// kiln/kernels/math/pointwise.h (named as the row's Op) and its tests.
//
//   X(Op, name, Types, Scalars, Api, Node, Keeps, Fused, Formula)
//
// Op       the UnaryOp enumerator, and the kiln::math functor of the same name both backends run
// name     the name in errors and profiles (op_name), and of the function Api makes
// Types    the dtypes it computes in: Floating (f32, f64, f16, bf16; integer and bool input is
//          computed in f32), Numeric (every dtype but bool, computed in the input's), Predicate
//          (every dtype; the output is bool and carries no gradient)
// Scalars  how many scalar parameters (a, b) the functor takes: 0, 1 or 2
// Api      Method: kiln::name(x) and x.name(); Function: kiln::name(x) only; Custom: no generated
//          entry point (a hand-written one in kiln/ops takes other arguments, or none: internal)
// Node     the autograd node's name (nullptr with NoGrad)
// Keeps    what the backward keeps: Input (named x in Formula), Output (named y) or Nothing;
//          NoGrad (predicates): no node is recorded
// Fused    the BinaryOp that computes Formula from (g, kept, a, b) in one pass, run in a plain
//          backward; None: Formula always runs
// Formula  the gradient dL/dx as differentiable ops of g (dL/dy), the kept x or y and a, b; it
//          runs under create_graph (autograd::fused_or_composite), so it has derivatives itself
//
// The rows' order carries no meaning. (Helpers a Formula calls, gelu_grad, silu_grad and
// unary_raw, are in kiln/ops/pointwise.cpp.)

// clang-format off
#define KILN_UNARY_OPS(X)                                                                                                                                    \
  /* Op          name         Types      Scalars Api     Node                  Keeps    Fused                          Formula */                            \
  X(Neg,         neg,         Numeric,   0,      Method, "NegBackward",        Nothing, None,                          -g)                                   \
  X(Exp,         exp,         Floating,  0,      Method, "ExpBackward",        Output,  None,                          g * y)                                \
  X(Log,         log,         Floating,  0,      Method, "LogBackward",        Input,   None,                          g / x)                                \
  X(Sqrt,        sqrt,        Floating,  0,      Method, "SqrtBackward",       Output,  None,                          g / (y * 2.0))                        \
  X(Rsqrt,       rsqrt,       Floating,  0,      Method, "RsqrtBackward",      Output,  None,                          g * y * y * y * -0.5)                 \
  X(Abs,         abs,         Numeric,   0,      Method, "AbsBackward",        Input,   None,                          g * unary_raw(UnaryOp::Sign, x))      \
  X(Tanh,        tanh,        Floating,  0,      Method, "TanhBackward",       Output,  BinaryOp::TanhBackward,        g * (1.0 - y * y))                    \
  X(Sigmoid,     sigmoid,     Floating,  0,      Method, "SigmoidBackward",    Output,  BinaryOp::SigmoidBackward,     g * y * (1.0 - y))                    \
  /* relu's mask is !(y <= 0), as the fused kernel's: a NaN output passes the gradient */                                                                   \
  X(Relu,        relu,        Numeric,   0,      Method, "ReluBackward",       Output,  BinaryOp::ReluBackward,        g * logical_not(y <= 0.0).to(g.dtype())) \
  X(GeluErf,     gelu,        Floating,  0,      Custom, "GeluBackward",       Input,   BinaryOp::GeluErfBackward,     gelu_grad(g, x, false))               \
  X(GeluTanh,    gelu_tanh,   Floating,  0,      Custom, "GeluBackward",       Input,   BinaryOp::GeluTanhBackward,    gelu_grad(g, x, true))                \
  X(Silu,        silu,        Floating,  0,      Method, "SiluBackward",       Input,   BinaryOp::SiluBackward,        silu_grad(g, x))                      \
  X(Square,      square,      Numeric,   0,      Custom, "SquareBackward",     Input,   None,                          g * x * 2.0)                          \
  X(Reciprocal,  reciprocal,  Floating,  0,      Custom, "ReciprocalBackward", Output,  None,                          -(g * y * y))                         \
  X(Sign,        sign,        Numeric,   0,      Custom, "SignBackward",       Nothing, None,                          zeros_like(g))                        \
  /* x^a; kiln::pow(x, a) computes integer x in f32 unless a is a non-negative integer */                                                                   \
  X(PowScalar,   pow,         Numeric,   1,      Custom, "PowBackward",        Input,   None,                          a == 2.0 ? g * x * 2.0 : g * pow(x, a - 1.0) * a) \
  X(Clamp,       clamp,       Numeric,   2,      Custom, "ClampBackward",      Input,   BinaryOp::ClampBackward,       g * ((x >= a) * (x <= b)).to(g.dtype())) \
  X(AddScalar,   add,         Numeric,   1,      Custom, "AddBackward",        Nothing, None,                          g)                                    \
  X(MulScalar,   mul,         Numeric,   1,      Custom, "MulBackward",        Nothing, None,                          g * a)                                \
  X(RSubScalar,  rsub,        Numeric,   1,      Custom, "RsubBackward",       Nothing, None,                          -g)                                   \
  X(RDivScalar,  rdiv,        Floating,  1,      Custom, "RdivBackward",       Input,   None,                          -(g * a) / (x * x))                   \
  X(RPowScalar,  rpow,        Floating,  1,      Custom, "PowBackward",        Output,  None,                          g * y * std::log(a))                  \
  X(Erf,         erf,         Floating,  0,      Function, "ErfBackward",      Input,   None,                          g * exp(x * x * -1.0) * 1.12837916709551257390) \
  X(Sin,         sin,         Floating,  0,      Method, "SinBackward",        Input,   None,                          g * cos(x))                           \
  X(Cos,         cos,         Floating,  0,      Method, "CosBackward",        Input,   None,                          -(g * sin(x)))                        \
  X(Expm1,       expm1,       Floating,  0,      Method, "Expm1Backward",      Output,  None,                          g * (y + 1.0))                        \
  X(IsNan,       isnan,       Predicate, 0,      Function, nullptr,            NoGrad,  None,                          none)                                 \
  X(IsInf,       isinf,       Predicate, 0,      Function, nullptr,            NoGrad,  None,                          none)                                 \
  X(IsFinite,    isfinite,    Predicate, 0,      Function, nullptr,            NoGrad,  None,                          none)                                 \
  X(LogicalNot,  logical_not, Predicate, 0,      Function, nullptr,            NoGrad,  None,                          none)
// clang-format on

// The declarations Api asks for, expanded in kiln/core/tensor.h: KILN_UNARY_OPS(KILN_UNARY_DECLARE_FUNCTION) at
// namespace scope, KILN_UNARY_OPS(KILN_UNARY_DECLARE_METHOD) inside class Tensor.
#define KILN_UNARY_DECLARE_FUNCTION(OP, NAME, TYPES, SCALARS, API, ...) KILN_UNARY_FUNCTION_##API(NAME)
#define KILN_UNARY_FUNCTION_Method(NAME) Tensor NAME(const Tensor& a);
#define KILN_UNARY_FUNCTION_Function(NAME) Tensor NAME(const Tensor& a);
#define KILN_UNARY_FUNCTION_Custom(NAME)
#define KILN_UNARY_DECLARE_METHOD(OP, NAME, TYPES, SCALARS, API, ...) KILN_UNARY_METHOD_##API(NAME)
#define KILN_UNARY_METHOD_Method(NAME) Tensor NAME() const;
#define KILN_UNARY_METHOD_Function(NAME)
#define KILN_UNARY_METHOD_Custom(NAME)
