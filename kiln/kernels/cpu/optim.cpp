// CPU multi-tensor launchers for the optimizer step, the global gradient norm and scaling.
//
// What it computes: one optimizer step (SGD, Adam/AdamW, LAMB, LARS) over every parameter of a
// group in one call, with the per-element math of kiln/kernels/math/optim.h.
//
// Why it is fast: a per-parameter loop of tensor ops makes ~10 passes over memory per parameter
// (and allocates temporaries); here each element of param, grad and state is read once and written
// once (LAMB/LARS: one extra read-only pass for the per-tensor norms). All tensors are cut into
// 64K-element chunks, and the chunks of all tensors together are spread over the OpenMP threads,
// so small tensors (biases, norms) do not leave threads idle. Inside a chunk the loop runs over
// plain pointers under `omp simd`; the functors are branch-free on loop-invariant flags, so the
// compiler vectorizes them. Norm partial sums are kept per chunk and combined in chunk order, so the
// result is independent of the thread count.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/kernels/math/optim.h"
#include "kiln/kernels/optim_kernels.h"

namespace kiln::kernels::cpu {
namespace {

constexpr int64_t kChunk = int64_t{1} << 16;
constexpr int64_t kParallelMin = 32768;

// State (and master-weight) type for a parameter storage type: double for f64, else float.
template <class P> struct state_of { using type = float; };
template <> struct state_of<double> { using type = double; };
template <class P> using state_t = typename state_of<P>::type;

// Non-overlapping and dense: some permutation of the dimensions is contiguous, so the elements
// occupy numel consecutive slots starting at data_ptr().
bool is_dense(const Tensor& t) {
  if (t.is_contiguous()) return true;
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) != 1) dims.emplace_back(t.stride(d), t.size(d));
  std::sort(dims.begin(), dims.end());
  int64_t expected = 1;
  for (auto& [st, sz] : dims) {
    if (st != expected) return false;
    expected *= sz;
  }
  return true;
}

// Same sizes, and the same strides wherever the size is not 1 (so flat memory order matches).
bool same_layout(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes()) return false;
  for (int64_t d = 0; d < a.dim(); ++d)
    if (a.size(d) != 1 && a.stride(d) != b.stride(d)) return false;
  return true;
}

double read_scalar(const Tensor& t, const char* what) {
  KILN_CHECK(t.numel() == 1, "fused_optimizer_step: ", what, " must have one element, got sizes ",
             t.sizes());
  KILN_CHECK(t.device().is_cpu(), "fused_optimizer_step: ", what, " is on ", t.device(),
             " but the parameters are on the CPU");
  return t.item<double>();
}

struct Chunk {
  int32_t tensor;
  int64_t begin, end;
};

std::vector<Chunk> make_chunks(const std::vector<int64_t>& numels, const std::vector<int32_t>& which) {
  std::vector<Chunk> chunks;
  for (int32_t t : which)
    for (int64_t b = 0; b < numels[t]; b += kChunk)
      chunks.push_back({t, b, std::min(numels[t], b + kChunk)});
  return chunks;
}

struct Ptrs {
  void* p = nullptr;
  const void* g = nullptr;
  void* m = nullptr;
  void* v = nullptr;
  float* master = nullptr;
};

// Applies f(w, g, m, v) to elements [b, e) of one parameter: w is the f32/f64 weight (the master
// copy for 16-bit parameters), g the gradient, m/v the state, all in the opmath type.
template <class P, bool HasM, bool HasV, class F>
void elementwise(const Ptrs& ptr, int64_t b, int64_t e, const F& f) {
  using S = state_t<P>;
  constexpr bool kMaster = !std::is_same_v<P, S>;
  P* __restrict p = static_cast<P*>(ptr.p);
  const P* __restrict g = static_cast<const P*>(ptr.g);
  S* __restrict m = static_cast<S*>(ptr.m);
  S* __restrict v = static_cast<S*>(ptr.v);
  float* __restrict w = ptr.master;
#pragma omp simd
  for (int64_t i = b; i < e; ++i) {
    S x;
    if constexpr (kMaster) x = w[i]; else x = p[i];
    S gi = static_cast<S>(g[i]);
    S mi = S(0), vi = S(0);
    if constexpr (HasM) mi = m[i];
    if constexpr (HasV) vi = v[i];
    f(x, gi, mi, vi);
    if constexpr (HasM) m[i] = mi;
    if constexpr (HasV) v[i] = vi;
    if constexpr (kMaster) {
      w[i] = x;
      p[i] = static_cast<P>(x);
    } else {
      p[i] = x;
    }
  }
}

