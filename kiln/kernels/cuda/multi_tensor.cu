// CUDA multi-tensor launchers: the fused optimizer step (SGD, Adam/AdamW, LAMB, LARS), the global
// p-norm of a tensor list, and in-place scale and lerp over a list - each a few launches for all
// tensors together (multi_tensor.cuh: chunk metadata in the kernel arguments, one block per chunk).
//
// What they compute: the same as the CPU launchers (kernels/cpu/optim.cpp), with the same
// per-element functors (kernels/math/optim.h), so the CPU tests check the math.
//
// Why they are fast: a per-parameter loop of tensor ops launches ~10 kernels per parameter (each
// a pass over memory, plus temporaries); here AdamW reads param, grad, exp_avg, exp_avg_sq once
// and writes param, exp_avg, exp_avg_sq once, for all parameters in ceil(#tensors / 40) launches,
// with 16-byte vector loads.
//
// No host synchronisation: the learning rate, the steps, found_inf and grad_scale are read by the
// kernels from device memory, so a step can be captured in a CUDA graph. Step counts: every chunk
// of a tensor reads step + 1; a separate tiny kernel increments the step tensors afterwards
// (skipped, like everything else, when found_inf is set), so each is incremented exactly once.
//
// LAMB/LARS need per-tensor norms: pass 1 writes two partial sums per chunk to a scratch buffer
// (LAMB also updates the moments there), a small kernel sums each tensor's partials in chunk order
// (deterministic, no float atomics) into a trust ratio per tensor, and pass 2 applies the update.
// multi_tensor_norm works the same way: per-chunk partials, then one block combines them in a fixed
// order.
#include <cmath>
#include <type_traits>

#include "kiln/core/autograd.h"
#include "kiln/kernels/cuda/block_reduce.cuh"
#include "kiln/kernels/cuda/multi_tensor.cuh"
#include "kiln/kernels/cuda/multi_tensor_cuda.h"

