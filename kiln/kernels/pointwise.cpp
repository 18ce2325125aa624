// The names of the pointwise ops, for errors and profiles.
#include "kiln/kernels/pointwise.h"

#include <iterator>

namespace kiln::kernels {

const char* op_name(UnaryOp op) {
#define KILN_UNARY_NAME(OP, NAME, ...) #NAME,
  static const char* const names[] = {KILN_UNARY_OPS(KILN_UNARY_NAME)};
#undef KILN_UNARY_NAME
  static_assert(std::size(names) == kUnaryOpCount, "one name per UnaryOp, in the rows' order");
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

bool is_comparison(BinaryOp op) { return op >= BinaryOp::Eq; }

}  // namespace kiln::kernels
