// Differentiable pointwise ops: dtype promotion, broadcasting, the forward kernel and the
// backward formula of each. Backward formulas use fused kernels (one pass) unless a graph of the
// backward itself is being recorded (create_graph), where they use differentiable ops instead.
#include <cmath>
#include <functional>
#include <iterator>
#include <optional>
#include <utility>

#include "kiln/core/autograd.h"
#include "kiln/core/shape.h"
#include "kiln/kernels/copy_fill.h"
#include "kiln/kernels/matmul.h"
#include "kiln/kernels/pointwise.h"
#include "kiln/kernels/reduce.h"
#include "kiln/kernels/softmax.h"
#include "kiln/ops/op_helpers.h"

namespace kiln {

using autograd::SavedTensor;
using autograd::TensorList;
using kernels::BinaryOp;
using kernels::UnaryOp;

IntList broadcast_shapes(const IntList& a, const IntList& b, const char* op) {
  size_t n = std::max(a.size(), b.size());
  IntList out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    KILN_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", a, " and ", b,
               " cannot be broadcast together (dimension ", i, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

namespace {

void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  KILN_CHECK(a.defined() && b.defined(), op, ": an operand is undefined");
  KILN_CHECK(a.device() == b.device(), op, ": expected both tensors on the same device, got ", a.device(), " (sizes ",
             a.sizes(), ") and ", b.device(), " (sizes ", b.sizes(), ")");
}

Tensor as_dtype(const Tensor& t, DType d) { return t.dtype() == d ? t : t.to(d); }

// ---------------------------------------------------------------- forward helpers

Tensor unary_raw(UnaryOp op, const Tensor& x, double a = 0, double b = 0) {
  KILN_CHECK(x.defined(), kernels::op_name(op), ": input is undefined");
  Tensor out = empty_preserving_layout(
      x, TensorOptions().dtype(kernels::is_predicate(op) ? DType::Bool : x.dtype()).device(x.device()));
  kernels::unary(op, out, x, a, b);
  return out;
}

Tensor binary_raw(BinaryOp op, const Tensor& x, const Tensor& y, double alpha = 1, double beta = 0) {
  // bool arithmetic follows PyTorch: + is logical or, * is logical and
  if (x.dtype() == DType::Bool && y.dtype() == DType::Bool) {
    if (op == BinaryOp::Add) op = BinaryOp::LogicalOr;
    else if (op == BinaryOp::Mul) op = BinaryOp::LogicalAnd;
  }
  const char* name = kernels::op_name(op);
  check_same_device(name, x, y);
  IntList shape = broadcast_shapes(x.sizes(), y.sizes(), name);
  DType dt = promote_types(x.dtype(), y.dtype());
  TensorOptions out_opts = TensorOptions().dtype(kernels::is_comparison(op) ? DType::Bool : dt).device(x.device());
  // Keep the memory format of a full-size operand (channels-last stays channels-last).
  Tensor out = x.sizes() == shape   ? empty_preserving_layout(x, out_opts)
               : y.sizes() == shape ? empty_preserving_layout(y, out_opts)
                                    : empty(shape, out_opts);
  kernels::binary(op, out, as_dtype(x, dt), as_dtype(y, dt), alpha, beta);
  return out;
}

// Operations on integer tensors that produce fractions compute in float32 (true division).
DType float_dtype_for(const Tensor& t) { return is_floating(t.dtype()) ? t.dtype() : DType::F32; }

// A scalar as a 0-dim tensor of the dtype the op computes in.
Tensor wrap_scalar(double v, const Tensor& like) {
  DType dt = like.dtype();
  if (!is_floating(dt) && v != std::floor(v)) dt = DType::F32;
  if (dt == DType::Bool) dt = DType::I64;
  return scalar_tensor(v, TensorOptions().dtype(dt).device(like.device()));
}

// g * gelu'(x) as differentiable ops, for the erf form or the tanh approximation.
Tensor gelu_grad(const Tensor& g, const Tensor& x, bool tanh_form) {
  if (tanh_form) {
    const double k = 0.79788456080286535588, c = 0.044715;
    Tensor t = tanh((x + x * x * x * c) * k);
    return g * ((1.0 + t) * 0.5 + x * 0.5 * (1.0 - t * t) * ((x * x * (3.0 * c) + 1.0) * k));
  }
  Tensor Phi = (1.0 + erf(x * 0.70710678118654752440)) * 0.5;
  Tensor pdf = exp(x * x * -0.5) * 0.39894228040143267794;
  return g * (Phi + x * pdf);
}

// g * silu'(x) = g * s * (1 + x * (1 - s)), s = sigmoid(x), as differentiable ops.
Tensor silu_grad(const Tensor& g, const Tensor& x) {
  Tensor s = sigmoid(x);
  return g * s * (1.0 + x * (1.0 - s));
}

// A unary op's backward, as its row of kiln/core/unary_ops.h declares it (docs/architecture.md,
// "Ops"): the node's name, the tensor it keeps (the input, the output, or none; NoGrad: no node),
// the fused backward kernel computing the gradient from (g, kept, a, b) in one pass, if any, and
// the gradient as differentiable ops of the same. The fused kernel runs in a plain backward, the
// differentiable form under create_graph (autograd::fused_or_composite).
enum class Keeps { Nothing, Input, Output, NoGrad };
struct UnaryGrad {
  const char* node;
  Keeps keeps;
  std::optional<BinaryOp> fused;
  Tensor (*composite)(const Tensor& g, const Tensor& kept, double a, double b);
};

// The rows' Formula as a function of (g, kept, a, b), the kept tensor named as the row says.
#define KILN_UNARY_FORMULA(KEPT, FORMULA) \
  [](const Tensor& g, const Tensor& KEPT, double a, double b) -> Tensor { return FORMULA; }
#define KILN_UNARY_COMPOSITE_Input(FORMULA) KILN_UNARY_FORMULA(x, FORMULA)
#define KILN_UNARY_COMPOSITE_Output(FORMULA) KILN_UNARY_FORMULA(y, FORMULA)
#define KILN_UNARY_COMPOSITE_Nothing(FORMULA) KILN_UNARY_FORMULA(nothing_kept, FORMULA)
#define KILN_UNARY_COMPOSITE_NoGrad(FORMULA) nullptr
#define KILN_UNARY_GRAD(OP, NAME, TYPES, SCALARS, API, NODE, KEEPS, FUSED, FORMULA) \
  UnaryGrad{NODE, Keeps::KEEPS, FUSED, KILN_UNARY_COMPOSITE_##KEEPS(FORMULA)},
constexpr std::nullopt_t None = std::nullopt;  // the Fused column's "no fused kernel"
const UnaryGrad kUnaryGrads[] = {KILN_UNARY_OPS(KILN_UNARY_GRAD)};
#undef KILN_UNARY_GRAD
#undef KILN_UNARY_COMPOSITE_NoGrad
#undef KILN_UNARY_COMPOSITE_Nothing
#undef KILN_UNARY_COMPOSITE_Output
#undef KILN_UNARY_COMPOSITE_Input
#undef KILN_UNARY_FORMULA
static_assert(std::size(kUnaryGrads) == kernels::kUnaryOpCount, "one backward per UnaryOp, in the rows' order");
// Only a predicate's output carries no gradient: every other row declares its backward.
#define KILN_UNARY_NOGRAD_IFF_PREDICATE(OP, NAME, TYPES, SCALARS, API, NODE, KEEPS, ...)                           \
  static_assert((kernels::UnaryTypes::TYPES == kernels::UnaryTypes::Predicate) == (Keeps::KEEPS == Keeps::NoGrad), \
                #OP ": NoGrad is for predicates only");
KILN_UNARY_OPS(KILN_UNARY_NOGRAD_IFF_PREDICATE)
#undef KILN_UNARY_NOGRAD_IFF_PREDICATE

// Runs unary op `op` (scalars a, b) on x, by its row: in f32 for integer input where its Types
// are Floating, and recording its backward.
Tensor unary(UnaryOp op, const Tensor& x, double a = 0, double b = 0) {
  const bool in_f32 = kernels::unary_types(op) == kernels::UnaryTypes::Floating && !is_floating(x.dtype());
  Tensor out = unary_raw(op, in_f32 ? x.to(DType::F32) : x, a, b);
  const UnaryGrad& grad = kUnaryGrads[static_cast<int>(op)];
  if (grad.keeps == Keeps::NoGrad || !autograd::any_requires_grad({&x})) return out;
  const SavedTensor kept = grad.keeps == Keeps::Input    ? SavedTensor(x, grad.node)
                           : grad.keeps == Keeps::Output ? SavedTensor::output(out, grad.node)
                                                         : SavedTensor();
  auto composite = [f = grad.composite, kept, k = grad.keeps, a, b](const TensorList& g) {
    return TensorList{f(g[0], k == Keeps::Nothing ? Tensor() : kept.get(), a, b)};
  };
  if (!grad.fused) {
    autograd::record_function(grad.node, {&x}, {&out}, composite);
    return out;
  }
  auto fused = [op = *grad.fused, a, b, kept](const TensorList& g) {
    return TensorList{binary_raw(op, g[0], kept.get(), a, b)};
  };
  autograd::record_function(grad.node, {&x}, {&out}, autograd::fused_or_composite(fused, composite));
  return out;
}

}  // namespace

// Reduces a broadcast gradient back to the operand's shape.
Tensor sum_to(const Tensor& t, const IntList& shape) {
  if (t.sizes() == shape) return t;
  const int64_t lead = t.dim() - static_cast<int64_t>(shape.size());
  KILN_CHECK(lead >= 0, "sum_to: cannot reduce sizes ", t.sizes(), " to ", shape);
  IntList dims;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (d < lead) dims.push_back(d);
    else if (shape[d - lead] == 1 && t.sizes()[d] != 1) dims.push_back(d);
  }
  Tensor r = dims.empty() ? t : t.sum(dims, /*keepdim=*/true);
  return lead > 0 || r.sizes() != shape ? r.reshape(shape) : r;
}

// ---------------------------------------------------------------- binary arithmetic

namespace {

// A binary op's backward, declared once (docs/architecture.md, "Ops"): the node's name and, for
// each input, which of (a, b, the output) its gradient reads and the gradient as differentiable
// ops of g and those, before it is summed back over the broadcast dimensions. The node keeps only
// what the gradients of the inputs that require grad read.
enum Reads : unsigned { kNothing = 0, kA = 1, kB = 2, kOut = 4 };
struct Operands {
  Tensor a, b, out;  // undefined where no gradient reads it
};
struct InputGrad {
  unsigned reads;
  std::function<Tensor(const Tensor& g, const Operands& s)> formula;
};
struct BinaryGrad {
  const char* node;
  InputGrad da, db;
};

// Records out = op(a, b) as `grad` declares it. a_in, b_in are the caller's tensors (the graph's
// edges); a, b what the kernel computed with (after type promotion).
Tensor record_binary(const BinaryGrad& grad, const Tensor& a_in, const Tensor& b_in, const Tensor& a, const Tensor& b,
                     Tensor out) {
  if (!autograd::any_requires_grad({&a_in, &b_in})) return out;
  const bool ga = a_in.requires_grad(), gb = b_in.requires_grad();
  const unsigned reads = (ga ? grad.da.reads : 0) | (gb ? grad.db.reads : 0);
  const SavedTensor sa = reads & kA ? SavedTensor(a, grad.node) : SavedTensor();
  const SavedTensor sb = reads & kB ? SavedTensor(b, grad.node) : SavedTensor();
  const SavedTensor so = reads & kOut ? SavedTensor::output(out, grad.node) : SavedTensor();
  autograd::record_function(
      grad.node, {&a_in, &b_in}, {&out},
      [=, da = grad.da.formula, db = grad.db.formula, za = a.sizes(), zb = b.sizes()](const TensorList& g) {
        const Operands s{sa.get(), sb.get(), so.get()};
        return TensorList{ga ? sum_to(da(g[0], s), za) : Tensor(), gb ? sum_to(db(g[0], s), zb) : Tensor()};
      });
  return out;
}

// Both operands in the floating type the op computes in (integers divide and raise in float32).
std::pair<Tensor, Tensor> as_float_pair(const Tensor& a, const Tensor& b) {
  const DType dt = promote_types(float_dtype_for(a), float_dtype_for(b));
  return {as_dtype(a, dt), as_dtype(b, dt)};
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b, double alpha) {
  return record_binary({"AddBackward",
                        {kNothing, [](const Tensor& g, const Operands&) { return g; }},
                        {kNothing, [alpha](const Tensor& g, const Operands&) { return alpha == 1.0 ? g : g * alpha; }}},
                       a, b, a, b, binary_raw(BinaryOp::Add, a, b, alpha));
}

Tensor sub(const Tensor& a, const Tensor& b, double alpha) { return add(a, b, -alpha); }

Tensor mul(const Tensor& a, const Tensor& b) {
  return record_binary({"MulBackward",
                        {kB, [](const Tensor& g, const Operands& s) { return g * s.b; }},
                        {kA, [](const Tensor& g, const Operands& s) { return g * s.a; }}},
                       a, b, a, b, binary_raw(BinaryOp::Mul, a, b));
}

Tensor div(const Tensor& a_in, const Tensor& b_in) {
  const auto [a, b] = as_float_pair(a_in, b_in);
  return record_binary({"DivBackward",
                        {kB, [](const Tensor& g, const Operands& s) { return g / s.b; }},
                        {kB | kOut, [](const Tensor& g, const Operands& s) { return -(g / s.b) * s.out; }}},
                       a_in, b_in, a, b, binary_raw(BinaryOp::Div, a, b));
}

Tensor pow(const Tensor& a_in, const Tensor& e_in) {
  const auto [a, e] = as_float_pair(a_in, e_in);
  return record_binary(
      {"PowBackward",
       {kA | kB, [](const Tensor& g, const Operands& s) { return g * s.b * pow(s.a, s.b - 1.0); }},
       // d/de a^e = a^e log a; defined as 0 where a == 0 (the limit for e > 0), as PyTorch does.
       {kA | kOut,
        [](const Tensor& g, const Operands& s) { return g * s.out * where(s.a == 0.0, zeros_like(s.a), log(s.a)); }}},
      a_in, e_in, a, e, binary_raw(BinaryOp::Pow, a, e));
}

Tensor maximum(const Tensor& a, const Tensor& b) {
  // Ties split the gradient evenly, as PyTorch does: the share of a is w, of b 1 - w.
  auto share_of_a = [](const Tensor& g, const Operands& s) {
    return where(s.a > s.b, ones_like(g), where(s.a == s.b, full_like(g, 0.5), zeros_like(g)));
  };
  return record_binary({"MaximumBackward",
                        {kA | kB, [=](const Tensor& g, const Operands& s) { return g * share_of_a(g, s); }},
                        {kA | kB, [=](const Tensor& g, const Operands& s) { return g * (1.0 - share_of_a(g, s)); }}},
                       a, b, a, b, binary_raw(BinaryOp::Maximum, a, b));
}

Tensor minimum(const Tensor& a, const Tensor& b) { return -maximum(-a, -b); }

// ---------------------------------------------------------------- unary

// kiln::relu(x), x.relu(), ...: the entry points of the rows whose Api is Method or Function.
#define KILN_UNARY_DEFINE_Function(OP, NAME) \
  Tensor NAME(const Tensor& x) { return unary(UnaryOp::OP, x); }
#define KILN_UNARY_DEFINE_Method(OP, NAME) \
  KILN_UNARY_DEFINE_Function(OP, NAME) Tensor Tensor::NAME() const { return kiln::NAME(*this); }
#define KILN_UNARY_DEFINE_Custom(OP, NAME)
#define KILN_UNARY_DEFINE(OP, NAME, TYPES, SCALARS, API, ...) KILN_UNARY_DEFINE_##API(OP, NAME)
KILN_UNARY_OPS(KILN_UNARY_DEFINE)
#undef KILN_UNARY_DEFINE
#undef KILN_UNARY_DEFINE_Custom
#undef KILN_UNARY_DEFINE_Method
#undef KILN_UNARY_DEFINE_Function

// The hand-written entry points (Api Custom) of rows whose functions take more than a tensor.
Tensor gelu(const Tensor& x, const std::string& approximate) {
  KILN_CHECK(approximate == "none" || approximate == "tanh", "gelu: approximate must be 'none' or 'tanh', got '",
             approximate, "'");
  return unary(approximate == "tanh" ? UnaryOp::GeluTanh : UnaryOp::GeluErf, x);
}

Tensor pow(const Tensor& x, double e) {
  if (e == 1.0 && is_floating(x.dtype())) return x * 1.0;
  // integers raise to a non-negative integer power exactly; to any other in f32
  const bool integer_pow = e >= 0 && e == std::floor(e);
  return unary(UnaryOp::PowScalar, is_floating(x.dtype()) || integer_pow ? x : x.to(DType::F32), e);
}

Tensor pow(double base, const Tensor& e) { return unary(UnaryOp::RPowScalar, e, base); }

Tensor clamp(const Tensor& x, double lo, double hi) {
  KILN_CHECK(!(lo > hi), "clamp: min ", lo, " is greater than max ", hi);
  return unary(UnaryOp::Clamp, x, lo, hi);
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_same_device("where", cond, a);
  check_same_device("where", a, b);
  KILN_CHECK(cond.dtype() == DType::Bool, "where: condition must be a bool tensor, got ", cond.dtype());
  IntList shape = broadcast_shapes(broadcast_shapes(cond.sizes(), a.sizes(), "where"), b.sizes(), "where");
  DType dt = promote_types(a.dtype(), b.dtype());
  Tensor out = empty(shape, TensorOptions().dtype(dt).device(a.device()));
  kernels::where(out, cond, as_dtype(a, dt), as_dtype(b, dt));
  if (!autograd::any_requires_grad({&a, &b})) return out;
  // the condition is no operand of the gradient's: each side's gradient is g where it was chosen
  const SavedTensor sc(cond, "WhereBackward");
  return record_binary({"WhereBackward",
                        {kNothing, [sc](const Tensor& g, const Operands&) { return where(sc.get(), g, 0.0); }},
                        {kNothing, [sc](const Tensor& g, const Operands&) { return where(sc.get(), 0.0, g); }}},
                       a, b, a, b, out);
}

Tensor where(const Tensor& cond, const Tensor& a, double b) { return where(cond, a, wrap_scalar(b, a)); }
Tensor where(const Tensor& cond, double a, const Tensor& b) { return where(cond, wrap_scalar(a, b), b); }

Tensor logical_and(const Tensor& a, const Tensor& b) { return binary_raw(BinaryOp::LogicalAnd, a, b); }
Tensor logical_or(const Tensor& a, const Tensor& b) { return binary_raw(BinaryOp::LogicalOr, a, b); }

bool equal(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes()) return false;
  if (a.numel() == 0) return true;
  NoGradGuard ng;
  return logical_not(a == b).to(DType::F64).sum().item<double>() == 0;
}

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  NoGradGuard ng;
  Tensor x = a.detach().to(DType::F64), y = b.detach().to(DType::F64);
  broadcast_shapes(x.sizes(), y.sizes(), "allclose");
  // As torch.isclose: x == y (so equal infinities are close), or a finite |x - y| within
  // atol + rtol |y|; NaN is never close
  Tensor err = abs(x - y);
  Tensor ok = logical_or(x == y, logical_and(isfinite(err), binary_raw(BinaryOp::Le, err, abs(y) * rtol + atol)));
  if (ok.numel() == 0) return true;
  return logical_not(ok).to(DType::F64).sum().item<double>() == 0;
}

// ---------------------------------------------------------------- operators and methods

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }

// Scalar forms run one unary kernel (no broadcast of a 0-dim tensor).
Tensor operator+(const Tensor& a, double b) {
  if (!is_floating(a.dtype()) && b != std::floor(b)) return a.to(DType::F32) + b;
  return unary(UnaryOp::AddScalar, a, b);
}
Tensor operator-(const Tensor& a, double b) { return a + (-b); }
Tensor operator*(const Tensor& a, double b) {
  if (!is_floating(a.dtype()) && b != std::floor(b)) return a.to(DType::F32) * b;
  return unary(UnaryOp::MulScalar, a, b);
}
Tensor operator/(const Tensor& a, double b) {
  if (!is_floating(a.dtype())) return a.to(DType::F32) * (1.0 / b);
  return a * (1.0 / b);
}
Tensor operator+(double a, const Tensor& b) { return b + a; }
Tensor operator-(double a, const Tensor& b) {
  if (!is_floating(b.dtype()) && a != std::floor(a)) return a - b.to(DType::F32);
  return unary(UnaryOp::RSubScalar, b, a);
}
Tensor operator*(double a, const Tensor& b) { return b * a; }
Tensor operator/(double a, const Tensor& b) { return unary(UnaryOp::RDivScalar, b, a); }
Tensor operator-(const Tensor& a) { return neg(a); }

