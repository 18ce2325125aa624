// CPU pointwise kernels: map each op enum to its shared functor and run it through loops.h.
#include <omp.h>

#include <cstring>
#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "kiln/core/philox.h"
#include "kiln/kernels/copy_fill.h"
#include "kiln/kernels/matmul.h"
#include "kiln/kernels/pointwise.h"
#include "kiln/kernels/reduce.h"
#include "kiln/kernels/softmax.h"
#include "kiln/kernels/cpu/loops.h"
#include "kiln/kernels/op_table.h"

namespace kiln::kernels::cpu {

void unary(UnaryOp op, const Tensor& out, const Tensor& in, double a, double b) {
  const char* name = op_name(op);
  if (is_predicate(op)) {
    KILN_CHECK(out.dtype() == DType::Bool, name, ": output must be bool, got ", out.dtype());
  } else {
    KILN_CHECK(out.dtype() == in.dtype(), name, ": output dtype ", out.dtype(), " differs from input dtype ",
               in.dtype());
  }
  PointwiseIter it = make_pointwise_iter(out, {&in}, name);
  visit_unary(op, a, b, [&](auto f, auto types) {
    dispatch_op_types(types, in.dtype(), name, [&](auto tag) {
      using T = typename decltype(tag)::type;
      unary_loop<op_out_t<decltype(types), T>, T>(it, f);
    });
  });
}
KILN_REGISTER_KERNEL(kernels::unary, CPU, unary);

void binary(BinaryOp op, const Tensor& out, const Tensor& x, const Tensor& y, double alpha, double beta) {
  const char* name = op_name(op);
  KILN_CHECK(x.dtype() == y.dtype(), name, ": operands have different dtypes ", x.dtype(), " and ", y.dtype());
  if (is_comparison(op)) {
    KILN_CHECK(out.dtype() == DType::Bool, name, ": output must be bool, got ", out.dtype());
  } else {
    KILN_CHECK(out.dtype() == x.dtype(), name, ": output dtype ", out.dtype(), " differs from input dtype ", x.dtype());
  }
  PointwiseIter it = make_pointwise_iter(out, {&x, &y}, name);
  visit_binary(op, alpha, beta, [&](auto f, auto types) {
    dispatch_op_types(types, x.dtype(), name, [&](auto tag) {
      using T = typename decltype(tag)::type;
      binary_loop<op_out_t<decltype(types), T>, T>(it, f);
    });
  });
}
KILN_REGISTER_KERNEL(kernels::binary, CPU, binary);

void where(const Tensor& out, const Tensor& cond, const Tensor& x, const Tensor& y) {
  KILN_CHECK(cond.dtype() == DType::Bool, "where: condition must be bool, got ", cond.dtype());
  KILN_CHECK(x.dtype() == y.dtype() && out.dtype() == x.dtype(), "where: dtypes differ: ", x.dtype(), ", ", y.dtype(),
             " -> ", out.dtype());
  PointwiseIter it = make_pointwise_iter(out, {&cond, &x, &y}, "where");
  dispatch_all(x.dtype(), "where", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_row(it, [&](char** p, int64_t n, const int64_t* st) {
      for (int64_t i = 0; i < n; ++i) {
        bool c = *reinterpret_cast<const bool*>(p[1] + i * st[1]);
        *reinterpret_cast<T*>(p[0] + i * st[0]) = *reinterpret_cast<const T*>(p[c ? 2 : 3] + i * st[c ? 2 : 3]);
      }
    });
  });
}
KILN_REGISTER_KERNEL(kernels::where, CPU, where);