// LAMB pass 1 over [b, e): moments in place; returns (sum r^2, sum w^2) in double.
template <class P>
std::pair<double, double> lamb_moments(const Ptrs& ptr, int64_t b, int64_t e,
                                       const math::LambStep<state_t<P>>& f) {
  using S = state_t<P>;
  constexpr bool kMaster = !std::is_same_v<P, S>;
  const P* __restrict p = static_cast<const P*>(ptr.p);
  const P* __restrict g = static_cast<const P*>(ptr.g);
  S* __restrict m = static_cast<S*>(ptr.m);
  S* __restrict v = static_cast<S*>(ptr.v);
  const float* __restrict w = ptr.master;
  double r2 = 0, w2 = 0;
#pragma omp simd reduction(+ : r2, w2)
  for (int64_t i = b; i < e; ++i) {
    S x;
    if constexpr (kMaster) x = w[i]; else x = p[i];
    S mi = m[i], vi = v[i];
    S r = f.moments(x, static_cast<S>(g[i]), mi, vi);
    m[i] = mi;
    v[i] = vi;
    r2 += static_cast<double>(r) * static_cast<double>(r);
    w2 += static_cast<double>(x) * static_cast<double>(x);
  }
  return {r2, w2};
}

// Sum of squares of the weight (master when present) and of the raw gradient over [b, e).
template <class P>
std::pair<double, double> weight_grad_sumsq(const Ptrs& ptr, int64_t b, int64_t e) {
  using S = state_t<P>;
  constexpr bool kMaster = !std::is_same_v<P, S>;
  const P* __restrict p = static_cast<const P*>(ptr.p);
  const P* __restrict g = static_cast<const P*>(ptr.g);
  const float* __restrict w = ptr.master;
  double w2 = 0, g2 = 0;
#pragma omp simd reduction(+ : w2, g2)
  for (int64_t i = b; i < e; ++i) {
    double x;
    if constexpr (kMaster) x = w[i]; else x = static_cast<double>(static_cast<S>(p[i]));
    double gi = static_cast<double>(static_cast<S>(g[i]));
    w2 += x * x;
    g2 += gi * gi;
  }
  return {w2, g2};
}

void check_state(const Tensor& s, const Tensor& p, DType want, const char* what, size_t i) {
  KILN_CHECK(s.device() == p.device(), "fused_optimizer_step: ", what, "[", i, "] is on ",
             s.device(), ", parameter on ", p.device());
  KILN_CHECK(s.dtype() == want, "fused_optimizer_step: ", what, "[", i, "] has dtype ", s.dtype(),
             ", expected ", want, " for a ", p.dtype(), " parameter");
  KILN_CHECK(same_layout(s, p), "fused_optimizer_step: ", what, "[", i, "] (sizes ", s.sizes(),
             " strides ", s.strides(), ") does not have the parameter's layout (sizes ", p.sizes(),
             " strides ", p.strides(), ")");
}

}  // namespace

