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

std::optional<Tensor> autocast_rerun(Policy policy, std::initializer_list<Tensor> args,
                                     const std::function<Tensor(const std::vector<Tensor>&)>& op) {
  if (!t_dtype) return std::nullopt;
  std::vector<Tensor> cast;
  bool changed = false;
  for (const Tensor& t : args) {
    cast.push_back(policy == Policy::LowPrecision ? to_autocast_low(t) : to_autocast_f32(t));
    changed = changed || (t.defined() && !cast.back().is_same(t));
  }
  if (!changed) return std::nullopt;
  if (policy == Policy::F32) return op(cast);
  NoAutocastGuard off;
  return op(cast);
}

}  // namespace kiln::amp