namespace kiln::kernels::cuda {

using mt::chunks_of;
using mt::Item;
using mt::kBlock;
using mt::kListT;
using mt::kVec;
using mt::Launch;
using mt::ListMeta;
using mt::list_meta;
using mt::RunLength;
using mt::state_t;

namespace {

// ---------------------------------------------------------------- optimizer: arguments

constexpr int kOptT = 40;  // tensors per optimizer launch

struct OptimMeta {
  mt::ChunkMap<kOptT> map;
  void* p[kOptT];         // params (storage type P)
  const void* g[kOptT];   // grads (P)
  void* m[kOptT];         // exp_avg / momentum buffer (state type S), null when unused
  void* v[kOptT];         // exp_avg_sq (S), null when unused
  float* w[kOptT];        // f32 master weights of f16/bf16 params, else null
  const double* step[kOptT];
  uint8_t fresh[kOptT];   // momentum buffer just created
  int32_t tensor_base;    // global tensor id of tensor 0 (per-tensor trust ratios)
  int64_t chunk_base;     // global chunk id of this launch's chunk 0 (per-chunk partials)
};

struct OptimArgs {
  math::OptimHyper h;
  const double* lr;
  const float* found_inf;    // null: no loss scaler
  const double* grad_scale;  // null: gradients are not scaled
  double* partials;          // LAMB/LARS pass 1: two per global chunk
  const double* trust;       // LAMB/LARS pass 2: one per global tensor
};

static_assert(sizeof(OptimMeta) + sizeof(OptimArgs) <= mt::kMaxParamBytes,
              "optimizer kernel arguments exceed the 4 KB parameter limit");

__device__ __forceinline__ bool skip_step(const float* found_inf) {
  return found_inf != nullptr && *found_inf != 0.0f;
}
__device__ __forceinline__ double inv_scale_of(const double* grad_scale) {
  return grad_scale != nullptr ? 1.0 / *grad_scale : 1.0;
}

// The element loop of every optimizer pass over elements [begin, end) of tensor t:
// f(x, g, m, v) with x the f32/f64 weight (the master copy for f16/bf16 params), g the gradient, m
// and v the state, all in the state type S. Operands a pass does not use are neither read nor
// written (HasG/HasM/HasV false: zero is passed); WriteX false leaves the weight unwritten (the
// norm passes).
template <class P, bool HasG, bool HasM, bool HasV, bool WriteX, class F>
__device__ __forceinline__ void optim_chunk(const OptimMeta& a, int t, int64_t begin, int64_t end, F&& f) {
  using S = state_t<P>;
  constexpr bool kMaster = !std::is_same_v<P, S>;
  P* p = static_cast<P*>(a.p[t]);
  const P* g = HasG ? static_cast<const P*>(a.g[t]) : nullptr;
  S* m = HasM ? static_cast<S*>(a.m[t]) : nullptr;
  S* v = HasV ? static_cast<S*>(a.v[t]) : nullptr;
  float* w = kMaster ? a.w[t] : nullptr;
  const bool vec = mt::vec_aligned(p) && mt::vec_aligned(g) && mt::vec_aligned(m) && mt::vec_aligned(v) &&
                   mt::vec_aligned(w);
  mt::for_each_run(begin, end, vec, [&](auto len, int64_t i) {
    constexpr int N = decltype(len)::value;
    S x[N], gi[N], mi[N], vi[N];
    if constexpr (kMaster) {
      mt::load_n<N>(w + i, x);
    } else {
      mt::load_n<N>(p + i, x);
    }
    if constexpr (HasG) {
      P gr[N];
      mt::load_n<N>(g + i, gr);
#pragma unroll
      for (int j = 0; j < N; ++j) gi[j] = static_cast<S>(gr[j]);
    } else {
#pragma unroll
      for (int j = 0; j < N; ++j) gi[j] = S(0);
    }
    if constexpr (HasM) {
      mt::load_n<N>(m + i, mi);
    } else {
#pragma unroll
      for (int j = 0; j < N; ++j) mi[j] = S(0);
    }
    if constexpr (HasV) {
      mt::load_n<N>(v + i, vi);
    } else {
#pragma unroll
      for (int j = 0; j < N; ++j) vi[j] = S(0);
    }
#pragma unroll
    for (int j = 0; j < N; ++j) f(x[j], gi[j], mi[j], vi[j]);
    if constexpr (HasM) mt::store_n<N>(m + i, mi);
    if constexpr (HasV) mt::store_n<N>(v + i, vi);
    if constexpr (WriteX) {
      if constexpr (kMaster) {
        mt::store_n<N>(w + i, x);
        P pr[N];
#pragma unroll
        for (int j = 0; j < N; ++j) pr[j] = static_cast<P>(x[j]);
        mt::store_n<N>(p + i, pr);
      } else {
        mt::store_n<N>(p + i, x);
      }
    }
  });
}

// ---------------------------------------------------------------- optimizer: kernels

enum class Pass : int { Sgd, Adam, LarsApply, LambApply };

// The update pass. The per-tensor functor is built by every thread from the device scalars (a
// few double operations, negligible next to the chunk's memory traffic).
template <class P, Pass kPass, bool HasM>
__global__ void __launch_bounds__(kBlock) optim_update_kernel(OptimMeta a, OptimArgs s) {
  if (skip_step(s.found_inf)) return;
  using S = state_t<P>;
  const int t = mt::tensor_of(a.map, blockIdx.x);
  int64_t begin, end;
  mt::chunk_range(a.map, t, begin, end);
  const double lr = *s.lr;
  const double inv = inv_scale_of(s.grad_scale);
  const double step = *a.step[t] + 1.0;
  const bool fresh = a.fresh[t] != 0;
  if constexpr (kPass == Pass::Sgd) {
    const math::SgdStep<S> f = math::make_sgd_step<S>(s.h, lr, fresh, inv);
    optim_chunk<P, true, HasM, false, true>(a, t, begin, end, f);
  } else if constexpr (kPass == Pass::Adam) {
    const math::AdamStep<S> f = math::make_adam_step<S>(s.h, lr, step, inv);
    optim_chunk<P, true, true, true, true>(a, t, begin, end, f);
  } else if constexpr (kPass == Pass::LarsApply) {
    const math::LarsStep<S> f = math::make_lars_step<S>(s.h, lr, fresh, inv, s.trust[a.tensor_base + t]);
    optim_chunk<P, true, HasM, false, true>(a, t, begin, end, f);
  } else {
    math::LambStep<S> f = math::make_lamb_step<S>(s.h, step, inv);
    f.lr_trust = static_cast<S>(lr * s.trust[a.tensor_base + t]);
    optim_chunk<P, false, true, true, true>(a, t, begin, end, [&f](S& x, S, S& m, S& v) { f.apply(x, m, v); });
  }
}

// LAMB pass 1: moments in place, and per chunk (sum r^2, sum w^2) of the direction r and weight w.
template <class P>
__global__ void __launch_bounds__(kBlock) lamb_moments_kernel(OptimMeta a, OptimArgs s) {
  if (skip_step(s.found_inf)) return;
  using S = state_t<P>;
  const int t = mt::tensor_of(a.map, blockIdx.x);
  int64_t begin, end;
  mt::chunk_range(a.map, t, begin, end);
  const math::LambStep<S> f = math::make_lamb_step<S>(s.h, *a.step[t] + 1.0, inv_scale_of(s.grad_scale));
  double r2 = 0.0, w2 = 0.0;
  optim_chunk<P, true, true, true, false>(a, t, begin, end, [&](S& x, S g, S& m, S& v) {
    const S r = f.moments(x, g, m, v);
    r2 += static_cast<double>(r) * static_cast<double>(r);
    w2 += static_cast<double>(x) * static_cast<double>(x);
  });
  r2 = block_reduce(r2, SumOp(), 0.0);
  w2 = block_reduce(w2, SumOp(), 0.0);
  if (threadIdx.x == 0) {
    s.partials[2 * (a.chunk_base + blockIdx.x)] = r2;
    s.partials[2 * (a.chunk_base + blockIdx.x) + 1] = w2;
  }
}

// LARS pass 1: per chunk (sum w^2, sum g^2) of the weight and the raw (still scaled) gradient.
template <class P>
__global__ void __launch_bounds__(kBlock) lars_norms_kernel(OptimMeta a, OptimArgs s) {
  if (skip_step(s.found_inf)) return;
  using S = state_t<P>;
  const int t = mt::tensor_of(a.map, blockIdx.x);
  int64_t begin, end;
  mt::chunk_range(a.map, t, begin, end);
  double w2 = 0.0, g2 = 0.0;
  optim_chunk<P, true, false, false, false>(a, t, begin, end, [&](S& x, S g, S&, S&) {
    w2 += static_cast<double>(x) * static_cast<double>(x);
    g2 += static_cast<double>(g) * static_cast<double>(g);
  });
  w2 = block_reduce(w2, SumOp(), 0.0);
  g2 = block_reduce(g2, SumOp(), 0.0);
  if (threadIdx.x == 0) {
    s.partials[2 * (a.chunk_base + blockIdx.x)] = w2;
    s.partials[2 * (a.chunk_base + blockIdx.x) + 1] = g2;
  }
}

constexpr int kTrustT = 256;  // tensors per trust-ratio launch

struct TrustMeta {
  int32_t ntensors;
  int32_t tensor_base;
  int64_t chunk_begin[kTrustT + 1];  // global chunk ids: tensor k owns [chunk_begin[k], chunk_begin[k + 1])
};
static_assert(sizeof(TrustMeta) + sizeof(OptimArgs) + sizeof(void*) <= mt::kMaxParamBytes, "TrustMeta too large");

// One thread per tensor sums its chunks' partials in chunk order (deterministic) and writes the
// tensor's trust ratio.
__global__ void trust_ratio_kernel(TrustMeta tm, OptimArgs s, double* trust) {
  if (skip_step(s.found_inf)) return;
  const int k = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (k >= tm.ntensors) return;
  double a = 0.0, b = 0.0;
  for (int64_t c = tm.chunk_begin[k]; c < tm.chunk_begin[k + 1]; ++c) {
    a += s.partials[2 * c];
    b += s.partials[2 * c + 1];
  }
  double r;
  if (s.h.algo == math::OptimAlgo::LAMB) {
    r = math::lamb_trust_ratio(::sqrt(b), ::sqrt(a));  // (||w||, ||r||)
  } else {
    r = math::lars_trust_ratio(s.h, ::sqrt(a), ::sqrt(b) * ::fabs(inv_scale_of(s.grad_scale)));  // (||w||, ||g||)
  }
  trust[tm.tensor_base + k] = r;
}

constexpr int kStepT = 256;  // step tensors per increment launch

struct StepMeta {
  int32_t n;
  double* step[kStepT];
};

// Runs after the update passes: every step tensor of the call advances by exactly one.
__global__ void increment_steps_kernel(StepMeta sm, const float* found_inf) {
  if (skip_step(found_inf)) return;
  for (int k = threadIdx.x; k < sm.n; k += blockDim.x) *sm.step[k] += 1.0;
}

// ---------------------------------------------------------------- list kernels (norm, scale, lerp)

// Per chunk: sum of |x|^p (NormTerm), or max |x| when `inf` (NaN wins), accumulated in double.
template <class P>
__global__ void __launch_bounds__(kBlock) norm_partials_kernel(ListMeta<1> a, double p, bool inf, double* partials) {
  const int t = mt::tensor_of(a.map, blockIdx.x);
  int64_t begin, end;
  mt::chunk_range(a.map, t, begin, end);
  const P* x = static_cast<const P*>(a.ptr[0][t]);
  const math::NormTerm term{p};
  double acc = 0.0;
  mt::for_each_run(begin, end, mt::vec_aligned(x), [&](auto len, int64_t i) {
    constexpr int N = decltype(len)::value;
    P r[N];
    mt::load_n<N>(x + i, r);
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const double v = static_cast<double>(static_cast<opmath_t<P>>(r[j]));
      if (inf) acc = MaxOp()(acc, ::fabs(v));
      else acc += term(v);
    }
  });
  acc = inf ? block_reduce(acc, MaxOp(), 0.0) : block_reduce(acc, SumOp(), 0.0);
  if (threadIdx.x == 0) partials[a.chunk_base + blockIdx.x] = acc;
}

// One block combines the n partials in a fixed order (thread k takes k, k + kBlock, ...; then the
// block reduction's fixed tree) and writes the norm.
template <class Out>
__global__ void __launch_bounds__(kBlock) norm_final_kernel(const double* partials, int64_t n, double p, bool inf, Out* out) {
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc = inf ? MaxOp()(acc, partials[i]) : acc + partials[i];
  acc = inf ? block_reduce(acc, MaxOp(), 0.0) : block_reduce(acc, SumOp(), 0.0);
  if (threadIdx.x == 0) {
    double total = acc;
    if (!inf) total = p == 2.0 ? ::sqrt(total) : p == 1.0 ? total : ::pow(total, 1.0 / p);
    *out = static_cast<Out>(total);
  }
}

// x *= scale (read on the device), in the opmath type.
template <class P>
__global__ void __launch_bounds__(kBlock) scale_kernel(ListMeta<1> a, const double* scale) {
  using M = opmath_t<P>;
  const int t = mt::tensor_of(a.map, blockIdx.x);
  int64_t begin, end;
  mt::chunk_range(a.map, t, begin, end);
  P* x = static_cast<P*>(a.ptr[0][t]);
  const M k = static_cast<M>(*scale);
  mt::for_each_run(begin, end, mt::vec_aligned(x), [&](auto len, int64_t i) {
    constexpr int N = decltype(len)::value;
    P r[N];
    mt::load_n<N>(x + i, r);
#pragma unroll
    for (int j = 0; j < N; ++j) r[j] = static_cast<P>(static_cast<M>(r[j]) * k);
    mt::store_n<N>(x + i, r);
  });
}

// x = x + w (y - x) (math::LerpOp), in the opmath type.
template <class P>
__global__ void __launch_bounds__(kBlock) lerp_kernel(ListMeta<2> a, double weight) {
  using M = opmath_t<P>;
  const int t = mt::tensor_of(a.map, blockIdx.x);
  int64_t begin, end;
  mt::chunk_range(a.map, t, begin, end);
  P* x = static_cast<P*>(a.ptr[0][t]);
  const P* y = static_cast<const P*>(a.ptr[1][t]);
  const math::LerpOp<M> f{static_cast<M>(weight)};
  mt::for_each_run(begin, end, mt::vec_aligned(x) && mt::vec_aligned(y), [&](auto len, int64_t i) {
    constexpr int N = decltype(len)::value;
    P rx[N], ry[N];
    mt::load_n<N>(x + i, rx);
    mt::load_n<N>(y + i, ry);
#pragma unroll
    for (int j = 0; j < N; ++j) rx[j] = static_cast<P>(f(static_cast<M>(rx[j]), static_cast<M>(ry[j])));
    mt::store_n<N>(x + i, rx);
  });
}

// ---------------------------------------------------------------- host helpers

// A one-element tensor on `dev` holding t's value as `want` (a device cast when the dtype
// differs: asynchronous, no host read).
Tensor device_scalar(const Tensor& t, DType want, Device dev, const char* op, const char* what) {
  KILN_CHECK(t.numel() == 1, op, ": ", what, " must have one element, got sizes ", t.sizes());
  KILN_CHECK(t.device() == dev, op, ": ", what, " is on ", t.device(), " but the tensors are on ", dev);
  Tensor c = t.dtype() == want ? t : t.to(want);
  return c.is_contiguous() ? c : c.contiguous();
}

void check_cuda_tensor(const Tensor& t, Device dev, const char* op, size_t i) {
  KILN_CHECK(t.device().is_cuda() && t.device() == dev, op, ": tensor ", i, " is on ", t.device(),
             ", expected ", dev);
  KILN_CHECK(t.is_floating_point(), op, ": tensor ", i, " has dtype ", t.dtype(),
             "; expected a floating-point tensor");
}

void check_state(const Tensor& s, const Tensor& p, DType want, const char* what, size_t i) {
  KILN_CHECK(s.device() == p.device(), "fused_optimizer_step: ", what, "[", i, "] is on ", s.device(),
             ", parameter on ", p.device());
  KILN_CHECK(s.dtype() == want, "fused_optimizer_step: ", what, "[", i, "] has dtype ", s.dtype(),
             ", expected ", want, " for a ", p.dtype(), " parameter");
  KILN_CHECK(mt::same_layout(s, p), "fused_optimizer_step: ", what, "[", i, "] (sizes ", s.sizes(),
             " strides ", s.strides(), ") does not have the parameter's layout (sizes ", p.sizes(),
             " strides ", p.strides(), ")");
}

}  // namespace

