#include "kiln/core/autocast.h"

namespace kiln::amp {

namespace {
thread_local std::optional<DType> t_dtype;
}

Autocast::Autocast(DType dtype, bool enabled) : prev_(t_dtype) {
  KILN_CHECK(dtype == DType::F16 || dtype == DType::BF16, "Autocast: the low-precision dtype must be ",
             "float16 or bfloat16, got ", dtype);
  if (enabled) t_dtype = dtype;
}

Autocast::~Autocast() { t_dtype = prev_; }

NoAutocastGuard::NoAutocastGuard() : prev_(t_dtype) { t_dtype.reset(); }
NoAutocastGuard::~NoAutocastGuard() { t_dtype = prev_; }

std::optional<DType> autocast_dtype() { return t_dtype; }

Tensor to_autocast_low(const Tensor& t) {
  if (!t_dtype || !t.defined() || t.dtype() != DType::F32) return t;
  return t.to(*t_dtype);
}

Tensor to_autocast_f32(const Tensor& t) {
  if (!t_dtype || !t.defined() || (t.dtype() != DType::F16 && t.dtype() != DType::BF16)) return t;
  return t.to(DType::F32);
}

}  // namespace kiln::amp
