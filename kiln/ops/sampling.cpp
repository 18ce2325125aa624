// multinomial: categorical sampling from rows of non-negative weights, with PyTorch's checks.
//
// The draws run on the host for every device: the rows are copied to the CPU in f64, sampled
// there, and the int64 result is copied back to probs' device (on a GPU this is two transfers and
// a sync; a device kernel is future work). Randomness: draw j of the call (row r, sample s,
// j = r * num_samples + s) is philox::uniform_d(seed, offset, j) from `generator` (default: probs'
// device's), which reserves rows * num_samples numbers, so results depend only on the seed and
// the generator's offset, never on threads (docs/architecture.md, "Random numbers").
//   with replacement:    the first category whose cumulative weight exceeds u * total;
//   without replacement: sequential draws, each from the weights not drawn yet in that row.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kiln/core/autograd.h"
#include "kiln/core/generator.h"
#include "kiln/core/philox.h"
#include "kiln/core/shape.h"

namespace kiln {

namespace {

// The index in [0, n) whose cumulative weight first exceeds target (zero weights never win).
int64_t pick(const std::vector<double>& w, int64_t n, double target) {
  double acc = 0;
  int64_t last_nonzero = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (w[i] <= 0) continue;
    acc += w[i];
    last_nonzero = i;
    if (acc > target) return i;
  }
  return last_nonzero;  // target rounded up to the total
}

}  // namespace

Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement, Generator* generator) {
  KILN_CHECK(probs.defined(), "multinomial: input is undefined");
  KILN_CHECK(probs.dim() == 1 || probs.dim() == 2, "multinomial: prob_dist must be 1 or 2 dim, got sizes ",
             probs.sizes());
  KILN_CHECK(is_floating(probs.dtype()), "multinomial: prob_dist must be a floating point tensor, got ", probs.dtype());
  KILN_CHECK(num_samples > 0, "multinomial: cannot sample ", num_samples, " (<= 0) samples");
  const int64_t n = probs.size(-1);
  const int64_t rows = probs.dim() == 2 ? probs.size(0) : 1;
  KILN_CHECK(n > 0, "multinomial: the number of categories must be positive, got sizes ", probs.sizes());
  KILN_CHECK(replacement || num_samples <= n, "multinomial: cannot sample n_sample (", num_samples,
             ") > prob_dist.size(-1) (", n, ") samples without replacement");

  Tensor w;
  {
    NoGradGuard ng;
    w = probs.detach().to(Device::cpu(), DType::F64).contiguous();
  }
  const double* p = w.data_ptr<double>();
  for (int64_t r = 0; r < rows; ++r) {
    double total = 0;
    int64_t nonzero = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double v = p[r * n + i];
      KILN_CHECK(std::isfinite(v) && v >= 0,
                 "multinomial: probability tensor contains either inf, nan or "
                 "element < 0 (row ",
                 r, ", category ", i, ": ", v, ")");
      total += v;
      nonzero += v > 0;
    }
    KILN_CHECK(total > 0, "multinomial: invalid multinomial distribution (sum of probabilities <= 0) in row ", r);
    KILN_CHECK(replacement || num_samples <= nonzero, "multinomial: row ", r, " has only ", nonzero,
               " non-zero weights, cannot draw ", num_samples, " samples without replacement");
  }

  Generator& gen = generator ? *generator : default_generator(probs.device());
  auto [seed, offset] = gen.reserve(static_cast<uint64_t>(rows * num_samples));
  Tensor out = empty({rows, num_samples}, DType::I64);
  int64_t* o = out.data_ptr<int64_t>();
  std::vector<double> row(n);
  for (int64_t r = 0; r < rows; ++r) {
    std::copy(p + r * n, p + (r + 1) * n, row.begin());
    double total = 0;
    for (double v : row) total += v;
    for (int64_t s = 0; s < num_samples; ++s) {
      const double u = philox::uniform_d(seed, offset, static_cast<uint64_t>(r * num_samples + s));
      const int64_t k = pick(row, n, u * total);
      o[r * num_samples + s] = k;
      if (!replacement) {
        row[k] = 0;
        total = 0;  // re-summed, not subtracted, so rounding never leaves a phantom weight
        for (double v : row) total += v;
      }
    }
  }
  if (probs.dim() == 1) out = out.view({num_samples});
  return probs.device().is_cpu() ? out : out.to(probs.device());
}

}  // namespace kiln
