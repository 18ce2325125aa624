// Routes a copy: a byte transfer between devices (or within one) when layouts and dtypes allow,
// otherwise a conversion on the side that holds the data, ending in the backend's strided copy.
#include "kiln/kernels/copy_fill.h"

#include "kiln/cuda/cuda.h"

namespace kiln::kernels {

void copy(const Tensor& dst, const Tensor& src, bool non_blocking) {
  KILN_CHECK(dst.defined() && src.defined(), "copy_: an operand is undefined");
  if (dst.device().is_cpu() && src.device().is_cpu()) return copy_within_device(dst, src);
  // Cross-device or device-to-device: a byte copy when layouts and dtypes match, otherwise stage
  // through a contiguous tensor of the destination's dtype.
  if (dst.dtype() == src.dtype() && dst.sizes() == src.sizes() && dst.is_contiguous() && src.is_contiguous()) {
    kiln::cuda::memcpy(dst.data_ptr(), dst.device(), src.data_ptr(), src.device(), dst.nbytes(), non_blocking);
    // An asynchronous copy from/to pinned memory is still running: its block must not be reused
    // by the pinned cache until the copy's stream has passed this point.
    if (non_blocking && (src.is_pinned() || dst.is_pinned())) {
      const Tensor& host = src.is_pinned() ? src : dst;
      const Device dev = src.is_pinned() ? dst.device() : src.device();
      kiln::cuda::record_host_use(host.storage()->data(), kiln::cuda::current_stream(dev.index));
    }
    return;
  }
  if (src.device().is_cpu()) {  // host -> device: convert on the host first
    Tensor staged = empty(dst.sizes(), TensorOptions().dtype(dst.dtype()));
    copy_within_device(staged, src);
    if (dst.is_contiguous()) {
      kiln::cuda::memcpy(dst.data_ptr(), dst.device(), staged.data_ptr(), Device::cpu(), dst.nbytes(), false);
      return;
    }
    // A strided destination: upload densely, then scatter on the device.
    Tensor uploaded = empty(dst.sizes(), TensorOptions().dtype(dst.dtype()).device(dst.device()));
    kiln::cuda::memcpy(uploaded.data_ptr(), dst.device(), staged.data_ptr(), Device::cpu(), uploaded.nbytes(), false);
    copy_within_device(dst, uploaded);
    return;
  } else if (dst.device().is_cpu()) {  // device -> host: bring the bytes over, convert here
    Tensor staged = empty(src.sizes(), TensorOptions().dtype(src.dtype()));
    Tensor src_c = contiguous(src);
    kiln::cuda::memcpy(staged.data_ptr(), Device::cpu(), src_c.data_ptr(), src_c.device(), src_c.nbytes(), false);
    copy_within_device(dst, staged);
    return;
  }
  KILN_CHECK(src.device() == dst.device(),
             "copy_: copies between two CUDA devices must be contiguous and "
             "of one dtype (got ",
             src.device(), " -> ", dst.device(), ")");
  copy_within_device(dst, src);
}

Tensor contiguous(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor out = empty(t.sizes(), TensorOptions().dtype(t.dtype()).device(t.device()));
  copy_within_device(out, t);
  return out;
}

Tensor to_dtype(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  Tensor out = empty(t.sizes(), TensorOptions().dtype(dtype).device(t.device()));
  copy_within_device(out, t);
  return out;
}

}  // namespace kiln::kernels
