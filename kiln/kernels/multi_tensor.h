#pragma once
// Multi-tensor kernels: one call walks a whole list of tensors (every parameter of a group, every
// gradient) in fixed-size chunks, instead of a few kernels per tensor.
//
// This header holds
//   - what an optimizer step hands to a backend: the tensor lists (MultiTensorLists), the scalars
//     read from device tensors (StepScalars), and what a rule gets per tensor (UpdateScalars);
//   - the kernel family of an optimizer step (MultiTensorStep<Rule>) and the list kernels
//     (multi_tensor_norm, multi_tensor_scale_, multi_tensor_lerp_), routed by kernels/dispatch.h;
//   - the generic CPU launcher, cpu::multi_tensor_step<Rule>, that runs any update rule.
// The CUDA launcher is kernels/cuda/multi_tensor.cuh. The update rules themselves live with their
// optimizers (kiln/optim/<name>.h); see docs/architecture.md, "Optimizers".
//
// An update rule is a host/device struct holding the group's hyper-parameters, built from the
// optimizer's options (explicit Rule(const Options&)), with
//   static constexpr const char* kStepName       the kernel's name, for errors ("adamw_step")
//   static constexpr int kMaxBuffers             per-element state tensors it may use (0..2)
//   static constexpr bool kPerTensorNorms        true: a first pass computes per-tensor norms
//   static constexpr bool kUpdateReadsGrad       false: the update pass does not read the gradient
//   int num_buffers() const                      buffers used with these options (<= kMaxBuffers)
//   template <class T> update(const UpdateScalars&) const
//       -> a functor f(T& w, T g, T& b0, T& b1) that updates one element in the opmath type T:
//          w the weight (f32 master copy for 16-bit parameters), g the gradient, b0/b1 the buffers
// and, when kPerTensorNorms,
//   static constexpr int kNormPassBuffers        buffers the norm pass reads and writes
//   template <class T> norm_terms(const UpdateScalars&) const
//       -> a functor NormTerms f(T w, T g, T& b0, T& b1): one element's contribution to the sums
//   double trust_ratio(NormTerms sums, double inv_grad_scale) const
//       -> the tensor's trust ratio from the sums over its elements, handed to update() as `trust`.
//
// Every per-step value that changes during training - the learning rate, each parameter's step
// count, the loss scaler's found-inf flag and grad scale - is read from a tensor on the
// parameters' device, where the launcher runs, so a step never waits for the host and can be
// captured in a CUDA graph.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/core/macros.h"
#include "kiln/core/optimizer_rule.h"
#include "kiln/core/tensor.h"
#include "kiln/kernels/dispatch.h"
#include "kiln/kernels/pointwise.h"

namespace kiln::math {

// Per-element contribution to a p-norm: |x|^p (p = 2: x^2, p = 1: |x|); the inf norm uses max |x|.
struct NormTerm {
  double p;
  template <class T> KILN_INLINE T operator()(T x) const {
    T a = x < T(0) ? -x : x;
    if (p == 2.0) return x * x;
    if (p == 1.0) return a;
    return pow(a, T(p));
  }
};

// The per-element lerp of multi_tensor_lerp_, shared by both launchers: x + w (y - x).
template <class T> struct LerpOp {
  T w;
  KILN_INLINE T operator()(T x, T y) const { return x + w * (y - x); }
};

}  // namespace kiln::math

