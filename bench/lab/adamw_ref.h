#pragma once
// What the two AdamW programs (adamw_cpu.cpp, adamw_cuda.cu) share: the hyperparameters, the
// GPT-2-like parameter list, the step's scalars, the inputs, and the f64 reference of the checked
// steps with the scales and tolerances its errors are measured against (adamw_cpu.cpp's header
// says why). Standard C++ only, so the CUDA program includes it too.
#include "lab.h"

namespace lab::adamw {

constexpr double kLr = 1e-3, kBeta1 = 0.9, kBeta2 = 0.95, kEps = 1e-8, kWd = 0.1;
constexpr int kCheckedSteps = 3;  // the steps from p0, m = v = 0 that are validated (t = 1, 2, 3)

struct Param {  // one parameter tensor: a range of the flat buffers
  int64_t offset, numel;
};

// GPT-2 block shapes (ln_1, attention qkv and projection, ln_2, MLP in and out), repeated and cut
// at n elements; each tensor starts on a 64-byte boundary. *padded: the flat buffers' length.
inline std::vector<Param> gpt2_like_list(int64_t n, int64_t* padded) {
  const int64_t E = 768;
  const int64_t block[] = {E, E, E * 3 * E, 3 * E, E * E, E, E, E, E * 4 * E, 4 * E, 4 * E * E, E};
  std::vector<Param> list;
  int64_t total = 0, offset = 0;
  for (size_t i = 0; total < n; ++i) {
    const int64_t numel = std::min(block[i % 12], n - total);
    list.push_back({offset, numel});
    total += numel;
    offset += (numel + 15) / 16 * 16;
  }
  *padded = offset;
  return list;
}

// The step's scalars, as every version computes them (on the host) for step t.
struct Hyper {
  float decay, b1, b2, one_minus_b1, one_minus_b2, step_size, inv_bc2_sqrt, eps;
  explicit Hyper(int t)
      : decay(float(1 - kLr * kWd)),
        b1(float(kBeta1)),
        b2(float(kBeta2)),
        one_minus_b1(float(1 - kBeta1)),
        one_minus_b2(float(1 - kBeta2)),
        step_size(float(kLr / (1 - std::pow(kBeta1, t)))),
        inv_bc2_sqrt(float(1 / std::sqrt(1 - std::pow(kBeta2, t)))),
        eps(float(kEps)) {}
};

// The initial parameters p0 and the gradient g, over the padded flat buffers.
inline void fill_inputs(float* p0, float* g, int64_t padded) {
  fill_normal(p0, padded, 1, 0.0, 0.02);
  fill_normal(g, padded, 2, 0.0, 0.01);
}

// The minimal traffic in bytes: p, g, m, v read and p, m, v written once, 28 bytes per parameter.
inline double bytes(int64_t n) { return 28.0 * n; }

// p, m, v after kCheckedSteps steps from p0 with zero moments, in f64 (the padding between the
// tensors stays as it was).
class Reference {
 public:
  Reference(const float* p0, const float* g, const std::vector<Param>& list, int64_t padded)
      : p_(p0, p0 + padded), m_(padded, 0.0), v_(padded, 0.0) {
    for (int t = 1; t <= kCheckedSteps; ++t) {
      const double step_size = kLr / (1 - std::pow(kBeta1, t)), ibc2 = 1 / std::sqrt(1 - std::pow(kBeta2, t));
      for (const Param& X : list)
        for (int64_t i = X.offset; i < X.offset + X.numel; ++i) {
          m_[i] = kBeta1 * m_[i] + (1 - kBeta1) * g[i];
          v_[i] = kBeta2 * v_[i] + (1 - kBeta2) * double(g[i]) * g[i];
          p_[i] = p_[i] * (1 - kLr * kWd) - step_size * m_[i] / (std::sqrt(v_[i]) * ibc2 + kEps);
        }
    }
  }

  // p against |p| + lr, tol = 32 eps (three steps of ~10 roundings).
  Check& compare_p(Check& c, const float* p) const {
    return c.compare("p", p, p_.data(), size(), 32 * kEpsF32, [&](int64_t i) { return std::abs(p_[i]) + kLr; });
  }
  // m and v against themselves, tol = 16 eps.
  Check& compare_m(Check& c, const float* m) const { return compare_moment(c, "m", m, m_); }
  Check& compare_v(Check& c, const float* v) const { return compare_moment(c, "v", v, v_); }

 private:
  int64_t size() const { return static_cast<int64_t>(p_.size()); }
  Check& compare_moment(Check& c, const char* what, const float* out, const std::vector<double>& ref) const {
    return c.compare(what, out, ref.data(), size(), 16 * kEpsF32, [&](int64_t i) { return std::abs(ref[i]) + 1e-30; });
  }

  std::vector<double> p_, m_, v_;
};

}  // namespace lab::adamw
