#pragma once
// What the two cross-entropy programs (softmax_xent_cpu.cpp, softmax_xent_cuda.cu) share: the
// inputs, the traffic counted, and the f64 reference with the scales its errors are measured
// against (softmax_xent_cpu.cpp's header derives them). Standard C++ only, so the CUDA program
// includes it too.
#include "lab.h"

namespace lab::softmax_xent {

// Logits x [R, C] (normal, stddev 3) and class targets [R].
inline void fill_inputs(float* x, int64_t* target, int64_t R, int64_t C) {
  fill_normal(x, R * C, 1, 0.0, 3.0);
  uint64_t seed = 7;
  for (int64_t r = 0; r < R; ++r) target[r] = static_cast<int64_t>(splitmix(seed) % static_cast<uint64_t>(C));
}

// The minimal traffic in bytes: one read of x and one write of dx (8 bytes per element), and per
// row the target, the loss and lse.
inline double bytes(int64_t R, int64_t C) { return 8.0 * R * C + 20.0 * R; }

class Reference {
 public:
  // g: the loss gradient of every row.
  Reference(const float* x, const int64_t* target, float g, int64_t R, int64_t C)
      : R_(R), C_(C), loss_(R), loss_scale_(R), dx_(R * C), dx_scale_(R * C) {
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int64_t r = 0; r < R; ++r) row(r, x + r * C, target[r], g);
  }

  // The sum of exps rounds like a sum added one term at a time: tol = sum_tol_linear(C).
  Check check(const float* loss, const float* dx) const {
    const double tol = sum_tol_linear(C_);
    Check c;
    c.compare("loss", loss, loss_.data(), R_, tol, [&](int64_t i) {
       return loss_scale_[i];
     }).compare("dx", dx, dx_.data(), R_ * C_, tol, [&](int64_t i) { return dx_scale_[i]; });
    return c;
  }

 private:
  // loss against 1 + |x_t - m| + log s, dx_j against g (p_j (1 + |x_j - m| + log s) + [j == t] + 1e-30).
  void row(int64_t r, const float* x, int64_t t, float g) {
    const int64_t C = C_;
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < C; ++j) m = std::max<double>(m, x[j]);
    for (int64_t j = 0; j < C; ++j) s += std::exp(x[j] - m);
    const double lse = m + std::log(s), xt = x[t];
    loss_[r] = lse - xt;
    loss_scale_[r] = 1 + std::abs(xt - m) + std::log(s);
    for (int64_t j = 0; j < C; ++j) {
      const double p = std::exp(x[j] - lse);
      dx_[r * C + j] = (p - (j == t)) * g;
      dx_scale_[r * C + j] = g * (p * (1 + std::abs(x[j] - m) + std::log(s)) + (j == t) + 1e-30);
    }
  }

  int64_t R_, C_;
  std::vector<double> loss_, loss_scale_, dx_, dx_scale_;
};

}  // namespace lab::softmax_xent
