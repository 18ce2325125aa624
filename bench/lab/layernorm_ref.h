#pragma once
// What the two layer-norm programs (layernorm_cpu.cpp, layernorm_cuda.cu) share: the inputs, the
// traffic counted, and the f64 reference with the scales its errors are measured against and the
// checks of a forward's and a backward's outputs (layernorm_cpu.cpp's header derives the scales).
// Standard C++ only, so the CUDA program includes it too.
#include "lab.h"

namespace lab::layernorm {

constexpr float kEps = 1e-5f;

// x [R, C] with an offset mean, as activations have; g [R, C]; w, b [C] near 1 and 0.
inline void fill_inputs(float* x, float* g, float* w, float* b, int64_t R, int64_t C) {
  fill_normal(x, R * C, 1, 0.5, 2.0);
  fill_normal(g, R * C, 2);
  fill_normal(w, C, 3, 1.0, 0.2);
  fill_normal(b, C, 4, 0.0, 0.2);
}

// The minimal traffic in bytes: the forward reads x and writes y (8 bytes per element) and the
// statistics, the backward reads x and g and writes dx (12 bytes per element), reads the
// statistics and writes dw, db.
inline double forward_bytes(int64_t R, int64_t C) { return 8.0 * R * C + 8.0 * R; }
inline double backward_bytes(int64_t R, int64_t C) { return 12.0 * R * C + 8.0 * R + 8.0 * C; }

class Reference {
 public:
  // x, g [R, C] and w, b [C]; the backward from the f32 statistics smean, srstd [R] that every
  // version's backward is given.
  Reference(const float* x, const float* g, const float* w, const float* b, const float* smean, const float* srstd,
            int64_t R, int64_t C)
      : R_(R), C_(C) {
    for (auto* v : {&y_, &y_scale_, &dx_, &dx_scale_}) v->resize(R * C);
    for (auto* v : {&mean_, &mean_scale_, &rstd_}) v->resize(R);
    for (auto* v : {&dw_, &dw_scale_, &db_, &db_scale_}) v->assign(C, 0.0);
    for (int64_t r = 0; r < R; ++r) {
      forward_row(r, x + r * C, w, b);
      backward_row(r, x + r * C, g + r * C, w, smean[r], srstd[r]);
    }
  }

  // y [R, C], mean, rstd [R]: C-term sums, so tol = sum_tol(C).
  Check check_forward(const float* y, const float* mean, const float* rstd) const {
    const double tol = sum_tol(C_);
    Check c;
    c.compare("y", y, y_.data(), R_ * C_, tol, [&](int64_t i) { return y_scale_[i]; })
        .compare("mean", mean, mean_.data(), R_, tol, [&](int64_t i) { return mean_scale_[i]; })
        .compare("rstd", rstd, rstd_.data(), R_, tol, [&](int64_t i) { return rstd_[i]; });
    return c;
  }

  // dx [R, C] (C-term sums) and dw, db [C] (R-term sums: tol = sum_tol(R)).
  Check check_backward(const float* dx, const float* dw, const float* db) const {
    const double tol_row = sum_tol(C_), tol_col = sum_tol(R_);
    Check c;
    c.compare("dx", dx, dx_.data(), R_ * C_, tol_row, [&](int64_t i) { return dx_scale_[i]; })
        .compare("dw", dw, dw_.data(), C_, tol_col, [&](int64_t i) { return dw_scale_[i]; })
        .compare("db", db, db_.data(), C_, tol_col, [&](int64_t i) { return db_scale_[i]; });
    return c;
  }

 private:
  // y against |w| (|xhat| + 1) + |b|, mean against |mean| + std, rstd against itself.
  void forward_row(int64_t r, const float* x, const float* w, const float* b) {
    const int64_t C = C_;
    double s = 0, v = 0;
    for (int64_t j = 0; j < C; ++j) s += x[j];
    const double m = s / C;
    for (int64_t j = 0; j < C; ++j) v += (x[j] - m) * (x[j] - m);
    const double rs = 1.0 / std::sqrt(v / C + kEps);
    mean_[r] = m, mean_scale_[r] = std::abs(m) + 1.0 / rs, rstd_[r] = rs;
    for (int64_t j = 0; j < C; ++j) {
      const double xh = (x[j] - m) * rs;
      y_[r * C + j] = xh * w[j] + b[j];
      y_scale_[r * C + j] = std::abs(w[j]) * (std::abs(xh) + 1) + std::abs(b[j]);
    }
  }

  // dx against rstd (|gw| + mean|gw| + |xhat| mean|gw xhat|); dw, db against the sums of |terms|.
  void backward_row(int64_t r, const float* x, const float* g, const float* w, double ms, double rss) {
    const int64_t C = C_;
    double a = 0, b = 0, abs_a = 0, abs_b = 0;
    for (int64_t j = 0; j < C; ++j) {
      const double gw = double(g[j]) * w[j], xh = (x[j] - ms) * rss;
      a += gw, b += gw * xh, abs_a += std::abs(gw), abs_b += std::abs(gw * xh);
    }
    for (int64_t j = 0; j < C; ++j) {
      const double gw = double(g[j]) * w[j], xh = (x[j] - ms) * rss;
      dx_[r * C + j] = rss * (gw - a / C - xh * b / C);
      dx_scale_[r * C + j] = rss * (std::abs(gw) + abs_a / C + std::abs(xh) * abs_b / C);
      dw_[j] += g[j] * xh, dw_scale_[j] += std::abs(g[j] * xh);
      db_[j] += g[j], db_scale_[j] += std::abs(g[j]);
    }
  }

  int64_t R_, C_;
  std::vector<double> y_, y_scale_, mean_, mean_scale_, rstd_, dx_, dx_scale_, dw_, dw_scale_, db_, db_scale_;
};

}  // namespace lab::layernorm
