// conv2d with a following BatchNorm's batch statistics taken in its epilogue
// (kernels::conv2d_forward_batch_stats, kiln/kernels/conv_block.h): the conv runs the NCHW
// kernel through cpu::conv2d_forward_epilogue, and as each block of samples finishes, the mean
// and the sum of squared deviations of every sample's output plane are taken while the plane is
// in cache; the per-sample moments are then combined in sample order, so the result does not
// depend on which thread ran which sample.
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/kernels/conv_block.h"
#include "kiln/kernels/dispatch.h"

namespace kiln::kernels::cpu {

namespace {

// Sum of the L lane sums by halving (the wide steps vectorise), not one serial chain.
template <class T, int64_t L> double tree_sum(T (&acc)[L]) {
  for (int64_t w = L / 2; w >= 1; w /= 2)
    for (int64_t l = 0; l < w; ++l) acc[l] += acc[l + w];
  return static_cast<double>(acc[0]);
}

// ms[0] = mean of v[0, n), ms[1] = sum of (v - mean)^2: two passes over a cache-resident plane
// with 64 independent lane sums each (one accumulator chain would be add-latency bound), in T,
// added up by halving. A plane of a few hundred values keeps T's rounding far below BatchNorm's eps.
template <class T> void plane_mean_m2(const T* v, int64_t n, double* ms) {
  constexpr int64_t L = 64;
  T acc[L] = {};
  int64_t i = 0;
  for (; i + L <= n; i += L)
    for (int64_t l = 0; l < L; ++l) acc[l] += v[i + l];
  double s = tree_sum(acc);
  for (; i < n; ++i) s += static_cast<double>(v[i]);
  const double m = s / static_cast<double>(n);
  const T mt = static_cast<T>(m);
  T acc2[L] = {};
  for (i = 0; i + L <= n; i += L)
    for (int64_t l = 0; l < L; ++l) {
      const T d = v[i + l] - mt;
      acc2[l] += d * d;
    }
  double q = tree_sum(acc2);
  for (; i < n; ++i) {
    const double d = static_cast<double>(v[i]) - static_cast<double>(mt);
    q += d * d;
  }
  // deviations were taken from mt = T(m): sum (v - m)^2 = sum (v - mt)^2 - n (m - mt)^2
  const double e = m - static_cast<double>(mt);
  ms[0] = m;
  ms[1] = std::max(0.0, q - static_cast<double>(n) * e * e);
}

// Chan et al.'s pairwise update of (mean, M2) over the samples, in sample order; writes the batch
// mean and biased variance per channel.
template <class S>
void combine_samples(const std::vector<double>& per_sample, int64_t N, int64_t K, int64_t S_plane, S* mean, S* var) {
  for (int64_t k = 0; k < K; ++k) {
    double m = 0, q = 0, count = 0;
    for (int64_t n = 0; n < N; ++n) {
      const double mn = per_sample[(n * K + k) * 2], qn = per_sample[(n * K + k) * 2 + 1];
      const double c = static_cast<double>(S_plane), tot = count + c, d = mn - m;
      m += d * c / tot;
      q += qn + d * d * count * c / tot;
      count = tot;
    }
    mean[k] = static_cast<S>(m);
    var[k] = static_cast<S>(q / count);
  }
}

template <class T>
void batch_stats_impl(const Tensor& out, const Tensor& mean, const Tensor& var, const Tensor& x, const Tensor& weight,
                      const Tensor& bias, const ConvGeometry& g) {
  const int64_t S_plane = g.OH * g.OW;
  std::vector<double> per_sample(g.N * g.K * 2);
  const T* op = out.data_ptr<T>();
  conv2d_forward_epilogue(out, x, weight, bias, g, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t k = 0; k < g.K; ++k)
        plane_mean_m2(op + (n * g.K + k) * S_plane, S_plane, per_sample.data() + (n * g.K + k) * 2);
  });
  if (mean.dtype() == DType::F64)
    combine_samples(per_sample, g.N, g.K, S_plane, mean.data_ptr<double>(), var.data_ptr<double>());
  else combine_samples(per_sample, g.N, g.K, S_plane, mean.data_ptr<float>(), var.data_ptr<float>());
}

}  // namespace

void conv2d_forward_batch_stats(const Tensor& out, const Tensor& mean, const Tensor& var, const Tensor& x,
                                const Tensor& weight, const Tensor& bias, const ConvGeometry& g) {
  const char* op = "conv2d_forward_batch_stats";
  KILN_CHECK(x.dtype() == DType::F32 || x.dtype() == DType::F64, op, ": f32 or f64 input only, got ", x.dtype());
  const DType st = x.dtype() == DType::F64 ? DType::F64 : DType::F32;
  for (const Tensor* t : {&mean, &var})
    KILN_CHECK(t->defined() && t->is_contiguous() && t->numel() == g.K && t->dtype() == st, op,
               ": mean and var must be contiguous [", g.K, "] ", st, " tensors");
  KILN_CHECK(g.N * g.OH * g.OW > 0, op, ": no output elements to take statistics over");
  if (x.dtype() == DType::F64) batch_stats_impl<double>(out, mean, var, x, weight, bias, g);
  else batch_stats_impl<float>(out, mean, var, x, weight, bias, g);
}

}  // namespace kiln::kernels::cpu

namespace kiln::kernels {

bool supports_conv2d_batch_stats(const Tensor& x, const ConvGeometry& g) {
  return x.defined() && x.device().is_cpu() && (x.dtype() == DType::F32 || x.dtype() == DType::F64) &&
         !g.channels_last && x.dim() == 4 && x.is_contiguous() && g.N * g.OH * g.OW > 0;
}

KILN_REGISTER_KERNEL(conv2d_forward_batch_stats, CPU, cpu::conv2d_forward_batch_stats);

}  // namespace kiln::kernels
