// Matrix products with autograd: mm (2-D), bmm (3-D batched) and matmul (NumPy rules: vectors,
// matrices, and batches broadcast over leading dims).
#include "kiln/core/autocast.h"
#include "kiln/core/autograd.h"
#include "kiln/core/shape.h"
#include "kiln/kernels/copy_fill.h"
#include "kiln/kernels/matmul.h"
#include "kiln/kernels/pointwise.h"
#include "kiln/kernels/reduce.h"
#include "kiln/kernels/softmax.h"

namespace kiln {

using autograd::SavedTensor;
using autograd::TensorList;

namespace {

void check_operands(const char* op, const Tensor& a, const Tensor& b) {
  KILN_CHECK(a.defined() && b.defined(), op, ": an operand is undefined");
  KILN_CHECK(a.device() == b.device(), op, ": operands on different devices: ", a.device(), " and ", b.device());
  KILN_CHECK(a.dtype() == b.dtype(), op, ": operands have different dtypes: ", a.dtype(), " and ", b.dtype(),
             " (sizes ", a.sizes(), " and ", b.sizes(), ")");
}

// The inner sizes k (of a) and k2 (of b) must agree; the message names the operands' full sizes.
void check_inner_sizes(const char* op, const Tensor& a, const Tensor& b, int64_t k, int64_t k2) {
  KILN_CHECK(k == k2, op, ": shapes ", a.sizes(), " and ", b.sizes(), " cannot be multiplied (", k, " != ", k2, ")");
}

// A matrix (or batch of matrices) stored transposed: its last two dims swapped are contiguous,
// as for a Linear layer's weight.t().
bool stored_transposed(const Tensor& t) {
  return t.size(-1) > 1 && t.size(-2) > 1 && !t.is_contiguous() && t.transpose(-2, -1).is_contiguous();
}

// C = A @ B on 2-D or 3-D operands with matching batch, with backward
// dA = dC @ B^T, dB = A^T @ dC.
// The gradient of an operand stored transposed is computed as the transpose of the swapped
// product, dB = (dC^T @ A)^T (likewise dA = (B @ dC^T)^T), so that it comes out in the operand's
// own layout: through the transpose's backward, a Linear weight's gradient then reaches
// AccumulateGrad contiguous rather than as a view to copy.
Tensor product(const char* name, const Tensor& a, const Tensor& b) {
  IntList shape = a.sizes();
  shape.back() = b.sizes().back();
  Tensor out = empty(shape, a.options());
  kernels::matmul(out, a, b);
  if (autograd::any_requires_grad({&a, &b})) {
    bool ga = a.requires_grad(), gb = b.requires_grad();
    const bool ta = ga && stored_transposed(a), tb = gb && stored_transposed(b);
    SavedTensor sa = gb ? SavedTensor(a, name) : SavedTensor();
    SavedTensor sb = ga ? SavedTensor(b, name) : SavedTensor();
    std::string bw = std::string(name) + "Backward";
    autograd::record_function(bw.c_str(), {&a, &b}, {&out}, [=](const TensorList& g) {
      auto prod = [](const Tensor& x, const Tensor& y) { return x.dim() == 2 ? mm(x, y) : bmm(x, y); };
      auto tr = [](const Tensor& x) { return x.transpose(-2, -1); };
      Tensor da, db;
      if (ga) da = ta ? tr(prod(sb.get(), tr(g[0]))) : prod(g[0], tr(sb.get()));
      if (gb) db = tb ? tr(prod(tr(g[0]), sa.get())) : prod(tr(sa.get()), g[0]);
      return TensorList{da, db};
    });
  }
  return out;
}

// Autocast (kiln/core/autocast.h) runs the products in low precision: when it casts an operand,
// the result of `op` on the cast operands, computed with autocast off; else undefined.
Tensor autocast_rerun(const Tensor& a, const Tensor& b, Tensor (*op)(const Tensor&, const Tensor&)) {
  auto out = amp::autocast_rerun(amp::Policy::LowPrecision, {a, b}, [op](const auto& c) { return op(c[0], c[1]); });
  return out ? *out : Tensor();
}

}  // namespace

Tensor mm(const Tensor& a, const Tensor& b) {
  if (Tensor low = autocast_rerun(a, b, mm); low.defined()) return low;
  check_operands("mm", a, b);
  KILN_CHECK(a.dim() == 2 && b.dim() == 2, "mm: expected 2-D matrices, got sizes ", a.sizes(), " and ", b.sizes());
  check_inner_sizes("mm", a, b, a.size(1), b.size(0));
  return product("Mm", a, b);
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  if (Tensor low = autocast_rerun(a, b, bmm); low.defined()) return low;
  check_operands("bmm", a, b);
  KILN_CHECK(a.dim() == 3 && b.dim() == 3, "bmm: expected 3-D batches, got sizes ", a.sizes(), " and ", b.sizes());
  KILN_CHECK(a.size(0) == b.size(0), "bmm: batch sizes differ: ", a.sizes(), " and ", b.sizes());
  check_inner_sizes("bmm", a, b, a.size(2), b.size(1));
  return product("Bmm", a, b);
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  if (Tensor low = autocast_rerun(a, b, matmul); low.defined()) return low;
  check_operands("matmul", a, b);
  const int64_t da = a.dim(), db = b.dim();
  KILN_CHECK(da >= 1 && db >= 1, "matmul: both operands need at least one dimension, got sizes ", a.sizes(), " and ",
             b.sizes());
  if (da == 1 && db == 1) {
    KILN_CHECK(a.size(0) == b.size(0), "matmul: vectors of different lengths ", a.sizes(), " and ", b.sizes());
    return mm(a.unsqueeze(0), b.unsqueeze(1)).reshape({});
  }
  if (da == 2 && db == 1) return mm(a, b.unsqueeze(1)).squeeze(1);
  if (da == 1 && db == 2) return mm(a.unsqueeze(0), b).squeeze(0);
  if (da == 2 && db == 2) return mm(a, b);
  if (db <= 2) {
    // [..., n, k] @ [k, m]: fold the batch into the rows (one big GEMM)
    Tensor bb = db == 1 ? b.unsqueeze(1) : b;
    check_inner_sizes("matmul", a, b, a.size(-1), bb.size(0));
    IntList out_shape = a.sizes();
    out_shape.back() = bb.size(1);
    Tensor r = mm(a.reshape({-1, a.size(-1)}), bb).reshape(out_shape);
    return db == 1 ? r.squeeze(-1) : r;
  }
  // General batched case: broadcast the batch dims, then bmm.
  Tensor aa = da == 1 ? a.unsqueeze(0) : a;
  Tensor bb = b;
  IntList ba(aa.sizes().begin(), aa.sizes().end() - 2), bbs(bb.sizes().begin(), bb.sizes().end() - 2);
  IntList batch = broadcast_shapes(ba, bbs, "matmul");
  int64_t n = aa.size(-2), k = aa.size(-1), k2 = bb.size(-2), m = bb.size(-1);
  check_inner_sizes("matmul", a, b, k, k2);
  int64_t B = 1;
  for (int64_t s : batch) B *= s;
  IntList ea = batch, eb = batch;
  ea.push_back(n);
  ea.push_back(k);
  eb.push_back(k);
  eb.push_back(m);
  Tensor r = bmm(aa.expand(ea).reshape({B, n, k}), bb.expand(eb).reshape({B, k, m}));
  IntList out_shape = batch;
  if (da > 1) out_shape.push_back(n);
  out_shape.push_back(m);
  return r.reshape(out_shape);
}

Tensor Tensor::matmul(const Tensor& o) const { return kiln::matmul(*this, o); }
Tensor Tensor::mm(const Tensor& o) const { return kiln::mm(*this, o); }
Tensor Tensor::bmm(const Tensor& o) const { return kiln::bmm(*this, o); }

}  // namespace kiln