// ---------------------------------------------------------------- fused optimizer step

void fused_optimizer_step(const math::OptimHyper& h, const MultiTensorLists& L, const StepScalars& sc) {
  using math::OptimAlgo;
  const char* op = "fused_optimizer_step";
  const size_t n = L.params.size();
  auto check_len = [&](const std::vector<Tensor>& v, const char* what) {
    KILN_CHECK(v.size() == n, op, ": ", n, " params but ", v.size(), " ", what);
  };
  check_len(L.grads, "grads");
  check_len(L.exp_avgs, "exp_avgs");
  check_len(L.exp_avg_sqs, "exp_avg_sqs");
  check_len(L.masters, "masters");
  check_len(L.steps, "steps");
  KILN_CHECK(L.fresh_momentum.empty() || L.fresh_momentum.size() == n, op,
             ": fresh_momentum must be empty or have one entry per param");
  const bool needs_m = h.algo == OptimAlgo::Adam || h.algo == OptimAlgo::LAMB || h.momentum != 0.0;
  const bool needs_v = h.algo == OptimAlgo::Adam || h.algo == OptimAlgo::LAMB;

  // ---- validate (as the CPU launcher does) and collect the parameters that have a gradient
  std::vector<int> active;
  Device dev = Device::cpu();
  for (size_t i = 0; i < n; ++i) {
    const Tensor& p = L.params[i];
    const Tensor& g = L.grads[i];
    if (!g.defined()) continue;
    KILN_CHECK(p.defined(), op, ": params[", i, "] is undefined");
    if (active.empty()) dev = p.device();
    KILN_CHECK(p.device().is_cuda() && p.device() == dev, op, " (CUDA): params[", i, "] is on ", p.device(),
               ", expected ", dev);
    KILN_CHECK(p.is_floating_point(), op, ": params[", i, "] has dtype ", p.dtype(),
               "; only floating-point parameters can be optimized");
    KILN_CHECK(mt::is_dense(p), op, ": params[", i, "] (sizes ", p.sizes(), " strides ", p.strides(),
               ") is not dense");
    KILN_CHECK(g.dtype() == p.dtype() && g.device() == p.device() && mt::same_layout(g, p), op, ": grads[", i,
               "] (", g.dtype(), ", ", g.device(), ", sizes ", g.sizes(), " strides ", g.strides(),
               ") must match its parameter (", p.dtype(), ", ", p.device(), ", sizes ", p.sizes(), " strides ",
               p.strides(), ")");
    const DType sdt = p.dtype() == DType::F64 ? DType::F64 : DType::F32;
    const bool half = p.dtype() == DType::F16 || p.dtype() == DType::BF16;
    if (needs_m) {
      KILN_CHECK(L.exp_avgs[i].defined(), op, ": exp_avgs[", i, "] is required");
      check_state(L.exp_avgs[i], p, sdt, "exp_avgs", i);
    }
    if (needs_v) {
      KILN_CHECK(L.exp_avg_sqs[i].defined(), op, ": exp_avg_sqs[", i, "] is required");
      check_state(L.exp_avg_sqs[i], p, sdt, "exp_avg_sqs", i);
    }
    if (half) {
      KILN_CHECK(L.masters[i].defined(), op, ": params[", i, "] is ", p.dtype(),
                 " and needs f32 master weights in masters[", i, "]");
      check_state(L.masters[i], p, DType::F32, "masters", i);
    } else {
      KILN_CHECK(!L.masters[i].defined(), op, ": masters[", i, "] is only for f16/bf16 parameters");
    }
    const Tensor& st = L.steps[i];
    KILN_CHECK(st.defined() && st.numel() == 1 && st.dtype() == DType::F64 && st.device() == dev, op,
               ": steps[", i, "] must be a one-element f64 tensor on ", dev);
    active.push_back(static_cast<int>(i));
  }
  if (active.empty()) return;

  // ---- the device-resident scalars, as pointers the kernels read
  KILN_CHECK(sc.lr.defined(), op, ": the learning-rate tensor is undefined");
  const Tensor lr = device_scalar(sc.lr, DType::F64, dev, op, "lr");
  const Tensor found_inf = sc.found_inf.defined() ? device_scalar(sc.found_inf, DType::F32, dev, op, "found_inf") : Tensor();
  const Tensor grad_scale = sc.grad_scale.defined() ? device_scalar(sc.grad_scale, DType::F64, dev, op, "grad_scale") : Tensor();

  DeviceGuard guard(L.params[active.front()]);
  cudaStream_t stream = stream_for(L.params[active.front()]);

  OptimArgs s{};
  s.h = h;
  s.lr = lr.data_ptr<double>();
  s.found_inf = found_inf.defined() ? found_inf.data_ptr<float>() : nullptr;
  s.grad_scale = grad_scale.defined() ? grad_scale.data_ptr<double>() : nullptr;

  // ---- launches over the non-empty tensors
  std::vector<Item> items;
  for (int i : active)
    if (L.params[i].numel() > 0) items.push_back({L.params[i].numel(), L.params[i].dtype(), i});
  int64_t total_chunks = 0;
  const std::vector<Launch> launches = mt::plan_launches(items, kOptT, &total_chunks);
  auto fresh = [&](int i) { return !L.fresh_momentum.empty() && L.fresh_momentum[i] != 0; };
  auto meta_of = [&](const Launch& l, int& grid) {
    OptimMeta a{};
    grid = mt::fill_map(a.map, items, l);
    a.tensor_base = static_cast<int32_t>(l.begin);
    a.chunk_base = l.chunk_base;
    for (size_t k = 0; k < l.end - l.begin; ++k) {
      const int i = items[l.begin + k].index;
      a.p[k] = L.params[i].data_ptr();
      a.g[k] = L.grads[i].data_ptr();
      a.m[k] = needs_m ? L.exp_avgs[i].data_ptr() : nullptr;
      a.v[k] = needs_v ? L.exp_avg_sqs[i].data_ptr() : nullptr;
      a.w[k] = L.masters[i].defined() ? L.masters[i].data_ptr<float>() : nullptr;
      a.step[k] = L.steps[i].data_ptr<double>();
      a.fresh[k] = fresh(i) ? 1 : 0;
    }
    return a;
  };
  // Runs launch(TypeTag<P>, meta, grid) for every launch.
  auto for_each_launch = [&](auto launch) {
    for (const Launch& l : launches) {
      int grid = 0;
      const OptimMeta a = meta_of(l, grid);
      dispatch_floating(items[l.begin].dtype, op, [&](auto tag) { launch(tag, a, grid); });
    }
  };

  const bool momentum = h.momentum != 0.0;
  Tensor partials, trust;
  if (h.algo == OptimAlgo::LAMB || h.algo == OptimAlgo::LARS) {
    // pass 1: two partial sums per chunk
    partials = empty({std::max<int64_t>(1, 2 * total_chunks)}, TensorOptions().dtype(DType::F64).device(dev));
    trust = empty({std::max<int64_t>(1, static_cast<int64_t>(items.size()))}, TensorOptions().dtype(DType::F64).device(dev));
    s.partials = partials.data_ptr<double>();
    s.trust = trust.data_ptr<double>();
    for_each_launch([&](auto tag, const OptimMeta& a, int grid) {
      using P = typename decltype(tag)::type;
      if (h.algo == OptimAlgo::LAMB) {
        lamb_moments_kernel<P><<<grid, kBlock, 0, stream>>>(a, s);
        KILN_CUDA_CHECK_LAUNCH("lamb_moments_kernel");
      } else {
        lars_norms_kernel<P><<<grid, kBlock, 0, stream>>>(a, s);
        KILN_CUDA_CHECK_LAUNCH("lars_norms_kernel");
      }
    });
    // per-tensor trust ratios from the partials, summed in chunk order
    std::vector<int64_t> first_chunk(items.size() + 1, 0);
    for (size_t k = 0; k < items.size(); ++k) first_chunk[k + 1] = first_chunk[k] + chunks_of(items[k].numel);
    for (size_t b = 0; b < items.size(); b += kTrustT) {
      TrustMeta tm{};
      tm.ntensors = static_cast<int32_t>(std::min<size_t>(kTrustT, items.size() - b));
      tm.tensor_base = static_cast<int32_t>(b);
      for (int k = 0; k <= tm.ntensors; ++k) tm.chunk_begin[k] = first_chunk[b + k];
      trust_ratio_kernel<<<(tm.ntensors + 127) / 128, 128, 0, stream>>>(tm, s, trust.data_ptr<double>());
      KILN_CUDA_CHECK_LAUNCH("trust_ratio_kernel");
    }
  }

  // ---- the update pass
  for_each_launch([&](auto tag, const OptimMeta& a, int grid) {
    using P = typename decltype(tag)::type;
    switch (h.algo) {
      case OptimAlgo::SGD:
        if (momentum) optim_update_kernel<P, Pass::Sgd, true><<<grid, kBlock, 0, stream>>>(a, s);
        else optim_update_kernel<P, Pass::Sgd, false><<<grid, kBlock, 0, stream>>>(a, s);
        break;
      case OptimAlgo::Adam:
        optim_update_kernel<P, Pass::Adam, true><<<grid, kBlock, 0, stream>>>(a, s);
        break;
      case OptimAlgo::LARS:
        if (momentum) optim_update_kernel<P, Pass::LarsApply, true><<<grid, kBlock, 0, stream>>>(a, s);
        else optim_update_kernel<P, Pass::LarsApply, false><<<grid, kBlock, 0, stream>>>(a, s);
        break;
      case OptimAlgo::LAMB:
        optim_update_kernel<P, Pass::LambApply, true><<<grid, kBlock, 0, stream>>>(a, s);
        break;
    }
    KILN_CUDA_CHECK_LAUNCH("optim_update_kernel");
  });

  // ---- every step tensor (empty parameters included) advances once, after all passes read it
  for (size_t b = 0; b < active.size(); b += kStepT) {
    StepMeta sm{};
    sm.n = static_cast<int32_t>(std::min<size_t>(kStepT, active.size() - b));
    for (int k = 0; k < sm.n; ++k) sm.step[k] = L.steps[active[b + k]].data_ptr<double>();
    increment_steps_kernel<<<1, 256, 0, stream>>>(sm, s.found_inf);
    KILN_CUDA_CHECK_LAUNCH("increment_steps_kernel");
  }
  for (int i : active) L.params[i].storage()->bump_version();  // in-place writes
}

