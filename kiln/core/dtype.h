#pragma once
// Element types. Every tensor has one DType; kernels are instantiated per C++ type through the
// dispatch helpers at the end of this file.
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <type_traits>

#include "kiln/core/error.h"
#include "kiln/core/half.h"

namespace kiln {

enum class DType : uint8_t { F32, F64, F16, BF16, I64, I32, U8, Bool };

constexpr int kNumDTypes = 8;

size_t element_size(DType t);
const char* dtype_name(DType t);  // "float32", "float16", ... as PyTorch prints them
inline bool is_floating(DType t) { return t == DType::F32 || t == DType::F64 || t == DType::F16 || t == DType::BF16; }
inline bool is_integral(DType t, bool include_bool = true) {
  return t == DType::I64 || t == DType::I32 || t == DType::U8 || (include_bool && t == DType::Bool);
}
// The dtype two operands are computed in (PyTorch's promotion lattice restricted to our types).
DType promote_types(DType a, DType b);

inline std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::F32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::F64; };
template <> struct dtype_of<Half> { static constexpr DType value = DType::F16; };
template <> struct dtype_of<BFloat16> { static constexpr DType value = DType::BF16; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::I64; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::I32; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::U8; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::Bool; };

// The type arithmetic on T is carried out in: float for the 16-bit types, T otherwise.
template <class T> struct opmath { using type = T; };
template <> struct opmath<Half> { using type = float; };
template <> struct opmath<BFloat16> { using type = float; };
template <class T> using opmath_t = typename opmath<T>::type;

template <class T> struct TypeTag { using type = T; };

// dispatch_*(dtype, op_name, [&](auto tag) { using T = typename decltype(tag)::type; ... })
template <class F> decltype(auto) dispatch_floating(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::F32: return f(TypeTag<float>{});
    case DType::F64: return f(TypeTag<double>{});
    case DType::F16: return f(TypeTag<Half>{});
    case DType::BF16: return f(TypeTag<BFloat16>{});
    default: KILN_FAIL(op, ": expected a floating-point tensor, got dtype ", dtype_name(t));
  }
}

template <class F> decltype(auto) dispatch_numeric(DType t, const char* op, F&& f) {  // everything but bool
  switch (t) {
    case DType::F32: return f(TypeTag<float>{});
    case DType::F64: return f(TypeTag<double>{});
    case DType::F16: return f(TypeTag<Half>{});
    case DType::BF16: return f(TypeTag<BFloat16>{});
    case DType::I64: return f(TypeTag<int64_t>{});
    case DType::I32: return f(TypeTag<int32_t>{});
    case DType::U8: return f(TypeTag<uint8_t>{});
    default: KILN_FAIL(op, ": dtype ", dtype_name(t), " is not supported");
  }
}

template <class F> decltype(auto) dispatch_all(DType t, const char* op, F&& f) {
  if (t == DType::Bool) return f(TypeTag<bool>{});
  return dispatch_numeric(t, op, std::forward<F>(f));
}

template <class F> decltype(auto) dispatch_index(DType t, const char* op, F&& f) {  // index tensors
  switch (t) {
    case DType::I64: return f(TypeTag<int64_t>{});
    case DType::I32: return f(TypeTag<int32_t>{});
    default: KILN_FAIL(op, ": indices must be int64 or int32, got ", dtype_name(t));
  }
}

}  // namespace kiln
