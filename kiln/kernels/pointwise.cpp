// The names of the pointwise ops, for errors and profiles.
#include "kiln/kernels/pointwise.h"

namespace kiln::kernels {

const char* op_name(UnaryOp op) {
  static const char* names[] = {
      "neg",       "exp",  "log",    "sqrt",       "rsqrt", "abs",   "tanh",  "sigmoid",  "relu",       "gelu",
      "gelu_tanh", "silu", "square", "reciprocal", "sign",  "pow",   "clamp", "add",      "mul",        "rsub",
      "rdiv",      "rpow", "erf",    "sin",        "cos",   "isnan", "isinf", "isfinite", "logical_not"};
  return names[static_cast<int>(op)];
}

const char* op_name(BinaryOp op) {
  static const char* names[] = {"add",
                                "sub",
                                "mul",
                                "div",
                                "pow",
                                "maximum",
                                "minimum",
                                "relu_backward",
                                "sigmoid_backward",
                                "tanh_backward",
                                "gelu_backward",
                                "gelu_tanh_backward",
                                "silu_backward",
                                "clamp_backward",
                                "eq",
                                "ne",
                                "lt",
                                "le",
                                "gt",
                                "ge",
                                "logical_and",
                                "logical_or"};
  return names[static_cast<int>(op)];
}

bool is_predicate(UnaryOp op) { return op >= UnaryOp::IsNan; }
bool is_comparison(BinaryOp op) { return op >= BinaryOp::Eq; }

}  // namespace kiln::kernels