namespace {
// Same-dtype copy where the destination is contiguous along the last dim and the source along
// the second-to-last (a transpose): copy 32x32 tiles so both sides stay in cache.
template <class E> void tiled_transpose_copy(const PointwiseIter& it) {
  constexpr int64_t kTile = 32;
  const int nd = it.ndim;
  const int64_t R = it.sizes[nd - 2], C = it.sizes[nd - 1];
  const int64_t outer = it.numel / (R * C);
  const int64_t tiles_r = (R + kTile - 1) / kTile, tiles_c = (C + kTile - 1) / kTile;
  const int64_t ds0 = it.strides[0][nd - 2], ds1 = it.strides[0][nd - 1];
  const int64_t ss0 = it.strides[1][nd - 2], ss1 = it.strides[1][nd - 1];
#pragma omp parallel for schedule(static) if (it.numel >= kParallelGrain)
  for (int64_t job = 0; job < outer * tiles_r * tiles_c; ++job) {
    int64_t o = job / (tiles_r * tiles_c), t = job % (tiles_r * tiles_c);
    int64_t r0 = (t / tiles_c) * kTile, c0 = (t % tiles_c) * kTile;
    char* d = it.data[0];
    const char* s = it.data[1];
    int64_t rem = o;
    for (int k = nd - 3; k >= 0; --k) {
      int64_t i = rem % it.sizes[k];
      rem /= it.sizes[k];
      d += i * it.strides[0][k];
      s += i * it.strides[1][k];
    }
    const int64_t r1 = std::min(R, r0 + kTile), c1 = std::min(C, c0 + kTile);
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = c0; c < c1; ++c)
        *reinterpret_cast<E*>(d + r * ds0 + c * ds1) = *reinterpret_cast<const E*>(s + r * ss0 + c * ss1);
  }
}
}  // namespace

// f32 <-> f16 conversion of contiguous runs with the F16C instructions (8 values per
// instruction, round to nearest even like Half::from_float); false when unavailable.
bool convert_f16c(const PointwiseIter& it, DType to, DType from) {
#if defined(__F16C__)
  const bool to_half = to == DType::F16 && from == DType::F32;
  const bool from_half = to == DType::F32 && from == DType::F16;
  if (!(to_half || from_half) || !it.is_flat_contiguous()) return false;
  const int64_t n = it.numel;
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
  for (int64_t c = 0; c < (n + 4095) / 4096; ++c) {
    int64_t b = c * 4096, e = std::min(n, b + 4096), i = b;
    if (to_half) {
      const float* s = reinterpret_cast<const float*>(it.data[1]);
      uint16_t* d = reinterpret_cast<uint16_t*>(it.data[0]);
      for (; i + 8 <= e; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
      for (; i < e; ++i) d[i] = Half::from_float(s[i]);
    } else {
      const uint16_t* s = reinterpret_cast<const uint16_t*>(it.data[1]);
      float* d = reinterpret_cast<float*>(it.data[0]);
      for (; i + 8 <= e; i += 8)
        _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
      for (; i < e; ++i) d[i] = Half::to_float(s[i]);
    }
  }
  return true;
#else
  (void)it;
  (void)to;
  (void)from;
  return false;
#endif
}

void copy(const Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;
  PointwiseIter it = make_pointwise_iter(dst, {&src}, "copy_");
  if (dst.dtype() == src.dtype() && it.is_flat_contiguous()) {
    // Large copies are split across threads: one core cannot saturate memory bandwidth.
    const int64_t nbytes = static_cast<int64_t>(dst.nbytes());
    const int64_t chunks = nbytes >= (int64_t{1} << 22) ? omp_get_max_threads() : 1;
    const int64_t per = (nbytes + chunks - 1) / chunks;
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (int64_t c = 0; c < chunks; ++c) {
      int64_t b = c * per, len = std::min(nbytes, b + per) - b;
      if (len > 0) std::memcpy(it.data[0] + b, it.data[1] + b, len);
    }
    return;
  }
  if (convert_f16c(it, dst.dtype(), src.dtype())) return;
  const int64_t es = it.elem_size[0];
  if (dst.dtype() == src.dtype() && it.ndim >= 2 && it.strides[0][it.ndim - 1] == es &&
      it.strides[1][it.ndim - 2] == es && it.strides[1][it.ndim - 1] != es) {
    switch (es) {
      case 1: return tiled_transpose_copy<uint8_t>(it);
      case 2: return tiled_transpose_copy<uint16_t>(it);
      case 4: return tiled_transpose_copy<uint32_t>(it);
      case 8: return tiled_transpose_copy<uint64_t>(it);
    }
  }
  dispatch_all(dst.dtype(), "copy_", [&](auto out_tag) {
    using O = typename decltype(out_tag)::type;
    dispatch_all(src.dtype(), "copy_", [&](auto in_tag) {
      using I = typename decltype(in_tag)::type;
      if constexpr (std::is_same_v<O, bool>) {
        unary_loop<O, I>(it, [](opmath_t<I> v) { return v != opmath_t<I>(0); });
      } else if constexpr (std::is_same_v<O, Half> || std::is_same_v<O, BFloat16>) {
        unary_loop<O, I>(it, [](opmath_t<I> v) { return static_cast<float>(v); });
      } else {
        unary_loop<O, I>(it, [](opmath_t<I> v) { return static_cast<O>(v); });
      }
    });
  });
}
KILN_REGISTER_KERNEL(kernels::copy_within_device, CPU, copy);

void fill(const Tensor& dst, double value) {
  if (dst.numel() == 0) return;
  PointwiseIter it = make_pointwise_iter(dst, {}, "fill_");
  dispatch_all(dst.dtype(), "fill_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T v;
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) v = T(static_cast<float>(value));
    else v = static_cast<T>(value);
    for_each_row(it, [&](char** p, int64_t n, const int64_t* st) {
      if (st[0] == sizeof(T)) {
        T* o = reinterpret_cast<T*>(p[0]);
        for (int64_t i = 0; i < n; ++i) o[i] = v;
      } else {
        for (int64_t i = 0; i < n; ++i) *reinterpret_cast<T*>(p[0] + i * st[0]) = v;
      }
    });
  });
}
KILN_REGISTER_KERNEL(kernels::fill, CPU, fill);