void fused_optimizer_step(const math::OptimHyper& h, const MultiTensorLists& L,
                          const StepScalars& sc) {
  using math::OptimAlgo;
  const size_t n = L.params.size();
  auto check_len = [&](const std::vector<Tensor>& v, const char* what) {
    KILN_CHECK(v.size() == n, "fused_optimizer_step: ", n, " params but ", v.size(), " ", what);
  };
  check_len(L.grads, "grads");
  check_len(L.exp_avgs, "exp_avgs");
  check_len(L.exp_avg_sqs, "exp_avg_sqs");
  check_len(L.masters, "masters");
  check_len(L.steps, "steps");
  KILN_CHECK(L.fresh_momentum.empty() || L.fresh_momentum.size() == n,
             "fused_optimizer_step: fresh_momentum must be empty or have one entry per param");
  const bool needs_m = h.algo == OptimAlgo::Adam || h.algo == OptimAlgo::LAMB ||
                       h.momentum != 0.0;
  const bool needs_v = h.algo == OptimAlgo::Adam || h.algo == OptimAlgo::LAMB;

  // ---- validate and collect the parameters that have a gradient
  std::vector<int32_t> active;
  std::vector<int64_t> numels(n, 0);
  std::vector<Ptrs> ptrs(n);
  for (size_t i = 0; i < n; ++i) {
    const Tensor& p = L.params[i];
    const Tensor& g = L.grads[i];
    if (!g.defined()) continue;
    KILN_CHECK(p.defined(), "fused_optimizer_step: params[", i, "] is undefined");
    KILN_CHECK(p.device().is_cpu(), "fused_optimizer_step (CPU): params[", i, "] is on ", p.device());
    KILN_CHECK(p.is_floating_point(), "fused_optimizer_step: params[", i, "] has dtype ", p.dtype(),
               "; only floating-point parameters can be optimized");
    KILN_CHECK(is_dense(p), "fused_optimizer_step: params[", i, "] (sizes ", p.sizes(), " strides ",
               p.strides(), ") is not dense");
    KILN_CHECK(g.dtype() == p.dtype() && g.device() == p.device() && same_layout(g, p),
               "fused_optimizer_step: grads[", i, "] (", g.dtype(), ", ", g.device(), ", sizes ",
               g.sizes(), " strides ", g.strides(), ") must match its parameter (", p.dtype(), ", ",
               p.device(), ", sizes ", p.sizes(), " strides ", p.strides(), ")");
    const DType sdt = p.dtype() == DType::F64 ? DType::F64 : DType::F32;
    const bool half = p.dtype() == DType::F16 || p.dtype() == DType::BF16;
    Ptrs& q = ptrs[i];
    q.p = p.data_ptr();
    q.g = g.data_ptr();
    if (needs_m) {
      KILN_CHECK(L.exp_avgs[i].defined(), "fused_optimizer_step: exp_avgs[", i, "] is required");
      check_state(L.exp_avgs[i], p, sdt, "exp_avgs", i);
      q.m = L.exp_avgs[i].data_ptr();
    }
    if (needs_v) {
      KILN_CHECK(L.exp_avg_sqs[i].defined(), "fused_optimizer_step: exp_avg_sqs[", i, "] is required");
      check_state(L.exp_avg_sqs[i], p, sdt, "exp_avg_sqs", i);
      q.v = L.exp_avg_sqs[i].data_ptr();
    }
    if (half) {
      KILN_CHECK(L.masters[i].defined(), "fused_optimizer_step: params[", i, "] is ", p.dtype(),
                 " and needs f32 master weights in masters[", i, "]");
      check_state(L.masters[i], p, DType::F32, "masters", i);
      q.master = L.masters[i].data_ptr<float>();
    } else {
      KILN_CHECK(!L.masters[i].defined(), "fused_optimizer_step: masters[", i,
                 "] is only for f16/bf16 parameters");
    }
    const Tensor& st = L.steps[i];
    KILN_CHECK(st.defined() && st.numel() == 1 && st.dtype() == DType::F64 && st.device().is_cpu(),
               "fused_optimizer_step: steps[", i, "] must be a one-element f64 CPU tensor");
    numels[i] = p.numel();
    active.push_back(static_cast<int32_t>(i));
  }
  if (active.empty()) return;

  // ---- the device-resident scalars (on the CPU: a plain read)
  if (sc.found_inf.defined() && read_scalar(sc.found_inf, "found_inf") != 0.0) return;
  KILN_CHECK(sc.lr.defined(), "fused_optimizer_step: the learning-rate tensor is undefined");
  const double lr = read_scalar(sc.lr, "lr");
  const double inv_scale = sc.grad_scale.defined() ? 1.0 / read_scalar(sc.grad_scale, "grad_scale") : 1.0;
  std::vector<double> step(n, 0.0);
  for (int32_t i : active) step[i] = *L.steps[i].data_ptr<double>() + 1.0;
  auto fresh = [&](int32_t i) { return !L.fresh_momentum.empty() && L.fresh_momentum[i] != 0; };

  const std::vector<Chunk> chunks = make_chunks(numels, active);
  const int64_t nchunks = static_cast<int64_t>(chunks.size());
  int64_t total = 0;
  for (int32_t i : active) total += numels[i];
  const bool par = total >= kParallelMin && nchunks > 1;

  switch (h.algo) {
    case OptimAlgo::SGD: {
#pragma omp parallel for schedule(dynamic, 1) if (par)
      for (int64_t c = 0; c < nchunks; ++c) {
        const Chunk& ch = chunks[c];
        dispatch_floating(L.params[ch.tensor].dtype(), "sgd", [&](auto tag) {
          using P = typename decltype(tag)::type;
          auto f = math::make_sgd_step<state_t<P>>(h, lr, fresh(ch.tensor), inv_scale);
          if (f.use_momentum) elementwise<P, true, false>(ptrs[ch.tensor], ch.begin, ch.end, f);
          else elementwise<P, false, false>(ptrs[ch.tensor], ch.begin, ch.end, f);
        });
      }
      break;
    }
    case OptimAlgo::Adam: {
#pragma omp parallel for schedule(dynamic, 1) if (par)
      for (int64_t c = 0; c < nchunks; ++c) {
        const Chunk& ch = chunks[c];
        dispatch_floating(L.params[ch.tensor].dtype(), "adam", [&](auto tag) {
          using P = typename decltype(tag)::type;
          auto f = math::make_adam_step<state_t<P>>(h, lr, step[ch.tensor], inv_scale);
          elementwise<P, true, true>(ptrs[ch.tensor], ch.begin, ch.end, f);
        });
      }
      break;
    }
    case OptimAlgo::LAMB: {
      std::vector<double> r2(nchunks), w2(nchunks);
#pragma omp parallel for schedule(dynamic, 1) if (par)
      for (int64_t c = 0; c < nchunks; ++c) {
        const Chunk& ch = chunks[c];
        dispatch_floating(L.params[ch.tensor].dtype(), "lamb", [&](auto tag) {
          using P = typename decltype(tag)::type;
          auto f = math::make_lamb_step<state_t<P>>(h, step[ch.tensor], inv_scale);
          std::tie(r2[c], w2[c]) = lamb_moments<P>(ptrs[ch.tensor], ch.begin, ch.end, f);
        });
      }
      std::vector<double> rn(n, 0.0), wn(n, 0.0), trust(n, 1.0);
      for (int64_t c = 0; c < nchunks; ++c) {  // fixed order: deterministic
        rn[chunks[c].tensor] += r2[c];
        wn[chunks[c].tensor] += w2[c];
      }
      for (int32_t i : active) trust[i] = math::lamb_trust_ratio(std::sqrt(wn[i]), std::sqrt(rn[i]));
#pragma omp parallel for schedule(dynamic, 1) if (par)
      for (int64_t c = 0; c < nchunks; ++c) {
        const Chunk& ch = chunks[c];
        dispatch_floating(L.params[ch.tensor].dtype(), "lamb", [&](auto tag) {
          using P = typename decltype(tag)::type;
          using S = state_t<P>;
          auto f = math::make_lamb_step<S>(h, step[ch.tensor], inv_scale);
          f.lr_trust = S(lr * trust[ch.tensor]);
          elementwise<P, true, true>(ptrs[ch.tensor], ch.begin, ch.end,
                                     [&f](S& w, S, S& m, S& v) { f.apply(w, m, v); });
        });
      }
      break;
    }
    case OptimAlgo::LARS: {
      std::vector<double> w2(nchunks), g2(nchunks);
#pragma omp parallel for schedule(dynamic, 1) if (par)
      for (int64_t c = 0; c < nchunks; ++c) {
        const Chunk& ch = chunks[c];
        dispatch_floating(L.params[ch.tensor].dtype(), "lars", [&](auto tag) {
          using P = typename decltype(tag)::type;
          std::tie(w2[c], g2[c]) = weight_grad_sumsq<P>(ptrs[ch.tensor], ch.begin, ch.end);
        });
      }
      std::vector<double> wn(n, 0.0), gn(n, 0.0), trust(n, 1.0);
      for (int64_t c = 0; c < nchunks; ++c) {
        wn[chunks[c].tensor] += w2[c];
        gn[chunks[c].tensor] += g2[c];
      }
      for (int32_t i : active)
        trust[i] = math::lars_trust_ratio(h, std::sqrt(wn[i]), std::sqrt(gn[i]) * std::abs(inv_scale));
#pragma omp parallel for schedule(dynamic, 1) if (par)
      for (int64_t c = 0; c < nchunks; ++c) {
        const Chunk& ch = chunks[c];
        dispatch_floating(L.params[ch.tensor].dtype(), "lars", [&](auto tag) {
          using P = typename decltype(tag)::type;
          auto f = math::make_lars_step<state_t<P>>(h, lr, fresh(ch.tensor), inv_scale, trust[ch.tensor]);
          if (f.use_momentum) elementwise<P, true, false>(ptrs[ch.tensor], ch.begin, ch.end, f);
          else elementwise<P, false, false>(ptrs[ch.tensor], ch.begin, ch.end, f);
        });
      }
      break;
    }
  }
  for (int32_t i : active) {
    *L.steps[i].data_ptr<double>() = step[i];
    L.params[i].storage()->bump_version();  // in-place writes, as an in-place op would record
  }
}