namespace kiln::kernels {

inline constexpr int kMaxOptimizerBuffers = 2;

// The tensors one optimizer step reads and writes. Entry i of every list belongs to parameter i;
// a parameter whose grads[i] is undefined is skipped (its step does not advance).
//   params      any floating dtype; dense (contiguous, or any permutation of contiguous strides)
//   grads       same dtype, sizes and strides as params[i]
//   buffers[k]  the rule's per-element state in its order (Adam: exp_avg, exp_avg_sq; SGD:
//               momentum_buffer); the first rule.num_buffers() lists are required, the others
//               ignored. dtype: f32 for f32/f16/bf16 params, f64 for f64 params; the param's strides
//   masters     f32 master weights for f16/bf16 params (updated, then rounded into params[i]);
//               undefined for f32/f64 params
//   steps       one-element f64 tensors, each parameter's step count; the call adds 1 (the update
//               uses the incremented value, as PyTorch does)
//   fresh_buffers  optional (empty or one per param): nonzero where the buffers were just created,
//               so a momentum rule sets buf = d instead of blending (PyTorch's first step)
struct MultiTensorLists {
  std::vector<Tensor> params, grads, masters, steps;
  std::vector<Tensor> buffers[kMaxOptimizerBuffers];
  std::vector<uint8_t> fresh_buffers;
};

// Scalars read from device tensors. lr: one element (any float dtype, f64 preferred so f64
// parameters get an exact lr). found_inf (optional): one element; when nonzero the call changes
// nothing (no parameter, state or step update). grad_scale (optional): one element; gradients are
// multiplied by 1 / grad_scale before use (the loss scaler's unscale fused into the step).
struct StepScalars {
  Tensor lr;
  Tensor found_inf;
  Tensor grad_scale;
};

// The kernel family of one optimizer's step, and the one kernel of it per update rule,
// step_kernel<AdamWRule>, named by the rule's kStepName. The optimizer's .cpp registers the CPU
// launcher for it, its .cu the CUDA one (constexpr-constructed, so registration order is safe).
template <class Rule> using MultiTensorStep = Kernel<void(const Rule&, const MultiTensorLists&, const StepScalars&)>;
template <class Rule> inline MultiTensorStep<Rule> step_kernel{Rule::kStepName};

// Runs `step` on the device of the lists' tensors (all of them must share it).
template <class Rule>
void run_multi_tensor_step(const MultiTensorStep<Rule>& step, const Rule& rule, const MultiTensorLists& lists,
                           const StepScalars& scalars) {
  const Device device = operand_device(step.name(), lists.params, lists.grads, lists.masters, lists.steps,
                                       lists.buffers[0], lists.buffers[1]);
  step.on(device, rule, lists, scalars);
}

// The p-norm of all tensors together, (sum_i sum_j |t_ij|^p)^(1/p) (max |t_ij| for p = inf), in
// one multi-tensor reduction, returned as a 0-dim tensor on the tensors' device: f64 when any
// tensor is f64, else f32. NaN in any tensor gives NaN. Partial sums are combined in a fixed order,
// so the result does not depend on the thread count. The list must not be empty (it names the
// device); a list of empty tensors gives 0.
inline Kernel<Tensor(const std::vector<Tensor>&, double)> multi_tensor_norm{"multi_tensor_norm"};

// tensors[i] *= scale (a one-element tensor on the same device, read where the kernel runs), in
// one multi-tensor pass. The arithmetic is done in each tensor's opmath type.
inline Kernel<void(const std::vector<Tensor>&, const Tensor&)> multi_tensor_scale_{"multi_tensor_scale_"};

// dst[i] += weight * (src[i] - dst[i]) for every pair, in one multi-tensor pass (the EMA update:
// weight = 1 - decay). dst[i] and src[i] share dtype, sizes and device; the arithmetic is done in
// the opmath type (math::LerpOp). weight is a host value: it changes on the host (EMA warm-up),
// not on the device.
inline Kernel<void(const std::vector<Tensor>&, const std::vector<Tensor>&, double)> multi_tensor_lerp_{
    "multi_tensor_lerp_"};

// ---------------------------------------------------------------- shared by both launchers

// Non-overlapping and dense: some permutation of the dimensions is contiguous, so the elements
// occupy numel consecutive slots starting at data_ptr().
inline bool is_dense(const Tensor& t) {
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
inline bool same_layout(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes()) return false;
  for (int64_t d = 0; d < a.dim(); ++d)
    if (a.size(d) != 1 && a.stride(d) != b.stride(d)) return false;
  return true;
}

// The rare strided cases of the multi-tensor kernels, through the strided pointwise kernels:
// t *= s, and d += weight * (s - d). Both bump the version counter as an in-place op does.
inline void scale_strided_(const Tensor& t, double s) {
  unary(UnaryOp::MulScalar, t, t, s, 0.0);
  t.storage()->bump_version();
}
inline void lerp_strided_(const Tensor& d, const Tensor& s, double weight) {
  Tensor diff = empty(d.sizes(), TensorOptions().dtype(d.dtype()).device(d.device()));
  binary(BinaryOp::Sub, diff, s, d, 1.0, 0.0);
  binary(BinaryOp::Add, d, d, diff, weight, 0.0);
  d.storage()->bump_version();
}

namespace detail {
inline void check_step_state(const char* op, const Tensor& s, const Tensor& p, DType want, const char* what, size_t i) {
  KILN_CHECK(s.device() == p.device(), op, ": ", what, "[", i, "] is on ", s.device(), ", parameter on ", p.device());
  KILN_CHECK(s.dtype() == want, op, ": ", what, "[", i, "] has dtype ", s.dtype(), ", expected ", want, " for a ",
             p.dtype(), " parameter");
  KILN_CHECK(same_layout(s, p), op, ": ", what, "[", i, "] (sizes ", s.sizes(), " strides ", s.strides(),
             ") does not have the parameter's layout (sizes ", p.sizes(), " strides ", p.strides(), ")");
}
}  // namespace detail

// Checks the lists of one step against the contract above; returns the indices of the
// parameters that have a gradient.
inline std::vector<int32_t> check_step_lists(const char* op, const MultiTensorLists& L, int num_buffers) {
  const size_t n = L.params.size();
  auto check_len = [&](const std::vector<Tensor>& v, const char* what) {
    KILN_CHECK(v.size() == n, op, ": ", n, " params but ", v.size(), " ", what);
  };
  check_len(L.grads, "grads");
  check_len(L.masters, "masters");
  check_len(L.steps, "steps");
  for (int k = 0; k < num_buffers; ++k) check_len(L.buffers[k], "buffers");
  KILN_CHECK(L.fresh_buffers.empty() || L.fresh_buffers.size() == n, op,
             ": fresh_buffers must be empty or have one entry per param");
  std::vector<int32_t> active;
  for (size_t i = 0; i < n; ++i) {
    const Tensor& p = L.params[i];
    const Tensor& g = L.grads[i];
    if (!g.defined()) continue;
    KILN_CHECK(p.defined(), op, ": params[", i, "] is undefined");
    KILN_CHECK(p.is_floating_point(), op, ": params[", i, "] has dtype ", p.dtype(),
               "; only floating-point parameters can be optimized");
    KILN_CHECK(is_dense(p), op, ": params[", i, "] (sizes ", p.sizes(), " strides ", p.strides(), ") is not dense");
    KILN_CHECK(g.dtype() == p.dtype() && g.device() == p.device() && same_layout(g, p), op, ": grads[", i, "] (",
               g.dtype(), ", ", g.device(), ", sizes ", g.sizes(), " strides ", g.strides(),
               ") must match its parameter (", p.dtype(), ", ", p.device(), ", sizes ", p.sizes(), " strides ",
               p.strides(), ")");
    const DType state_dtype = p.dtype() == DType::F64 ? DType::F64 : DType::F32;
    for (int k = 0; k < num_buffers; ++k) {
      KILN_CHECK(L.buffers[k][i].defined(), op, ": buffers[", k, "][", i, "] is required");
      detail::check_step_state(op, L.buffers[k][i], p, state_dtype, "buffers", i);
    }
    if (p.dtype() == DType::F16 || p.dtype() == DType::BF16) {
      KILN_CHECK(L.masters[i].defined(), op, ": params[", i, "] is ", p.dtype(),
                 " and needs f32 master weights in masters[", i, "]");
      detail::check_step_state(op, L.masters[i], p, DType::F32, "masters", i);
    } else {
      KILN_CHECK(!L.masters[i].defined(), op, ": masters[", i, "] is only for f16/bf16 parameters");
    }
    const Tensor& st = L.steps[i];
    KILN_CHECK(st.defined() && st.numel() == 1 && st.dtype() == DType::F64 && st.device() == p.device(), op, ": steps[",
               i, "] must be a one-element f64 tensor on ", p.device());
    active.push_back(static_cast<int32_t>(i));
  }
  return active;
}

// State (and master-weight) type for a parameter storage type: double for f64, else float.
template <class P> struct state_of { using type = float; };
template <> struct state_of<double> { using type = double; };
template <class P> using state_t = typename state_of<P>::type;

}  // namespace kiln::kernels

