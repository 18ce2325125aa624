// CPU list kernels (kernels/multi_tensor.h): the global p-norm of a tensor list, and in-place
// scale and lerp over a list, each one pass over all tensors together. The tensors are cut into
// 64K-element chunks spread over the OpenMP threads (small tensors do not leave threads idle), each
// chunk a plain-pointer loop under `omp simd`. Norm partial sums are kept per chunk and combined in
// chunk order, so the result is independent of the thread count. The optimizer step's CPU launcher
// is the template cpu::multi_tensor_step in kernels/multi_tensor.h.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/kernels/copy_fill.h"
#include "kiln/kernels/multi_tensor.h"

namespace kiln::kernels::cpu {
namespace {

using multi_tensor_detail::Chunk;
using multi_tensor_detail::make_chunks;

// The tensors of a list kernel that run chunked: their element counts (0 for those it handles
// otherwise) and the indices of those with elements.
struct ChunkedList {
  std::vector<int64_t> numels;
  std::vector<int32_t> which;
  explicit ChunkedList(size_t n) : numels(n, 0) {}
  void add(size_t i, int64_t numel) {
    numels[i] = numel;
    if (numel > 0) which.push_back(static_cast<int32_t>(i));
  }
  std::vector<Chunk> chunks() const { return make_chunks(numels, which); }
};

// Runs body(tag, c, chunk) for every chunk c on the OpenMP threads, tag being the dispatch tag of
// the dtype of the chunk's tensor in `typed` (the inner loops stay in the caller's lambda).
template <class F>
void for_each_chunk(const std::vector<Chunk>& chunks, const std::vector<Tensor>& typed, const char* op, F&& body) {
  const int64_t nchunks = static_cast<int64_t>(chunks.size());
#pragma omp parallel for schedule(dynamic, 1) if (nchunks > 1)
  for (int64_t c = 0; c < nchunks; ++c) {
    const Chunk& ch = chunks[c];
    dispatch_floating(typed[ch.tensor].dtype(), op, [&](auto tag) { body(tag, c, ch); });
  }
}

// ---------------------------------------------------------------- norms and scaling

Tensor norm(const std::vector<Tensor>& tensors, double norm_type) {
  KILN_CHECK(norm_type > 0, "multi_tensor_norm: norm_type must be positive (or inf), got ", norm_type);
  const bool inf = std::isinf(norm_type);
  bool any_f64 = false;
  ChunkedList list(tensors.size());
  std::vector<Tensor> dense(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    KILN_CHECK(t.defined(), "multi_tensor_norm: tensor ", i, " is undefined");
    KILN_CHECK(t.device().is_cpu(), "multi_tensor_norm (CPU): tensor ", i, " is on ", t.device());
    KILN_CHECK(t.is_floating_point(), "multi_tensor_norm: tensor ", i, " has dtype ", t.dtype());
    any_f64 |= t.dtype() == DType::F64;
    dense[i] = is_dense(t) ? t : contiguous(t);
    list.add(i, t.numel());
  }
  const std::vector<Chunk> chunks = list.chunks();
  const int64_t nchunks = static_cast<int64_t>(chunks.size());
  std::vector<double> part(nchunks, 0.0);
  const math::NormTerm term{norm_type};
  for_each_chunk(chunks, dense, "multi_tensor_norm", [&](auto tag, int64_t c, const Chunk& ch) {
    using P = typename decltype(tag)::type;
    const P* __restrict x = static_cast<const P*>(dense[ch.tensor].data_ptr());
    if (inf) {
      double mx = 0;
      int nan = 0;
#pragma omp simd reduction(max : mx) reduction(| : nan)
      for (int64_t i = ch.begin; i < ch.end; ++i) {
        double a = std::fabs(static_cast<double>(static_cast<opmath_t<P>>(x[i])));
        nan |= (a != a);
        mx = a > mx ? a : mx;
      }
      part[c] = nan ? std::numeric_limits<double>::quiet_NaN() : mx;
    } else if (norm_type == 2.0 || norm_type == 1.0) {
      // The common norms get their own loops: the generic term's pow() call (and the branch on
      // p inside it) keeps the compiler from vectorizing, ~7x slower on AVX-512.
      const bool l2 = norm_type == 2.0;
      double s = 0;
      if (l2) {
#pragma omp simd reduction(+ : s)
        for (int64_t i = ch.begin; i < ch.end; ++i) {
          const double v = static_cast<double>(static_cast<opmath_t<P>>(x[i]));
          s += v * v;
        }
      } else {
#pragma omp simd reduction(+ : s)
        for (int64_t i = ch.begin; i < ch.end; ++i) s += std::fabs(static_cast<double>(static_cast<opmath_t<P>>(x[i])));
      }
      part[c] = s;
    } else {
      double s = 0;
      for (int64_t i = ch.begin; i < ch.end; ++i) s += term(static_cast<double>(static_cast<opmath_t<P>>(x[i])));
      part[c] = s;
    }
  });
  double total = 0;
  for (int64_t c = 0; c < nchunks; ++c) {
    if (inf)
      total = (part[c] != part[c] || part[c] > total || total != total) ? (total != total ? total : part[c]) : total;
    else total += part[c];
  }
  if (!inf) total = norm_type == 2.0 ? std::sqrt(total) : norm_type == 1.0 ? total : std::pow(total, 1.0 / norm_type);
  Tensor out = empty({}, any_f64 ? DType::F64 : DType::F32);
  if (any_f64) *out.data_ptr<double>() = total;
  else *out.data_ptr<float>() = static_cast<float>(total);
  return out;
}

void scale_(const std::vector<Tensor>& tensors, const Tensor& scale) {
  KILN_CHECK(scale.defined() && scale.numel() == 1 && scale.device().is_cpu(),
             "multi_tensor_scale_: scale must be a one-element CPU tensor");
  const double s = scale.item<double>();
  ChunkedList list(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    KILN_CHECK(t.defined() && t.device().is_cpu() && t.is_floating_point(), "multi_tensor_scale_: tensor ", i,
               " must be a defined floating-point CPU tensor");
    if (is_dense(t)) list.add(i, t.numel());
    else scale_strided_(t, s);  // rare: scale through the strided pointwise path
  }
  for_each_chunk(list.chunks(), tensors, "multi_tensor_scale_", [&](auto tag, int64_t, const Chunk& ch) {
    using P = typename decltype(tag)::type;
    using M = opmath_t<P>;
    P* __restrict x = static_cast<P*>(tensors[ch.tensor].data_ptr());
    const M k = static_cast<M>(s);
#pragma omp simd
    for (int64_t i = ch.begin; i < ch.end; ++i) x[i] = static_cast<P>(static_cast<M>(x[i]) * k);
  });
  for (int32_t i : list.which) tensors[i].storage()->bump_version();
}

void lerp_(const std::vector<Tensor>& dst, const std::vector<Tensor>& src, double weight) {
  KILN_CHECK(dst.size() == src.size(), "multi_tensor_lerp_: ", dst.size(), " destinations but ", src.size(),
             " sources");
  ChunkedList list(dst.size());
  for (size_t i = 0; i < dst.size(); ++i) {
    const Tensor& d = dst[i];
    const Tensor& s = src[i];
    KILN_CHECK(d.defined() && s.defined(), "multi_tensor_lerp_: pair ", i, " has an undefined tensor");
    KILN_CHECK(d.device().is_cpu() && s.device().is_cpu(), "multi_tensor_lerp_ (CPU): pair ", i, " is on ", d.device(),
               " and ", s.device());
    KILN_CHECK(d.is_floating_point() && d.dtype() == s.dtype() && d.sizes() == s.sizes(), "multi_tensor_lerp_: pair ",
               i, " must be floating tensors of one dtype and sizes, got ", d.dtype(), " ", d.sizes(), " and ",
               s.dtype(), " ", s.sizes());
    if (is_dense(d) && same_layout(d, s)) list.add(i, d.numel());
    else lerp_strided_(d, s, weight);  // rare: the strided pointwise path
  }
  for_each_chunk(list.chunks(), dst, "multi_tensor_lerp_", [&](auto tag, int64_t, const Chunk& ch) {
    using P = typename decltype(tag)::type;
    using M = opmath_t<P>;
    P* __restrict x = static_cast<P*>(dst[ch.tensor].data_ptr());
    const P* __restrict y = static_cast<const P*>(src[ch.tensor].data_ptr());
    const math::LerpOp<M> f{static_cast<M>(weight)};
#pragma omp simd
    for (int64_t i = ch.begin; i < ch.end; ++i) x[i] = static_cast<P>(f(static_cast<M>(x[i]), static_cast<M>(y[i])));
  });
  for (int32_t i : list.which) dst[i].storage()->bump_version();
}

}  // namespace

KILN_REGISTER_KERNEL(multi_tensor_norm, CPU, norm);
KILN_REGISTER_KERNEL(multi_tensor_scale_, CPU, scale_);
KILN_REGISTER_KERNEL(multi_tensor_lerp_, CPU, lerp_);

}  // namespace kiln::kernels::cpu