namespace {
// Random fills address elements by their logical (row-major) index, so the numbers do not
// depend on the strides of dst or on the thread count.
template <class Gen> void fill_random(const Tensor& dst, const char* name, Gen gen) {
  Tensor target = dst.is_contiguous() ? dst : empty(dst.sizes(), dst.options());
  const int64_t n = target.numel();
  dispatch_numeric(target.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = static_cast<T*>(target.data_ptr());
#pragma omp parallel for schedule(static) if (n >= 4096)
    for (int64_t i = 0; i < n; ++i) p[i] = gen(TypeTag<T>{}, static_cast<uint64_t>(i));
  });
  if (!target.is_same(dst)) copy(dst, target);
}
}  // namespace

void fill_uniform(const Tensor& dst, uint64_t seed, uint64_t offset) {
  fill_random(dst, "rand", [=](auto tag, uint64_t i) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, double>) return philox::uniform_d(seed, offset, i);
    else return T(philox::uniform_f(seed, offset, i));
  });
}
KILN_REGISTER_KERNEL(kernels::fill_uniform, CPU, fill_uniform);

void fill_normal(const Tensor& dst, uint64_t seed, uint64_t offset) {
  fill_random(dst, "randn", [=](auto tag, uint64_t i) {
    using T = typename decltype(tag)::type;
    double z = philox::normal_d(seed, offset, i);
    if constexpr (std::is_same_v<T, double>) return z;
    else return T(static_cast<float>(z));
  });
}
KILN_REGISTER_KERNEL(kernels::fill_normal, CPU, fill_normal);

void fill_randint(const Tensor& dst, int64_t low, int64_t high, uint64_t seed, uint64_t offset) {
  const uint64_t range = static_cast<uint64_t>(high - low);
  fill_random(dst, "randint", [=](auto tag, uint64_t i) {
    using T = typename decltype(tag)::type;
    philox::U32x4 blk = philox::element_block(seed, offset, i);
    uint64_t r = ((static_cast<uint64_t>(blk.v[0]) << 32) | blk.v[1]) % range;
    int64_t v = low + static_cast<int64_t>(r);
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) return T(static_cast<float>(v));
    else return static_cast<T>(v);
  });
}
KILN_REGISTER_KERNEL(kernels::fill_randint, CPU, fill_randint);

}  // namespace kiln::kernels::cpu
