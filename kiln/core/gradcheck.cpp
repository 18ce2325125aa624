#include "kiln/core/gradcheck.h"

#include <cmath>

#include "kiln/core/autograd.h"

namespace kiln {

namespace {
// Element `i` (row-major logical index) of a possibly strided f64 tensor.
double* element(const Tensor& t, int64_t i) {
  int64_t off = 0;
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    int64_t sz = t.sizes()[d];
    off += (i % sz) * t.strides()[d];
    i /= sz;
  }
  return t.data_ptr<double>() + off;
}
}  // namespace

bool gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& inputs,
               double eps, double atol, double rtol) {
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& x = inputs[k];
    if (!x.requires_grad()) continue;
    KILN_CHECK(x.dtype() == DType::F64 && x.device().is_cpu(), "gradcheck: input ", k,
               " must be a float64 CPU tensor, got ", x.dtype(), " on ", x.device());
  }
  // fn runs with grad mode on throughout: it may itself call autograd::grad (double backward).
  Tensor out0 = fn(inputs).detach().to(DType::F64).contiguous().clone();
  const int64_t n_out = out0.numel();

  // Analytic Jacobian rows: one backward per output element.
  std::vector<Tensor> diff_inputs;
  std::vector<size_t> diff_index;
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (inputs[k].requires_grad()) {
      diff_inputs.push_back(inputs[k]);
      diff_index.push_back(k);
    }
  }
  KILN_CHECK(!diff_inputs.empty(), "gradcheck: no input requires grad");
  // analytic[j][k] = d out_j / d input_k (as a tensor of input_k's shape)
  std::vector<std::vector<Tensor>> analytic(n_out);
  for (int64_t j = 0; j < n_out; ++j) {
    Tensor out = fn(inputs);
    KILN_CHECK(out.requires_grad(), "gradcheck: the output does not require grad");
    Tensor seed = zeros(out.sizes(), out.options());
    {
      NoGradGuard ng;
      seed.reshape({-1}).select(0, j).fill_(1.0);
    }
    auto grads = autograd::grad({out}, diff_inputs, {seed}, false, false, /*allow_unused=*/true);
    for (auto& g : grads) {
      if (g.defined()) g = g.detach().to(DType::F64).contiguous();
    }
    analytic[j] = grads;
  }

  // Numerical Jacobian: perturb each input element in place (through the raw pointer, so the
  // version counter is untouched).
  for (size_t d = 0; d < diff_inputs.size(); ++d) {
    const Tensor& x = diff_inputs[d];
    for (int64_t i = 0; i < x.numel(); ++i) {
      double* p = element(x, i);
      const double orig = *p;
      *p = orig + eps;
      Tensor plus = fn(inputs).detach().to(DType::F64).contiguous().clone();
      *p = orig - eps;
      Tensor minus = fn(inputs).detach().to(DType::F64).contiguous().clone();
      *p = orig;
      const double* pp = plus.data_ptr<double>();
      const double* mp = minus.data_ptr<double>();
      for (int64_t j = 0; j < n_out; ++j) {
        double numeric = (pp[j] - mp[j]) / (2 * eps);
        const Tensor& g = analytic[j][d];
        double a = g.defined() ? g.data_ptr<double>()[i] : 0.0;
        bool ok = std::abs(a - numeric) <= atol + rtol * std::abs(numeric);
        KILN_CHECK(ok, "gradcheck: Jacobian mismatch for input ", diff_index[d], " (sizes ", x.sizes(), ") element ", i,
                   " w.r.t. output element ", j, ": analytic ", a, " vs numerical ", numeric, " (atol ", atol,
                   ", rtol ", rtol, ")");
      }
    }
  }
  return true;
}

}  // namespace kiln
