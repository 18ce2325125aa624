// The attention_forward_cudnn / attention_backward_cudnn kernels (kiln/kernels/attention.h):
// kiln tensors to the operands of kiln/cuda/cudnn_graph.h, which owns cuDNN (through
// cudnn-frontend) and its graph cache. Registered only in builds with cudnn-frontend; without
// it the nn layer never calls them (kernels::attention_forward_cudnn.has(CUDA) is false).
#include "kiln/config.h"

#if KILN_WITH_CUDNN_FRONTEND

#include "kiln/core/determinism.h"
#include "kiln/core/error.h"
#include "kiln/cuda/check.h"
#include "kiln/cuda/cuda.h"
#include "kiln/cuda/cudnn.h"
#include "kiln/cuda/cudnn_graph.h"
#include "kiln/kernels/attention.h"

namespace kiln::kernels::cuda {

namespace {

namespace g = kiln::cudnn::graph;

// A 4-D tensor as a cuDNN operand; an Error when it is not one (the caller prepares them).
g::SdpaOperand operand(const char* op, const char* name, const Tensor& t, DType dt) {
  KILN_CHECK(t.defined() && t.dim() == 4 && t.dtype() == dt, op, ": ", name, " must be a 4-d ", dtype_name(dt),
             " tensor, got ", t.defined() ? t.sizes() : IntList{}, " ", t.defined() ? dtype_name(t.dtype()) : "");
  g::SdpaOperand o;
  o.data = t.data_ptr();
  for (int d = 0; d < 4; ++d) {
    o.size[d] = t.size(d);
    o.stride[d] = t.stride(d);
  }
  o = g::sdpa_canonical(o);
  KILN_CHECK(g::sdpa_operand_ok(o), op, ": ", name, " of sizes ", t.sizes(), " and strides ", t.strides(),
             " is not an operand cuDNN takes (unit stride in the last dim, others multiples of 8, 16-byte aligned)");
  return o;
}

void check_lse(const char* op, const Tensor& lse, int64_t rows, int64_t Tq) {
  KILN_CHECK(lse.defined() && lse.dtype() == DType::F32 && lse.is_contiguous() && lse.numel() == rows * Tq, op,
             ": lse must be a contiguous f32 [B * H, Tq] = [", rows, ", ", Tq, "] tensor, got ",
             lse.defined() ? lse.sizes() : IntList{});
}

// The cuDNN-independent part of the choice, with the device's compute capability.
bool eligible(const Tensor& q, int64_t Dv, const Tensor& k) {
  g::SdpaCase c;
  c.built = true;
  c.backend = kiln::cudnn::sdpa_backend();
  c.cuda = q.is_cuda();
  c.sm = g::device_sm(q.device().index);
  c.dtype = q.dtype();
  c.B = q.size(0), c.H = q.size(1), c.Tq = q.size(2), c.Tk = k.size(2), c.D = q.size(3), c.Dv = Dv;
  return g::sdpa_refusal(c) == g::SdpaRefusal::None;
}

void* stream_of(const Tensor& t) { return kiln::cuda::current_stream(t.device().index).handle; }

}  // namespace

bool attention_forward_cudnn(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                             double scale, bool causal) {
  const char* op = "scaled_dot_product_attention (cuDNN)";
  KILN_CHECK(q.defined() && q.dim() == 4 && v.defined() && v.dim() == 4, op, ": q and v must be 4-d");
  if (!eligible(q, v.size(3), k)) return false;
  const DType dt = q.dtype();
  g::SdpaForwardArgs a;
  a.q = operand(op, "q", q, dt);
  a.k = operand(op, "k", k, dt);
  a.v = operand(op, "v", v, dt);
  a.out = operand(op, "out", out, dt);
  check_lse(op, lse, q.size(0) * q.size(1), q.size(2));
  a.stats = static_cast<float*>(lse.data_ptr());
  a.dtype = dt;
  a.scale = scale;
  a.causal = causal;
  a.device = q.device().index;
  kiln::cuda::internal::DeviceGuard guard(a.device);
  a.stream = stream_of(q);
  return g::sdpa_forward(a);
}
KILN_REGISTER_KERNEL(kernels::attention_forward_cudnn, CUDA, attention_forward_cudnn);

bool attention_backward_cudnn(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& gout, const Tensor& q,
                              const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, double scale,
                              bool causal) {
  const char* op = "scaled_dot_product_attention_backward (cuDNN)";
  KILN_CHECK(q.defined() && q.dim() == 4 && v.defined() && v.dim() == 4, op, ": q and v must be 4-d");
  if (!eligible(q, v.size(3), k)) return false;
  const DType dt = q.dtype();
  g::SdpaBackwardArgs a;
  a.q = operand(op, "q", q, dt);
  a.k = operand(op, "k", k, dt);
  a.v = operand(op, "v", v, dt);
  a.out = operand(op, "out", out, dt);
  a.dout = operand(op, "g", gout, dt);
  a.dq = operand(op, "dq", dq, dt);
  a.dk = operand(op, "dk", dk, dt);
  a.dv = operand(op, "dv", dv, dt);
  check_lse(op, lse, q.size(0) * q.size(1), q.size(2));
  a.stats = static_cast<const float*>(lse.data_ptr());
  a.dtype = dt;
  a.scale = scale;
  a.causal = causal;
  a.deterministic = kiln::deterministic_algorithms() || kiln::cudnn::deterministic();
  a.device = q.device().index;
  kiln::cuda::internal::DeviceGuard guard(a.device);
  a.stream = stream_of(q);
  return g::sdpa_backward(a);
}
KILN_REGISTER_KERNEL(kernels::attention_backward_cudnn, CUDA, attention_backward_cudnn);

}  // namespace kiln::kernels::cuda

#endif  // KILN_WITH_CUDNN_FRONTEND