// ---------------------------------------------------------------- norm, scale, lerp

Tensor multi_tensor_norm(const std::vector<Tensor>& tensors, double norm_type) {
  const char* op = "multi_tensor_norm";
  KILN_CHECK(norm_type > 0, op, ": norm_type must be positive (or inf), got ", norm_type);
  const bool inf = std::isinf(norm_type);
  NoGradGuard ng;
  bool any_f64 = false;
  Device dev = Device::cpu();
  std::vector<Tensor> dense(tensors.size());
  std::vector<Item> items;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    KILN_CHECK(t.defined(), op, ": tensor ", i, " is undefined");
    if (i == 0) dev = t.device();
    check_cuda_tensor(t, dev, op, i);
    any_f64 |= t.dtype() == DType::F64;
    dense[i] = mt::is_dense(t) ? t : t.contiguous();
    if (t.numel() > 0) items.push_back({t.numel(), t.dtype(), static_cast<int>(i)});
  }
  const DType out_dtype = any_f64 ? DType::F64 : DType::F32;
  if (items.empty()) return zeros({}, TensorOptions().dtype(out_dtype).device(dev));
  DeviceGuard guard(dense[items.front().index]);
  cudaStream_t stream = stream_for(dense[items.front().index]);
  int64_t total_chunks = 0;
  const std::vector<Launch> launches = mt::plan_launches(items, kListT, &total_chunks);
  Tensor partials = empty({total_chunks}, TensorOptions().dtype(DType::F64).device(dev));
  const std::vector<Tensor>* lists[1] = {&dense};
  for (const Launch& l : launches) {
    int grid = 0;
    const ListMeta<1> a = list_meta<1>(items, l, lists, grid);
    dispatch_floating(items[l.begin].dtype, op, [&](auto tag) {
      using P = typename decltype(tag)::type;
      norm_partials_kernel<P><<<grid, kBlock, 0, stream>>>(a, norm_type, inf, partials.data_ptr<double>());
      KILN_CUDA_CHECK_LAUNCH("norm_partials_kernel");
    });
  }
  Tensor out = empty({}, TensorOptions().dtype(out_dtype).device(dev));
  if (any_f64) {
    norm_final_kernel<double><<<1, kBlock, 0, stream>>>(partials.data_ptr<double>(), total_chunks, norm_type, inf,
                                                        out.data_ptr<double>());
  } else {
    norm_final_kernel<float><<<1, kBlock, 0, stream>>>(partials.data_ptr<double>(), total_chunks, norm_type, inf,
                                                       out.data_ptr<float>());
  }
  KILN_CUDA_CHECK_LAUNCH("norm_final_kernel");
  return out;
}

