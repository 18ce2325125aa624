#pragma once
// Argument helpers shared by the functional conv and pooling ops (internal).
#include "kiln/core/error.h"
#include "kiln/core/shape.h"

namespace kiln::nn::functional::detail {

// {a} -> {a, a}; {a, b} stays; anything else is an error naming the op.
inline IntList pair_arg(const char* op, const char* what, const IntList& v) {
  KILN_CHECK(v.size() == 1 || v.size() == 2, op, ": ", what, " must have 1 or 2 values, got ", v);
  return v.size() == 1 ? IntList{v[0], v[0]} : v;
}

}  // namespace kiln::nn::functional::detail