#define KILN_COMPARISON(OPNAME, SYM, ENUM)                                                                    \
  Tensor operator SYM(const Tensor& a, const Tensor& b) { return binary_raw(BinaryOp::ENUM, a, b); }          \
  Tensor operator SYM(const Tensor& a, double b) { return binary_raw(BinaryOp::ENUM, a, wrap_scalar(b, a)); } \
  Tensor Tensor::OPNAME(const Tensor& o) const { return *this SYM o; }                                        \
  Tensor Tensor::OPNAME(double o) const { return *this SYM o; }
KILN_COMPARISON(eq, ==, Eq)
KILN_COMPARISON(ne, !=, Ne)
KILN_COMPARISON(lt, <, Lt)
KILN_COMPARISON(le, <=, Le)
KILN_COMPARISON(gt, >, Gt)
KILN_COMPARISON(ge, >=, Ge)
#undef KILN_COMPARISON

Tensor Tensor::add(const Tensor& o) const { return kiln::add(*this, o); }
Tensor Tensor::sub(const Tensor& o) const { return kiln::sub(*this, o); }
Tensor Tensor::mul(const Tensor& o) const { return kiln::mul(*this, o); }
Tensor Tensor::div(const Tensor& o) const { return kiln::div(*this, o); }
Tensor Tensor::gelu(const std::string& approximate) const { return kiln::gelu(*this, approximate); }
Tensor Tensor::pow(double e) const { return kiln::pow(*this, e); }
Tensor Tensor::pow(const Tensor& e) const { return kiln::pow(*this, e); }
Tensor Tensor::square() const { return kiln::pow(*this, 2.0); }
Tensor Tensor::clamp(double lo, double hi) const { return kiln::clamp(*this, lo, hi); }
Tensor Tensor::clamp_min(double lo) const { return kiln::clamp(*this, lo, INFINITY); }
Tensor Tensor::clamp_max(double hi) const { return kiln::clamp(*this, -INFINITY, hi); }

