// CUDA multi-tensor kernels: the global p-norm of a tensor list, in-place scale and lerp over a
// list - each a few launches for all tensors together (multi_tensor.cuh: chunk metadata in the
// kernel arguments, one block per chunk) - and the rule-independent host side of the optimizer
// step (StepLaunches), whose kernels are the templates of multi_tensor.cuh instantiated by each
// optimizer's .cu with its rule.
//
// What they compute: the same as the CPU versions (kernels/cpu/multi_tensor.cpp and the CPU
// launcher in kernels/multi_tensor.h), with the same per-element functors, so the CPU tests check
// the math. multi_tensor_norm: per-chunk partials, then one block combines them in a fixed order.
#include <cmath>
#include <type_traits>

#include "kiln/kernels/copy_fill.h"
#include "kiln/kernels/cuda/block_reduce.cuh"
#include "kiln/kernels/cuda/multi_tensor.cuh"

namespace kiln::kernels::cuda {

using mt::chunks_of;
using mt::Item;
using mt::kBlock;
using mt::kListT;
using mt::kVec;
using mt::Launch;
using mt::list_meta;
using mt::ListMeta;
using mt::RunLength;

namespace {

constexpr int kStepT = 256;  // step tensors per increment launch

struct StepMeta {
  int32_t n;
  double* step[kStepT];
};

// Runs after the update pass: every step tensor of the call advances by exactly one.
__global__ void increment_steps_kernel(StepMeta sm, const float* found_inf) {
  if (skip_step(found_inf)) return;
  for (int k = threadIdx.x; k < sm.n; k += blockDim.x) *sm.step[k] += 1.0;
}

// ---------------------------------------------------------------- list kernels (norm, scale, lerp)

// Per chunk: sum of |x|^p (NormTerm), or max |x| when `inf` (NaN wins), accumulated in double.
template <class P>
__global__ void __launch_bounds__(kBlock) norm_partials_kernel(ListMeta<1> a, double p, bool inf, double* partials) {
  const mt::Chunk ch = mt::block_chunk(a.map);
  const P* x = static_cast<const P*>(a.ptr[0][ch.t]);
  const math::NormTerm term{p};
  double acc = 0.0;
  mt::for_each_run(ch.begin, ch.end, mt::vec_aligned(x), [&](auto len, int64_t i) {
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
__global__ void __launch_bounds__(kBlock)
    norm_final_kernel(const double* partials, int64_t n, double p, bool inf, Out* out) {
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
template <class P> __global__ void __launch_bounds__(kBlock) scale_kernel(ListMeta<1> a, const double* scale) {
  using M = opmath_t<P>;
  const mt::Chunk ch = mt::block_chunk(a.map);
  P* x = static_cast<P*>(a.ptr[0][ch.t]);
  const M k = static_cast<M>(*scale);
  mt::update_in_place(x, ch.begin, ch.end, [&](P r) { return static_cast<P>(static_cast<M>(r) * k); });
}

// x = x + w (y - x) (math::LerpOp), in the opmath type.
template <class P> __global__ void __launch_bounds__(kBlock) lerp_kernel(ListMeta<2> a, double weight) {
  using M = opmath_t<P>;
  const mt::Chunk ch = mt::block_chunk(a.map);
  P* x = static_cast<P*>(a.ptr[0][ch.t]);
  const P* y = static_cast<const P*>(a.ptr[1][ch.t]);
  const math::LerpOp<M> f{static_cast<M>(weight)};
  mt::for_each_run(ch.begin, ch.end, mt::vec_aligned(x) && mt::vec_aligned(y), [&](auto len, int64_t i) {
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
  return contiguous(to_dtype(t, want));
}

void check_cuda_tensor(const Tensor& t, Device dev, const char* op, size_t i) {
  KILN_CHECK(t.device().is_cuda() && t.device() == dev, op, ": tensor ", i, " is on ", t.device(), ", expected ", dev);
  KILN_CHECK(t.is_floating_point(), op, ": tensor ", i, " has dtype ", t.dtype(), "; expected a floating-point tensor");
}

}  // namespace

// ---------------------------------------------------------------- the optimizer step's host side

StepLaunches::StepLaunches(const char* op, const MultiTensorLists& lists, int num_buffers, const StepScalars& scalars)
    : lists_(lists), num_buffers_(num_buffers) {
  for (int32_t i : check_step_lists(op, lists, num_buffers)) active_.push_back(i);
  if (active_.empty()) return;
  const Device dev = lists.params[active_.front()].device();
  KILN_CHECK(dev.is_cuda(), op, " (CUDA): the parameters are on ", dev);
  KILN_CHECK(scalars.lr.defined(), op, ": the learning-rate tensor is undefined");
  lr_ = device_scalar(scalars.lr, DType::F64, dev, op, "lr");
  if (scalars.found_inf.defined()) found_inf_ = device_scalar(scalars.found_inf, DType::F32, dev, op, "found_inf");
  if (scalars.grad_scale.defined()) grad_scale_ = device_scalar(scalars.grad_scale, DType::F64, dev, op, "grad_scale");
  for (int i : active_)
    if (lists.params[i].numel() > 0) items_.push_back({lists.params[i].numel(), lists.params[i].dtype(), i});
  launches_ = mt::plan_launches(items_, kOptT, &total_chunks_);
}

OptimMeta StepLaunches::meta(const Launch& l, int& grid) const {
  OptimMeta a{};
  grid = mt::fill_map(a.map, items_, l);
  a.tensor_base = static_cast<int32_t>(l.begin);
  a.chunk_base = l.chunk_base;
  for (size_t k = 0; k < l.end - l.begin; ++k) {
    const int i = items_[l.begin + k].index;
    a.p[k] = lists_.params[i].data_ptr();
    a.g[k] = lists_.grads[i].data_ptr();
    for (int b = 0; b < kMaxOptimizerBuffers; ++b)
      a.buf[b][k] = b < num_buffers_ ? lists_.buffers[b][i].data_ptr() : nullptr;
    a.w[k] = lists_.masters[i].defined() ? lists_.masters[i].data_ptr<float>() : nullptr;
    a.step[k] = lists_.steps[i].data_ptr<double>();
    a.fresh[k] = !lists_.fresh_buffers.empty() && lists_.fresh_buffers[i] != 0 ? 1 : 0;
  }
  return a;
}

void StepLaunches::allocate_norm_scratch() {
  const TensorOptions f64 = TensorOptions().dtype(DType::F64).device(first_param().device());
  partials_ = empty({std::max<int64_t>(1, 2 * total_chunks_)}, f64);
  trust_ = empty({std::max<int64_t>(1, static_cast<int64_t>(items_.size()))}, f64);
}

std::vector<TrustMeta> StepLaunches::trust_batches() const {
  std::vector<int64_t> first_chunk(items_.size() + 1, 0);
  for (size_t k = 0; k < items_.size(); ++k) first_chunk[k + 1] = first_chunk[k] + chunks_of(items_[k].numel);
  std::vector<TrustMeta> out;
  for (size_t b = 0; b < items_.size(); b += kTrustT) {
    TrustMeta tm{};
    tm.ntensors = static_cast<int32_t>(std::min<size_t>(kTrustT, items_.size() - b));
    tm.tensor_base = static_cast<int32_t>(b);
    for (int k = 0; k <= tm.ntensors; ++k) tm.chunk_begin[k] = first_chunk[b + k];
    out.push_back(tm);
  }
  return out;
}

void StepLaunches::finish(cudaStream_t stream) const {
  // every step tensor (empty parameters included) advances once, after all passes read it
  for (size_t b = 0; b < active_.size(); b += kStepT) {
    StepMeta sm{};
    sm.n = static_cast<int32_t>(std::min<size_t>(kStepT, active_.size() - b));
    for (int k = 0; k < sm.n; ++k) sm.step[k] = lists_.steps[active_[b + k]].data_ptr<double>();
    increment_steps_kernel<<<1, 256, 0, stream>>>(sm, found_inf());
    KILN_CUDA_CHECK_LAUNCH("increment_steps_kernel");
  }
  for (int i : active_) lists_.params[i].storage()->bump_version();  // in-place writes
}

namespace {

// ---------------------------------------------------------------- norm, scale, lerp

// The list of norm and scale_, checked (defined, floating, on one CUDA device: returned) and made
// dense: dense[i] is tensors[i] or, when that is not dense, a contiguous copy; items: the
// non-empty ones.
Device dense_list(const char* op, const std::vector<Tensor>& tensors, std::vector<Tensor>& dense,
                  std::vector<Item>& items) {
  Device dev = Device::cpu();
  dense.resize(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    KILN_CHECK(t.defined(), op, ": tensor ", i, " is undefined");
    if (i == 0) dev = t.device();
    check_cuda_tensor(t, dev, op, i);
    dense[i] = is_dense(t) ? t : contiguous(t);
    if (t.numel() > 0) items.push_back({t.numel(), t.dtype(), static_cast<int>(i)});
  }
  return dev;
}

Tensor norm(const std::vector<Tensor>& tensors, double norm_type) {
  const char* op = "multi_tensor_norm";
  KILN_CHECK(norm_type > 0, op, ": norm_type must be positive (or inf), got ", norm_type);
  const bool inf = std::isinf(norm_type);
  std::vector<Tensor> dense;
  std::vector<Item> items;
  const Device dev = dense_list(op, tensors, dense, items);
  bool any_f64 = false;
  for (const Tensor& t : tensors) any_f64 |= t.dtype() == DType::F64;
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
    norm_final_kernel<double>
        <<<1, kBlock, 0, stream>>>(partials.data_ptr<double>(), total_chunks, norm_type, inf, out.data_ptr<double>());
  } else {
    norm_final_kernel<float>
        <<<1, kBlock, 0, stream>>>(partials.data_ptr<double>(), total_chunks, norm_type, inf, out.data_ptr<float>());
  }
  KILN_CUDA_CHECK_LAUNCH("norm_final_kernel");
  return out;
}

void scale_(const std::vector<Tensor>& tensors, const Tensor& scale) {
  const char* op = "multi_tensor_scale_";
  if (tensors.empty()) return;
  KILN_CHECK(scale.defined(), op, ": scale is undefined");
  std::vector<Tensor> work;
  std::vector<Item> items;
  const Device dev = dense_list(op, tensors, work, items);
  // Non-dense tensors are scaled in a dense copy, then copied back.
  std::vector<std::pair<Tensor, Tensor>> copy_back;
  for (size_t i = 0; i < tensors.size(); ++i)
    if (!is_dense(tensors[i])) copy_back.emplace_back(tensors[i], work[i]);
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
    copy(o, dense);
  }
  for (const Item& it : items) tensors[it.index].storage()->bump_version();
}

void lerp_(const std::vector<Tensor>& dst, const std::vector<Tensor>& src, double weight) {
  const char* op = "multi_tensor_lerp_";
  KILN_CHECK(dst.size() == src.size(), op, ": ", dst.size(), " destinations but ", src.size(), " sources");
  if (dst.empty()) return;
  Device dev = Device::cpu();
  std::vector<Item> items;
  for (size_t i = 0; i < dst.size(); ++i) {
    const Tensor& d = dst[i];
    const Tensor& s = src[i];
    KILN_CHECK(d.defined() && s.defined(), op, ": pair ", i, " has an undefined tensor");
    if (i == 0) dev = d.device();
    check_cuda_tensor(d, dev, op, i);
    check_cuda_tensor(s, dev, op, i);
    KILN_CHECK(d.dtype() == s.dtype() && d.sizes() == s.sizes(), op, ": pair ", i, " must share dtype and sizes, got ",
               d.dtype(), " ", d.sizes(), " and ", s.dtype(), " ", s.sizes());
    if (!is_dense(d) || !same_layout(d, s)) {  // rare: the strided pointwise path
      lerp_strided_(d, s, weight);
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

}  // namespace

KILN_REGISTER_KERNEL(multi_tensor_norm, CUDA, norm);
KILN_REGISTER_KERNEL(multi_tensor_scale_, CUDA, scale_);
KILN_REGISTER_KERNEL(multi_tensor_lerp_, CUDA, lerp_);

}  // namespace kiln::kernels::cuda