void multi_tensor_scale_(const std::vector<Tensor>& tensors, const Tensor& scale) {
  const char* op = "multi_tensor_scale_";
  if (tensors.empty()) return;
  KILN_CHECK(scale.defined(), op, ": scale is undefined");
  NoGradGuard ng;
  Device dev = Device::cpu();
  // Non-dense tensors are scaled in a dense copy, then copied back.
  std::vector<Tensor> work(tensors.size());
  std::vector<std::pair<Tensor, Tensor>> copy_back;
  std::vector<Item> items;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    KILN_CHECK(t.defined(), op, ": tensor ", i, " is undefined");
    if (i == 0) dev = t.device();
    check_cuda_tensor(t, dev, op, i);
    work[i] = mt::is_dense(t) ? t : t.contiguous();
    if (!mt::is_dense(t)) copy_back.emplace_back(t, work[i]);
    if (t.numel() > 0) items.push_back({t.numel(), t.dtype(), static_cast<int>(i)});
  }
  if (items.empty()) return;
  const Tensor k = device_scalar(scale, DType::F64, dev, op, "scale");
  DeviceGuard guard(work[items.front().index]);
  cudaStream_t stream = stream_for(work[items.front().index]);
  const std::vector<Tensor>* lists[1] = {&work};
  for (const Launch& l : mt::plan_launches(items, kListT)) {
    int grid = 0;
    const ListMeta<1> a = list_meta<1>(items, l, lists, grid);
    dispatch_floating(items[l.begin].dtype, op, [&](auto tag) {
      using P = typename decltype(tag)::type;
      scale_kernel<P><<<grid, kBlock, 0, stream>>>(a, k.data_ptr<double>());
      KILN_CUDA_CHECK_LAUNCH("scale_kernel");
    });
  }
  for (auto& [orig, dense] : copy_back) {
    Tensor o = orig;
    o.copy_(dense);
  }
  for (const Item& it : items) tensors[it.index].storage()->bump_version();
}

