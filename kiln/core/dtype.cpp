#include "kiln/core/dtype.h"

namespace kiln {

size_t element_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::I64: return 8;
    case DType::I32: return 4;
    case DType::U8: return 1;
    case DType::Bool: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::F64: return "float64";
    case DType::F16: return "float16";
    case DType::BF16: return "bfloat16";
    case DType::I64: return "int64";
    case DType::I32: return "int32";
    case DType::U8: return "uint8";
    case DType::Bool: return "bool";
  }
  return "?";
}

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  bool fa = is_floating(a), fb = is_floating(b);
  if (fa && !fb) return a;
  if (fb && !fa) return b;
  if (fa && fb) {
    if (a == DType::F64 || b == DType::F64) return DType::F64;
    return DType::F32;  // f32 with a 16-bit type, or f16 with bf16
  }
  // both integral (bool is the bottom)
  auto rank = [](DType t) {
    switch (t) {
      case DType::Bool: return 0;
      case DType::U8: return 1;
      case DType::I32: return 2;
      default: return 3;
    }
  };
  return rank(a) > rank(b) ? a : b;
}

}  // namespace kiln
