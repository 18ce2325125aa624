// CUDA loss-scaler kernels (contract: kiln/kernels/amp_kernels.h).
//
// unscale_and_check_: one multi-tensor pass over all gradients (multi_tensor.cuh: chunk metadata
// in the kernel arguments, one block per chunk, vector loads): g *= inv_scale in the opmath type,
// and found_inf = 1 when any value is Inf or NaN. inv_scale is read on the device. A block that saw
// a non-finite value stores 1.0f into found_inf - every writer stores the same value, so no atomic
// is needed and the result does not depend on the order.
//
// amp_update_scale_: GradScaler.update() in a one-thread kernel (math::update_loss_scale, shared
// with the CPU version), so the next scale is computed where found_inf lives and a training step
// never waits for the host.
#include "kiln/kernels/copy_fill.h"
#include "kiln/kernels/amp_kernels.h"
#include "kiln/kernels/cuda/multi_tensor.cuh"

namespace kiln::kernels::cuda {

namespace {

template <class P>
__global__ void __launch_bounds__(mt::kBlock)
    unscale_kernel(mt::ListMeta<1> a, const float* inv_scale, float* found_inf) {
  using M = opmath_t<P>;
  const mt::Chunk ch = mt::block_chunk(a.map);
  P* x = static_cast<P*>(a.ptr[0][ch.t]);
  const M inv = static_cast<M>(*inv_scale);
  bool bad = false;
  mt::update_in_place(x, ch.begin, ch.end, [&](P r) {
    const M v = static_cast<M>(r);
    bad |= (v - v) != (v - v);  // NaN for Inf and NaN inputs, 0 otherwise
    return static_cast<P>(v * inv);
  });
  if (__syncthreads_or(bad) && threadIdx.x == 0) *found_inf = 1.0f;
}

template <class S>
__global__ void update_scale_kernel(S* scale, int64_t* tracker, int64_t* skipped, const float* found_inf,
                                    double growth_factor, double backoff_factor, int64_t growth_interval) {
  double s = static_cast<double>(*scale);
  int64_t t = *tracker, k = *skipped;
  math::update_loss_scale(s, t, k, *found_inf != 0.0f, growth_factor, backoff_factor, growth_interval);
  *scale = static_cast<S>(s);
  *tracker = t;
  *skipped = k;
}

void unscale_and_check(const std::vector<Tensor>& grads, const Tensor& inv_scale, const Tensor& found_inf) {
  const char* op = "unscale_and_check_";
  KILN_CHECK(inv_scale.defined() && found_inf.defined() && inv_scale.numel() == 1 && found_inf.numel() == 1 &&
                 found_inf.dtype() == DType::F32 && found_inf.is_contiguous(),
             op, ": inv_scale and found_inf must be one-element tensors (found_inf f32)");
  const Device dev = found_inf.device();
  KILN_CHECK(inv_scale.device() == dev, op, ": inv_scale is on ", inv_scale.device(), ", found_inf on ", dev);
  std::vector<mt::Item> items;
  for (size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = grads[i];
    if (!g.defined() || g.numel() == 0) continue;
    KILN_CHECK(g.device() == dev, op, ": gradient ", i, " is on ", g.device(), ", found_inf on ", dev);
    KILN_CHECK(g.is_floating_point(), op, ": gradient ", i, " has dtype ", g.dtype());
    KILN_CHECK(is_dense(g), op, ": gradients must be dense (gradient ", i, " has sizes ", g.sizes(), " strides ",
               g.strides(), ")");
    items.push_back({g.numel(), g.dtype(), static_cast<int>(i)});
  }
  if (items.empty()) return;
  // The CPU version multiplies by the f32 value of inv_scale; so does this one.
  const Tensor inv = contiguous(to_dtype(inv_scale, DType::F32));
  DeviceGuard guard(found_inf);
  cudaStream_t stream = stream_for(found_inf);
  const std::vector<Tensor>* lists[1] = {&grads};
  for (const mt::Launch& l : mt::plan_launches(items, mt::kListT)) {
    int grid = 0;
    const mt::ListMeta<1> a = mt::list_meta<1>(items, l, lists, grid);
    dispatch_floating(items[l.begin].dtype, op, [&](auto tag) {
      using P = typename decltype(tag)::type;
      unscale_kernel<P><<<grid, mt::kBlock, 0, stream>>>(a, inv.data_ptr<float>(), found_inf.data_ptr<float>());
      KILN_CUDA_CHECK_LAUNCH("unscale_kernel");
    });
  }
  for (const mt::Item& it : items) grads[it.index].storage()->bump_version();
  found_inf.storage()->bump_version();
}

void amp_update_scale(const Tensor& scale, const Tensor& growth_tracker, const Tensor& skipped, const Tensor& found_inf,
                      double growth_factor, double backoff_factor, int64_t growth_interval) {
  check_update_scale_args(scale, growth_tracker, skipped, found_inf);
  KILN_CHECK(growth_tracker.device() == scale.device() && skipped.device() == scale.device() &&
                 found_inf.device() == scale.device(),
             "amp_update_scale_: every operand must be on ", scale.device());
  DeviceGuard guard(scale);
  cudaStream_t stream = stream_for(scale);
  int64_t* t = growth_tracker.data_ptr<int64_t>();
  int64_t* k = skipped.data_ptr<int64_t>();
  const float* f = found_inf.data_ptr<float>();
  if (scale.dtype() == DType::F32) {
    update_scale_kernel<float>
        <<<1, 1, 0, stream>>>(scale.data_ptr<float>(), t, k, f, growth_factor, backoff_factor, growth_interval);
  } else {
    update_scale_kernel<double>
        <<<1, 1, 0, stream>>>(scale.data_ptr<double>(), t, k, f, growth_factor, backoff_factor, growth_interval);
  }
  KILN_CUDA_CHECK_LAUNCH("update_scale_kernel");
  bump_scale_versions(scale, growth_tracker, skipped);
}

}  // namespace

KILN_REGISTER_KERNEL(unscale_and_check_, CUDA, unscale_and_check);
KILN_REGISTER_KERNEL(amp_update_scale_, CUDA, amp_update_scale);

}  // namespace kiln::kernels::cuda
