#pragma once
// Pieces shared by the CPU batch-norm kernels (norm.cpp, the fused BN + ReLU + max pool in
// bn_relu_pool.cpp and the fused conv + BN + ReLU + max pool in conv_bn_relu_pool.cpp); internal
// to the CPU backend.
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kiln/core/dtype.h"
#include "kiln/core/tensor.h"
#include "kiln/kernels/cpu/loops.h"
#include "kiln/kernels/cpu/max_pool_2x2.h"

namespace kiln::kernels::cpu {

// The dtype batch-norm statistics are kept in for data of type T (norm_stat_dtype of kernels/norm.h).
template <class T> using stat_t = std::conditional_t<std::is_same<T, double>::value, double, float>;

// keep ? v : +0 (math::ReluBackward's select) as a bit mask. Written as `keep ? v : 0`, GCC
// (-ftrapping-math) leaves a branch inside double-accumulating reductions instead of vectorizing
// them, and on real activations the branch is mispredicted about half the time: the fused
// BatchNorm + ReLU backward ran 5x slower than the plain one.
template <class O> inline O keep_or_zero(bool keep, O v) {
  using U = std::conditional_t<sizeof(O) == 8, uint64_t, uint32_t>;
  static_assert(sizeof(O) == sizeof(U), "opmath is float or double");
  U bits;
  std::memcpy(&bits, &v, sizeof(O));
  bits &= U(0) - static_cast<U>(keep);
  O r;
  std::memcpy(&r, &bits, sizeof(O));
  return r;
}

// The x * k2 term of dx = g * k1 + x * k2 + k3, 0 when k2 is (eval mode): a NaN or inf input
// then gets PyTorch's eval gradient g * w * invstd instead of NaN * 0.
template <class O> inline O bn_x_term(O x, O k2) { return k2 == O(0) ? O(0) : x * k2; }

// After the backward's per-channel sums sum_g = sum(g) and dot = sum(g * (x - mean)) over the
// M = N * S elements of each channel: writes dweight = dot * invstd and dbias = sum_g (each when
// wanted) and returns the coefficients of dx = g * k1 + x * k2 + k3:
//   training: dx = w * invstd * (g - sum_g / M - (x - mean) * invstd^2 * dot / M)
//   eval:     dx = w * invstd * g
template <class O, class T, class ST>
void bn_backward_coefficients(int64_t C, int64_t M, bool training, const T* wp, const ST* mp, const ST* ip,
                              const std::vector<double>& sum_g, const std::vector<double>& dot, T* dwp, T* dbp,
                              std::vector<O>& k1, std::vector<O>& k2, std::vector<O>& k3) {
  k1.resize(C);
  k2.resize(C);
  k3.resize(C);
  for (int64_t c = 0; c < C; ++c) {
    if (dwp) dwp[c] = static_cast<T>(dot[c] * static_cast<double>(ip[c]));
    if (dbp) dbp[c] = static_cast<T>(sum_g[c]);
    const double w = wp ? static_cast<double>(wp[c]) : 1.0;
    const double is = static_cast<double>(ip[c]);
    const double a1 = w * is;
    const double a2 = training && M > 0 ? -w * is * is * is * dot[c] / M : 0.0;
    const double a3 = training && M > 0 ? -a1 * sum_g[c] / M - a2 * static_cast<double>(mp[c]) : 0.0;
    k1[c] = static_cast<O>(a1);
    k2[c] = static_cast<O>(a2);
    k3[c] = static_cast<O>(a3);
  }
}

// The per-channel affine map of the normalisation, in the op-math type.
template <class T, class O = opmath_t<T>>
std::vector<pool2x2::AffineRelu<O>> affine_maps(const Tensor& weight, const Tensor& bias, const Tensor& mean,
                                                const Tensor& invstd, int64_t C) {
  using ST = stat_t<T>;
  const T* wp = cptr<T>(weight);
  const T* bp = cptr<T>(bias);
  const ST* mp = cptr<ST>(mean);
  const ST* ip = cptr<ST>(invstd);
  std::vector<pool2x2::AffineRelu<O>> f(C);
  for (int64_t c = 0; c < C; ++c) {
    const O a = static_cast<O>(ip[c]) * (wp ? static_cast<O>(wp[c]) : O(1));
    f[c] = {a, (bp ? static_cast<O>(bp[c]) : O(0)) - static_cast<O>(mp[c]) * a};
  }
  return f;
}

}  // namespace kiln::kernels::cpu