// ---------------------------------------------------------------- norms and scaling

Tensor multi_tensor_norm(const std::vector<Tensor>& tensors, double norm_type) {
  KILN_CHECK(norm_type > 0, "multi_tensor_norm: norm_type must be positive (or inf), got ", norm_type);
  const bool inf = std::isinf(norm_type);
  bool any_f64 = false;
  std::vector<int64_t> numels(tensors.size(), 0);
  std::vector<int32_t> which;
  std::vector<Tensor> dense(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    KILN_CHECK(t.defined(), "multi_tensor_norm: tensor ", i, " is undefined");
    KILN_CHECK(t.device().is_cpu(), "multi_tensor_norm (CPU): tensor ", i, " is on ", t.device());
    KILN_CHECK(t.is_floating_point(), "multi_tensor_norm: tensor ", i, " has dtype ", t.dtype());
    any_f64 |= t.dtype() == DType::F64;
    dense[i] = is_dense(t) ? t : t.contiguous();
    numels[i] = t.numel();
    if (numels[i] > 0) which.push_back(static_cast<int32_t>(i));
  }
  const std::vector<Chunk> chunks = make_chunks(numels, which);
  const int64_t nchunks = static_cast<int64_t>(chunks.size());
  std::vector<double> part(nchunks, 0.0);
  const math::NormTerm term{norm_type};
#pragma omp parallel for schedule(dynamic, 1) if (nchunks > 1)
  for (int64_t c = 0; c < nchunks; ++c) {
    const Chunk& ch = chunks[c];
    dispatch_floating(dense[ch.tensor].dtype(), "multi_tensor_norm", [&](auto tag) {
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
          for (int64_t i = ch.begin; i < ch.end; ++i)
            s += std::fabs(static_cast<double>(static_cast<opmath_t<P>>(x[i])));
        }
        part[c] = s;
      } else {
        double s = 0;
        for (int64_t i = ch.begin; i < ch.end; ++i)
          s += term(static_cast<double>(static_cast<opmath_t<P>>(x[i])));
        part[c] = s;
      }
    });
  }
  double total = 0;
  for (int64_t c = 0; c < nchunks; ++c) {
    if (inf) total = (part[c] != part[c] || part[c] > total || total != total) ?
                     (total != total ? total : part[c]) : total;
    else total += part[c];
  }
  if (!inf) total = norm_type == 2.0 ? std::sqrt(total) :
                    norm_type == 1.0 ? total : std::pow(total, 1.0 / norm_type);
  Tensor out = empty({}, any_f64 ? DType::F64 : DType::F32);
  if (any_f64) *out.data_ptr<double>() = total;
  else *out.data_ptr<float>() = static_cast<float>(total);
  return out;
}

