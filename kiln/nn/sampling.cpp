#include "kiln/nn/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kiln/core/autograd.h"
#include "kiln/kernels/copy_fill.h"

namespace kiln::nn {

namespace {

void check(const Tensor& logits, const SamplingOptions& o) {
  KILN_CHECK(logits.defined(), "sample_next_token: logits are undefined");
  KILN_CHECK((logits.dim() == 1 || logits.dim() == 2) && logits.size(-1) > 0,
             "sample_next_token: expected logits [V] or [B, V] with V > 0, got sizes ", logits.sizes());
  KILN_CHECK(logits.is_floating_point(), "sample_next_token: expected floating-point logits, got ", logits.dtype());
  KILN_CHECK(o.top_k() >= 0, "sample_next_token: top_k must be >= 0 (0 keeps all), got ", o.top_k());
  KILN_CHECK(o.top_p() > 0 && o.top_p() <= 1, "sample_next_token: top_p must be in (0, 1], got ", o.top_p());
  KILN_CHECK(!std::isnan(o.temperature()), "sample_next_token: temperature is NaN");
}

// One row of logits -> probabilities, in place.
void row_probs(double* p, int64_t V, const SamplingOptions& o) {
  int64_t best = 0;
  for (int64_t i = 1; i < V; ++i)
    if (p[i] > p[best] || (std::isnan(p[i]) && !std::isnan(p[best]))) best = i;
  if (o.temperature() <= 0 || !std::isfinite(p[best])) {  // greedy
    std::fill(p, p + V, 0.0);
    p[best] = 1.0;
    return;
  }
  const double m = p[best];
  double total = 0;
  for (int64_t i = 0; i < V; ++i) {
    p[i] = std::exp((p[i] - m) / o.temperature());
    total += p[i];
  }
  for (int64_t i = 0; i < V; ++i) p[i] /= total;
  if ((o.top_k() > 0 && o.top_k() < V) || o.top_p() < 1) {
    std::vector<int64_t> order(V);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
    int64_t keep = V;
    if (o.top_k() > 0 && o.top_k() < V) {
      keep = o.top_k();
      while (keep < V && p[order[keep]] == p[order[o.top_k() - 1]]) ++keep;  // ties with the k-th
    }
    if (o.top_p() < 1) {
      double acc = 0;
      int64_t n = 0;
      while (n < keep) {
        acc += p[order[n++]];
        if (acc >= o.top_p()) break;
      }
      keep = std::max<int64_t>(n, 1);
    }
    for (int64_t j = keep; j < V; ++j) p[order[j]] = 0;
    double kept = 0;
    for (int64_t i = 0; i < V; ++i) kept += p[i];
    for (int64_t i = 0; i < V; ++i) p[i] /= kept;
  }
}

}  // namespace

Tensor sampling_probs(const Tensor& logits, const SamplingOptions& opts) {
  check(logits, opts);
  NoGradGuard ng;
  Tensor probs = logits.detach().to(Device::cpu(), DType::F64).contiguous().clone();
  const int64_t V = probs.size(-1), rows = probs.numel() / V;
  double* p = probs.data_ptr<double>();
  for (int64_t r = 0; r < rows; ++r) row_probs(p + r * V, V, opts);
  return probs;
}

Tensor sample_next_token(const Tensor& logits, const SamplingOptions& opts, Generator* generator) {
  Tensor probs = sampling_probs(logits, opts);
  NoGradGuard ng;
  const int64_t V = probs.size(-1), rows = probs.numel() / V;
  Tensor u = empty({rows}, TensorOptions().dtype(DType::F64));
  Generator& g = generator ? *generator : default_generator(Device::cpu());
  auto [seed, offset] = g.reserve(static_cast<uint64_t>(rows));
  kernels::fill_uniform(u, seed, offset);
  const double* p = probs.data_ptr<double>();
  const double* up = u.data_ptr<double>();
  std::vector<int64_t> tokens(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const double* row = p + r * V;
    double acc = 0;
    int64_t next = -1, last_nonzero = 0;
    for (int64_t i = 0; i < V; ++i) {
      if (row[i] > 0) last_nonzero = i;
      acc += row[i];
      if (next < 0 && up[r] < acc && row[i] > 0) next = i;
    }
    tokens[r] = next < 0 ? last_nonzero : next;  // rounding: the last token that can be drawn
  }
  Tensor out = kiln::tensor(tokens);
  if (logits.dim() == 1) out = out.reshape({});
  return out.to(logits.device());
}

}  // namespace kiln::nn