// ---------------------------------------------------------------- the CPU launcher
// Host compilers only: CUDA files include this header for the types above, and nvcc's host pass
// is not compiled with OpenMP.
#if !defined(__CUDACC__)
namespace kiln::kernels::cpu {

// How it is fast: a per-parameter loop of tensor ops makes ~10 passes over memory per parameter
// (and allocates temporaries); here each element of param, grad and state is read once and written
// once (rules with per-tensor norms: one extra pass for the norms). All tensors are cut into
// 64K-element chunks, and the chunks of all tensors together are spread over the OpenMP threads,
// so small tensors (biases, norms) do not leave threads idle. Inside a chunk the loop runs over
// plain pointers under `omp simd`; the rules' functors are branch-free on loop-invariant flags, so
// the compiler vectorizes them. Norm partial sums are kept per chunk and combined in chunk order,
// so the result is independent of the thread count.
namespace multi_tensor_detail {

constexpr int64_t kChunk = int64_t{1} << 16;
constexpr int64_t kParallelMin = 32768;

struct Chunk {
  int32_t tensor;
  int64_t begin, end;
};

inline std::vector<Chunk> make_chunks(const std::vector<int64_t>& numels, const std::vector<int32_t>& which) {
  std::vector<Chunk> chunks;
  for (int32_t t : which)
    for (int64_t b = 0; b < numels[t]; b += kChunk) chunks.push_back({t, b, std::min(numels[t], b + kChunk)});
  return chunks;
}

inline double read_scalar(const char* op, const Tensor& t, const char* what) {
  KILN_CHECK(t.numel() == 1, op, ": ", what, " must have one element, got sizes ", t.sizes());
  KILN_CHECK(t.device().is_cpu(), op, ": ", what, " is on ", t.device(), " but the parameters are on the CPU");
  return t.item<double>();
}

// The data of one parameter: weight, gradient, buffers, f32 master weights (16-bit params).
struct StepPointers {
  void* p = nullptr;
  const void* g = nullptr;
  void* buf[kMaxOptimizerBuffers] = {nullptr, nullptr};
  float* master = nullptr;
};

// Applies f(w, g, b0, b1) to elements [b, e) of one parameter, in the state type S; the first
// NBuf buffers are read and written, the others are zero. ReadGrad false passes g = 0.
template <class P, int NBuf, bool ReadGrad, class F>
void update_range(const StepPointers& q, int64_t b, int64_t e, const F& f) {
  using S = state_t<P>;
  constexpr bool kMaster = !std::is_same_v<P, S>;
  P* __restrict p = static_cast<P*>(q.p);
  const P* __restrict g = static_cast<const P*>(q.g);
  S* __restrict b0 = static_cast<S*>(q.buf[0]);
  S* __restrict b1 = static_cast<S*>(q.buf[1]);
  float* __restrict w = q.master;
#pragma omp simd
  for (int64_t i = b; i < e; ++i) {
    S x;
    if constexpr (kMaster) x = w[i];
    else x = p[i];
    S gi = S(0), s0 = S(0), s1 = S(0);
    if constexpr (ReadGrad) gi = static_cast<S>(g[i]);
    if constexpr (NBuf > 0) s0 = b0[i];
    if constexpr (NBuf > 1) s1 = b1[i];
    f(x, gi, s0, s1);
    if constexpr (NBuf > 0) b0[i] = s0;
    if constexpr (NBuf > 1) b1[i] = s1;
    if constexpr (kMaster) {
      w[i] = x;
      p[i] = static_cast<P>(x);
    } else {
      p[i] = x;
    }
  }
}

// The norm pass over [b, e): f(w, g, b0, b1) may update the first NBuf buffers, not the weight;
// returns the sums of its NormTerms.
template <class P, int NBuf, class F> NormTerms norm_range(const StepPointers& q, int64_t b, int64_t e, const F& f) {
  using S = state_t<P>;
  constexpr bool kMaster = !std::is_same_v<P, S>;
  const P* __restrict p = static_cast<const P*>(q.p);
  const P* __restrict g = static_cast<const P*>(q.g);
  S* __restrict b0 = static_cast<S*>(q.buf[0]);
  S* __restrict b1 = static_cast<S*>(q.buf[1]);
  const float* __restrict w = q.master;
  double sa = 0, sb = 0;
#pragma omp simd reduction(+ : sa, sb)
  for (int64_t i = b; i < e; ++i) {
    S x;
    if constexpr (kMaster) x = w[i];
    else x = p[i];
    S s0 = S(0), s1 = S(0);
    if constexpr (NBuf > 0) s0 = b0[i];
    if constexpr (NBuf > 1) s1 = b1[i];
    const NormTerms t = f(x, static_cast<S>(g[i]), s0, s1);
    if constexpr (NBuf > 0) b0[i] = s0;
    if constexpr (NBuf > 1) b1[i] = s1;
    sa += t.a;
    sb += t.b;
  }
  return {sa, sb};
}

}  // namespace multi_tensor_detail

// One optimizer step with `rule` over every parameter of the lists (contract: MultiTensorLists).
template <class Rule> void multi_tensor_step(const Rule& rule, const MultiTensorLists& L, const StepScalars& sc) {
  using namespace multi_tensor_detail;
  const char* op = Rule::kStepName;
  const int nbuf = rule.num_buffers();
  KILN_CHECK(nbuf >= 0 && nbuf <= Rule::kMaxBuffers, op, ": the rule uses ", nbuf, " buffers");
  const std::vector<int32_t> active = check_step_lists(op, L, nbuf);
  if (active.empty()) return;
  const size_t n = L.params.size();

  // the device-resident scalars (on the CPU: a plain read)
  if (sc.found_inf.defined() && read_scalar(op, sc.found_inf, "found_inf") != 0.0) return;
  KILN_CHECK(sc.lr.defined(), op, ": the learning-rate tensor is undefined");
  const double lr = read_scalar(op, sc.lr, "lr");
  const double inv_scale = sc.grad_scale.defined() ? 1.0 / read_scalar(op, sc.grad_scale, "grad_scale") : 1.0;
  std::vector<UpdateScalars> scalars(n);
  std::vector<int64_t> numels(n, 0);
  std::vector<StepPointers> ptrs(n);
  for (int32_t i : active) {
    const bool fresh = !L.fresh_buffers.empty() && L.fresh_buffers[i] != 0;
    scalars[i] = UpdateScalars{lr, *L.steps[i].data_ptr<double>() + 1.0, inv_scale, fresh, 1.0};
    numels[i] = L.params[i].numel();
    StepPointers& q = ptrs[i];
    q.p = L.params[i].data_ptr();
    q.g = L.grads[i].data_ptr();
    for (int k = 0; k < nbuf; ++k) q.buf[k] = L.buffers[k][i].data_ptr();
    if (L.masters[i].defined()) q.master = L.masters[i].data_ptr<float>();
  }

  const std::vector<Chunk> chunks = make_chunks(numels, active);
  const int64_t nchunks = static_cast<int64_t>(chunks.size());
  int64_t total = 0;
  for (int32_t i : active) total += numels[i];
  const bool par = total >= kParallelMin && nchunks > 1;

  if constexpr (Rule::kPerTensorNorms) {
    std::vector<NormTerms> part(nchunks);
#pragma omp parallel for schedule(dynamic, 1) if (par)
    for (int64_t c = 0; c < nchunks; ++c) {
      const Chunk& ch = chunks[c];
      dispatch_floating(L.params[ch.tensor].dtype(), op, [&](auto tag) {
        using P = typename decltype(tag)::type;
        const auto f = rule.template norm_terms<state_t<P>>(scalars[ch.tensor]);
        part[c] = norm_range<P, Rule::kNormPassBuffers>(ptrs[ch.tensor], ch.begin, ch.end, f);
      });
    }
    std::vector<NormTerms> sums(n, NormTerms{0.0, 0.0});
    for (int64_t c = 0; c < nchunks; ++c) {  // fixed order: deterministic
      sums[chunks[c].tensor].a += part[c].a;
      sums[chunks[c].tensor].b += part[c].b;
    }
    for (int32_t i : active) scalars[i].trust = rule.trust_ratio(sums[i], inv_scale);
  }

#pragma omp parallel for schedule(dynamic, 1) if (par)
  for (int64_t c = 0; c < nchunks; ++c) {
    const Chunk& ch = chunks[c];
    dispatch_floating(L.params[ch.tensor].dtype(), op, [&](auto tag) {
      using P = typename decltype(tag)::type;
      constexpr bool kReadGrad = Rule::kUpdateReadsGrad;
      const auto f = rule.template update<state_t<P>>(scalars[ch.tensor]);
      const StepPointers& q = ptrs[ch.tensor];
      if constexpr (Rule::kMaxBuffers >= 2)
        if (nbuf == 2) return update_range<P, 2, kReadGrad>(q, ch.begin, ch.end, f);
      if constexpr (Rule::kMaxBuffers >= 1)
        if (nbuf == 1) return update_range<P, 1, kReadGrad>(q, ch.begin, ch.end, f);
      update_range<P, 0, kReadGrad>(q, ch.begin, ch.end, f);
    });
  }
  for (int32_t i : active) {
    *L.steps[i].data_ptr<double>() = scalars[i].step;
    L.params[i].storage()->bump_version();  // in-place writes, as an in-place op would record
  }
}

}  // namespace kiln::kernels::cpu
#endif  // !defined(__CUDACC__)