void multi_tensor_lerp_(const std::vector<Tensor>& dst, const std::vector<Tensor>& src, double weight) {
  const char* op = "multi_tensor_lerp_";
  KILN_CHECK(dst.size() == src.size(), op, ": ", dst.size(), " destinations but ", src.size(), " sources");
  if (dst.empty()) return;
  NoGradGuard ng;
  Device dev = Device::cpu();
  std::vector<Item> items;
  for (size_t i = 0; i < dst.size(); ++i) {
    const Tensor& d = dst[i];
    const Tensor& s = src[i];
    KILN_CHECK(d.defined() && s.defined(), op, ": pair ", i, " has an undefined tensor");
    if (i == 0) dev = d.device();
    check_cuda_tensor(d, dev, op, i);
    check_cuda_tensor(s, dev, op, i);
    KILN_CHECK(d.dtype() == s.dtype() && d.sizes() == s.sizes(), op, ": pair ", i,
               " must share dtype and sizes, got ", d.dtype(), " ", d.sizes(), " and ", s.dtype(), " ", s.sizes());
    if (!mt::is_dense(d) || !mt::same_layout(d, s)) {  // rare: the strided pointwise path
      const_cast<Tensor&>(d).add_(s - d, weight);
      continue;
    }
    if (d.numel() > 0) items.push_back({d.numel(), d.dtype(), static_cast<int>(i)});
  }
  if (items.empty()) return;
  DeviceGuard guard(dst[items.front().index]);
  cudaStream_t stream = stream_for(dst[items.front().index]);
  const std::vector<Tensor>* lists[2] = {&dst, &src};
  for (const Launch& l : mt::plan_launches(items, kListT)) {
    int grid = 0;
    const ListMeta<2> a = list_meta<2>(items, l, lists, grid);
    dispatch_floating(items[l.begin].dtype, op, [&](auto tag) {
      using P = typename decltype(tag)::type;
      lerp_kernel<P><<<grid, kBlock, 0, stream>>>(a, weight);
      KILN_CUDA_CHECK_LAUNCH("lerp_kernel");
    });
  }
  for (const Item& it : items) dst[it.index].storage()->bump_version();
}

}  // namespace kiln::kernels::cuda
