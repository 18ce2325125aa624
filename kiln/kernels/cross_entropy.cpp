// Checks the operands of the fused cross-entropy kernels (cross_entropy.h) and routes them to the
// backend of their device.
#include "kiln/core/error.h"
#include "kiln/kernels/cross_entropy.h"

namespace kiln::kernels {

namespace {

void check_operands(const char* op, const Tensor& logits, const Tensor& target,
                    std::initializer_list<const Tensor*> stats, double label_smoothing) {
  KILN_CHECK(logits.defined() && target.defined(), op, ": an operand is undefined");
  KILN_CHECK(logits.dim() == 2 && logits.is_contiguous() && is_floating(logits.dtype()), op,
             ": logits must be contiguous floating-point [R, C], got sizes ", logits.sizes(), " dtype ",
             logits.dtype());
  const int64_t R = logits.size(0);
  KILN_CHECK(R == 0 || logits.size(1) > 0, op, ": logits have no classes (sizes ", logits.sizes(), ")");
  KILN_CHECK(target.dim() == 1 && target.size(0) == R && target.is_contiguous() &&
                 (target.dtype() == DType::I64 || target.dtype() == DType::I32),
             op, ": target must be contiguous int64/int32 [", R, "], got sizes ", target.sizes(), " dtype ",
             target.dtype());
  KILN_CHECK(target.device() == logits.device(), op, ": logits on ", logits.device(), " but target on ",
             target.device());
  KILN_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, op, ": label_smoothing must be in [0, 1], got ",
             label_smoothing);
  const DType sd = xent_stat_dtype(logits.dtype());
  for (const Tensor* s : stats) {
    KILN_CHECK(s->defined() && s->is_contiguous() && s->dtype() == sd, op, ": per-row operands must be contiguous ", sd,
               ", got dtype ", s->defined() ? dtype_name(s->dtype()) : "undefined");
    KILN_CHECK(s->device() == logits.device(), op, ": logits on ", logits.device(), " but a per-row operand on ",
               s->device());
  }
}

}  // namespace

void cross_entropy_forward(const Tensor& loss, const Tensor& lse, const Tensor& logits, const Tensor& target,
                           int64_t ignore_index, double label_smoothing) {
  check_operands("cross_entropy", logits, target, {&loss, &lse}, label_smoothing);
  const int64_t R = logits.size(0);
  KILN_CHECK(loss.numel() == R && lse.numel() == R, "cross_entropy: loss and lse must have ", R, " elements, got ",
             loss.numel(), " and ", lse.numel());
  backend::cross_entropy_forward(loss, lse, logits, target, ignore_index, label_smoothing);
}

void cross_entropy_backward(const Tensor& dx, const Tensor& grad, const Tensor& logits, const Tensor& lse,
                            const Tensor& target, int64_t ignore_index, double label_smoothing) {
  check_operands("cross_entropy_backward", logits, target, {&grad, &lse}, label_smoothing);
  const int64_t R = logits.size(0);
  KILN_CHECK(dx.defined() && dx.sizes() == logits.sizes() && dx.is_contiguous() && dx.dtype() == logits.dtype() &&
                 dx.device() == logits.device(),
             "cross_entropy_backward: dx must be contiguous like the logits (sizes ", logits.sizes(), ", ",
             logits.dtype(), ")");
  KILN_CHECK(lse.numel() == R && (grad.numel() == R || grad.numel() == 1), "cross_entropy_backward: lse must have ", R,
             " elements and grad ", R, " or 1, got ", lse.numel(), " and ", grad.numel());
  backend::cross_entropy_backward(dx, grad, logits, lse, target, ignore_index, label_smoothing);
}

}  // namespace kiln::kernels
