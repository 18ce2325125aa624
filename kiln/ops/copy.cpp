// Copies and conversions of tensors (clone, contiguous, to, pin_memory) and the in-place fills
// and copies: the differentiable ones record their backward here.
#include "kiln/core/autograd.h"
#include "kiln/cuda/cuda.h"
#include "kiln/core/tensor.h"
#include "kiln/kernels/copy_fill.h"
#include "kiln/ops/op_helpers.h"

namespace kiln {

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor out = empty(sizes(), options());
  kernels::copy(out, *this);
  if (autograd::any_requires_grad({this})) {
    autograd::record_function("CloneBackward", {this}, {&out}, [](const autograd::TensorList& g) { return g; });
  }
  return out;
}

Tensor Tensor::to(DType dt) const { return to(device(), dt, false); }
Tensor Tensor::to(Device dev, bool non_blocking) const { return to(dev, dtype(), non_blocking); }

Tensor Tensor::to(Device dev, DType dt, bool non_blocking) const {
  if (dev == device() && dt == dtype()) return *this;
  if (dev.is_cuda()) cuda::check_device(dev, "to");
  Tensor out = empty(sizes(), TensorOptions().dtype(dt).device(dev));
  kernels::copy(out, *this, non_blocking);
  if (autograd::any_requires_grad({this})) {
    KILN_CHECK(is_floating(dt), "to: cannot convert a tensor that requires grad to ", dt);
    DType src_dt = dtype();
    Device src_dev = device();
    autograd::record_function("ToCopyBackward", {this}, {&out}, [src_dt, src_dev](const autograd::TensorList& g) {
      return autograd::TensorList{g[0].to(src_dev, src_dt)};
    });
  }
  return out;
}

Tensor Tensor::pin_memory() const {
  KILN_CHECK(device().is_cpu(), "pin_memory: only CPU tensors can be pinned, got ", device());
  if (is_pinned()) return *this;
  Tensor out = empty(sizes(), TensorOptions().dtype(dtype()).pinned_memory(true));
  kernels::copy(out, *this);
  return out;
}

// ---------------------------------------------------------------- in-place

using detail::check_inplace;

Tensor& Tensor::zero_() { return fill_(0.0); }

Tensor& Tensor::fill_(double value) {
  check_inplace(*this, "fill_");
  kernels::fill(*this, value);
  storage()->bump_version();
  return *this;
}

Tensor& Tensor::copy_(const Tensor& src, bool non_blocking) {
  check_inplace(*this, "copy_");
  KILN_CHECK(src.defined(), "copy_: source is undefined");
  kernels::copy(*this, src, non_blocking);
  storage()->bump_version();
  return *this;
}

}  // namespace kiln