// ---------------------------------------------------------------- in-place (not recorded)

namespace {
using detail::check_inplace;

// Runs a binary kernel writing into `self` (which must already have the broadcast shape).
Tensor& binary_inplace(Tensor& self, BinaryOp op, const Tensor& other, const char* name, double alpha = 1) {
  check_inplace(self, name);
  check_same_device(name, self, other);
  IntList shape = broadcast_shapes(self.sizes(), other.sizes(), name);
  KILN_CHECK(shape == self.sizes(), name, ": the result of sizes ", shape,
             " does not fit in the in-place target of sizes ", self.sizes());
  DType result = promote_types(self.dtype(), other.dtype());
  KILN_CHECK(
      !(is_floating(result) && !is_floating(self.dtype())) && !(result != DType::Bool && self.dtype() == DType::Bool),
      name, ": result type ", result, " can't be cast to the in-place target's dtype ", self.dtype());
  NoGradGuard ng;
  kernels::binary(op, self, self, as_dtype(other.detach(), self.dtype()), alpha, 0.0);
  self.storage()->bump_version();
  return self;
}

Tensor& unary_inplace(Tensor& self, UnaryOp op, const char* name, double a, double b = 0) {
  check_inplace(self, name);
  kernels::unary(op, self, self, a, b);
  self.storage()->bump_version();
  return self;
}
}  // namespace

