#pragma once
// Layer options: every nn options struct declares its fields with KILN_ARG (kiln/core/arg.h), and
// a 2-D size is given as one number or as {h, w} (Size2).
#include <initializer_list>

#include "kiln/core/arg.h"
#include "kiln/core/error.h"
#include "kiln/core/tensor.h"

namespace kiln::nn {

struct Size2 {
  int64_t h = 0, w = 0;
  Size2(int64_t v) : h(v), w(v) {}  // NOLINT: implicit, as in libtorch's ExpandingArray
  Size2(std::initializer_list<int64_t> v) {
    KILN_CHECK(v.size() == 2 || v.size() == 1, "expected one or two sizes, got ", v.size());
    h = *v.begin();
    w = v.size() == 2 ? *(v.begin() + 1) : h;
  }
  IntList list() const { return {h, w}; }
  bool operator==(const Size2& o) const { return h == o.h && w == o.w; }
};

}  // namespace kiln::nn