void multi_tensor_scale_(const std::vector<Tensor>& tensors, const Tensor& scale) {
  KILN_CHECK(scale.defined() && scale.numel() == 1 && scale.device().is_cpu(),
             "multi_tensor_scale_: scale must be a one-element CPU tensor");
  const double s = scale.item<double>();
  std::vector<int64_t> numels(tensors.size(), 0);
  std::vector<int32_t> which;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    KILN_CHECK(t.defined() && t.device().is_cpu() && t.is_floating_point(),
               "multi_tensor_scale_: tensor ", i, " must be a defined floating-point CPU tensor");
    if (!is_dense(t)) {  // rare: scale through the strided pointwise path
      const_cast<Tensor&>(t).mul_(s);
      continue;
    }
    numels[i] = t.numel();
    if (numels[i] > 0) which.push_back(static_cast<int32_t>(i));
  }
  const std::vector<Chunk> chunks = make_chunks(numels, which);
  const int64_t nchunks = static_cast<int64_t>(chunks.size());
#pragma omp parallel for schedule(dynamic, 1) if (nchunks > 1)
  for (int64_t c = 0; c < nchunks; ++c) {
    const Chunk& ch = chunks[c];
    dispatch_floating(tensors[ch.tensor].dtype(), "multi_tensor_scale_", [&](auto tag) {
      using P = typename decltype(tag)::type;
      using M = opmath_t<P>;
      P* __restrict x = static_cast<P*>(tensors[ch.tensor].data_ptr());
      const M k = static_cast<M>(s);
#pragma omp simd
      for (int64_t i = ch.begin; i < ch.end; ++i) x[i] = static_cast<P>(static_cast<M>(x[i]) * k);
    });
  }
  for (int32_t i : which) tensors[i].storage()->bump_version();
}

