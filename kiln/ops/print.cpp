// operator<< for tensors, formatted like PyTorch: values aligned to a common width, large tensors
// summarised with "..." (3 edge items per dimension above 1000 elements), then the dtype, device
// and autograd state when they are not the defaults.
#include <cmath>
#include <cstdio>
#include <ostream>
#include <sstream>

#include "kiln/core/autograd.h"

namespace kiln {

namespace {

constexpr int64_t kSummaryThreshold = 1000;
constexpr int64_t kEdgeItems = 3;

struct Formatter {
  enum Kind { Int, IntFloat, Fixed, Sci, Bool } kind = Fixed;
  int width = 1;

  std::string format(double v) const {
    char buf[64];
    switch (kind) {
      case Bool: return v != 0 ? "True" : "False";
      case Int: std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v)); break;
      case IntFloat:
        if (std::isfinite(v)) std::snprintf(buf, sizeof buf, "%.0f.", v);
        else std::snprintf(buf, sizeof buf, "%s", std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf"));
        break;
      case Fixed:
        if (std::isfinite(v)) std::snprintf(buf, sizeof buf, "%.4f", v);
        else std::snprintf(buf, sizeof buf, "%s", std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf"));
        break;
      case Sci:
        if (std::isfinite(v)) std::snprintf(buf, sizeof buf, "%.4e", v);
        else std::snprintf(buf, sizeof buf, "%s", std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf"));
        break;
    }
    return buf;
  }
};

// Logical element access on a contiguous f64 host copy.
struct View {
  const double* data;
  IntList sizes;
  IntList strides;
};

void collect(const View& v, int64_t dim, int64_t offset, bool summarize, std::vector<double>& out) {
  if (dim == static_cast<int64_t>(v.sizes.size())) {
    out.push_back(v.data[offset]);
    return;
  }
  int64_t n = v.sizes[dim];
  for (int64_t i = 0; i < n; ++i) {
    if (summarize && n > 2 * kEdgeItems && i == kEdgeItems) i = n - kEdgeItems;
    collect(v, dim + 1, offset + i * v.strides[dim], summarize, out);
  }
}

void emit(std::ostream& os, const View& v, const Formatter& f, int64_t dim, int64_t offset, bool summarize,
          int indent) {
  const int64_t nd = static_cast<int64_t>(v.sizes.size());
  if (nd == 0) {
    os << f.format(v.data[offset]);
    return;
  }
  os << '[';
  int64_t n = v.sizes[dim];
  for (int64_t i = 0; i < n; ++i) {
    if (summarize && n > 2 * kEdgeItems && i == kEdgeItems) {
      os << (dim == nd - 1 ? " ..." : "...");
      if (dim == nd - 1) os << ", ";
      else os << ',' << std::string(nd - dim - 1, '\n') << std::string(indent + 1, ' ');
      i = n - kEdgeItems;
    }
    if (dim == nd - 1) {
      std::string s = f.format(v.data[offset + i * v.strides[dim]]);
      os << std::string(f.width > static_cast<int>(s.size()) ? f.width - s.size() : 0, ' ') << s;
    } else {
      emit(os, v, f, dim + 1, offset + i * v.strides[dim], summarize, indent + 1);
    }
    if (i + 1 < n) {
      if (dim == nd - 1) os << ", ";
      else os << ',' << std::string(nd - dim - 1, '\n') << std::string(indent + 1, ' ');
    }
  }
  os << ']';
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const IntList& sizes) {
  os << '[';
  for (size_t i = 0; i < sizes.size(); ++i) os << (i ? ", " : "") << sizes[i];
  return os << ']';
}

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  Tensor host;
  {
    NoGradGuard ng;
    host = detach().to(Device::cpu()).to(DType::F64).contiguous();
  }
  View v{host.data_ptr<double>(), host.sizes(), host.strides()};
  const bool summarize = numel() > kSummaryThreshold;
  std::vector<double> shown;
  if (numel() > 0) collect(v, 0, 0, summarize, shown);

  Formatter f;
  if (dtype() == DType::Bool) {
    f.kind = Formatter::Bool;
  } else if (!is_floating(dtype())) {
    f.kind = Formatter::Int;
  } else {
    bool all_int = true;
    double max_abs = 0, min_abs = INFINITY;
    for (double x : shown) {
      if (!std::isfinite(x)) continue;
      if (x != std::floor(x)) all_int = false;
      double a = std::abs(x);
      max_abs = std::max(max_abs, a);
      if (a > 0) min_abs = std::min(min_abs, a);
    }
    // PyTorch's rule: scientific when the magnitudes span more than 1000x, or are huge/tiny.
    const bool spread = std::isfinite(min_abs) && max_abs / min_abs > 1000.0;
    if (all_int) f.kind = (spread || max_abs > 1e8) ? Formatter::Sci : Formatter::IntFloat;
    else if (spread || max_abs > 1e8 || (std::isfinite(min_abs) && min_abs < 1e-4)) f.kind = Formatter::Sci;
    else f.kind = Formatter::Fixed;
  }
  for (double x : shown) f.width = std::max<int>(f.width, static_cast<int>(f.format(x).size()));

  std::ostringstream os;
  os << "tensor(";
  if (numel() == 0) {
    os << "[]";
  } else {
    emit(os, v, f, 0, 0, summarize, 7);
  }
  if (numel() == 0 && dim() != 1) os << ", size=" << sizes();
  if (device() != Device::cpu()) os << ", device='" << device() << "'";
  bool default_dtype = dtype() == DType::F32 || dtype() == DType::I64 || dtype() == DType::Bool;
  if (!default_dtype) os << ", dtype=" << dtype();
  if (grad_fn()) os << ", grad_fn=<" << grad_fn()->name() << ">";
  else if (requires_grad()) os << ", requires_grad=True";
  os << ')';
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

}  // namespace kiln
