#pragma once
// Small helpers for layer options: a 2-D size given as one number or as {h, w}.
#include <initializer_list>

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

// Chainable setter for an options field: `KILN_OPTION(Type, name)` gives `name(v)` and `name()`.
#define KILN_OPTION(T, NAME)                 \
 public:                                     \
  auto& NAME(const T& v) {                   \
    NAME##_ = v;                             \
    return *this;                            \
  }                                          \
  const T& NAME() const { return NAME##_; }  \
                                             \
 private:                                    \
  T NAME##_

}  // namespace kiln::nn