void multi_tensor_lerp_(const std::vector<Tensor>& dst, const std::vector<Tensor>& src, double weight) {
  KILN_CHECK(dst.size() == src.size(), "multi_tensor_lerp_: ", dst.size(), " destinations but ",
             src.size(), " sources");
  std::vector<int64_t> numels(dst.size(), 0);
  std::vector<int32_t> which;
  for (size_t i = 0; i < dst.size(); ++i) {
    const Tensor& d = dst[i];
    const Tensor& s = src[i];
    KILN_CHECK(d.defined() && s.defined(), "multi_tensor_lerp_: pair ", i, " has an undefined tensor");
    KILN_CHECK(d.device().is_cpu() && s.device().is_cpu(), "multi_tensor_lerp_ (CPU): pair ", i,
               " is on ", d.device(), " and ", s.device());
    KILN_CHECK(d.is_floating_point() && d.dtype() == s.dtype() && d.sizes() == s.sizes(),
               "multi_tensor_lerp_: pair ", i, " must be floating tensors of one dtype and sizes, got ",
               d.dtype(), " ", d.sizes(), " and ", s.dtype(), " ", s.sizes());
    if (!is_dense(d) || !same_layout(d, s)) {  // rare: the strided pointwise path
      const_cast<Tensor&>(d).add_(s - d, weight);
      continue;
    }
    numels[i] = d.numel();
    if (numels[i] > 0) which.push_back(static_cast<int32_t>(i));
  }
  const std::vector<Chunk> chunks = make_chunks(numels, which);
  const int64_t nchunks = static_cast<int64_t>(chunks.size());
#pragma omp parallel for schedule(dynamic, 1) if (nchunks > 1)
  for (int64_t c = 0; c < nchunks; ++c) {
    const Chunk& ch = chunks[c];
    dispatch_floating(dst[ch.tensor].dtype(), "multi_tensor_lerp_", [&](auto tag) {
      using P = typename decltype(tag)::type;
      using M = opmath_t<P>;
      P* __restrict x = static_cast<P*>(dst[ch.tensor].data_ptr());
      const P* __restrict y = static_cast<const P*>(src[ch.tensor].data_ptr());
      const math::LerpOp<M> f{static_cast<M>(weight)};
#pragma omp simd
      for (int64_t i = ch.begin; i < ch.end; ++i)
        x[i] = static_cast<P>(f(static_cast<M>(x[i]), static_cast<M>(y[i])));
    });
  }
  for (int32_t i : which) dst[i].storage()->bump_version();
}

}  // namespace kiln::kernels::cpu