Tensor& Tensor::add_(const Tensor& o, double alpha) { return binary_inplace(*this, BinaryOp::Add, o, "add_", alpha); }
Tensor& Tensor::add_(double o) { return unary_inplace(*this, UnaryOp::AddScalar, "add_", o); }
Tensor& Tensor::mul_(const Tensor& o) { return binary_inplace(*this, BinaryOp::Mul, o, "mul_"); }
Tensor& Tensor::mul_(double o) { return unary_inplace(*this, UnaryOp::MulScalar, "mul_", o); }
Tensor& Tensor::div_(const Tensor& o) {
  KILN_CHECK(is_floating(dtype()), "div_: in-place true division needs a floating tensor, got ", dtype());
  return binary_inplace(*this, BinaryOp::Div, o, "div_");
}
Tensor& Tensor::clamp_(double lo, double hi) { return unary_inplace(*this, UnaryOp::Clamp, "clamp_", lo, hi); }

Tensor& operator+=(Tensor& a, const Tensor& b) { return a.add_(b); }
Tensor& operator-=(Tensor& a, const Tensor& b) { return a.sub_(b); }
Tensor& operator*=(Tensor& a, const Tensor& b) { return a.mul_(b); }
Tensor& operator/=(Tensor& a, const Tensor& b) { return a.div_(b); }
Tensor& operator+=(Tensor& a, double b) { return a.add_(b); }
Tensor& operator-=(Tensor& a, double b) { return a.add_(-b); }
Tensor& operator*=(Tensor& a, double b) { return a.mul_(b); }
Tensor& operator/=(Tensor& a, double b) { return a.div_(b); }

}  // namespace kiln
