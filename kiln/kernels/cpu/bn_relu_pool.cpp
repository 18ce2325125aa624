// Fused BatchNorm + ReLU + 2x2/2 max pool on the CPU (NCHW), forward and backward: the
// conv -> BN -> ReLU -> max-pool block of VGG-style CNNs such as the Fashion-MNIST CNN.
//
// Forward: with a_c = invstd_c * w_c and b_c = bias_c - mean_c * a_c, each window's four values
// go through y = relu(fma(x, a_c, b_c)) and are max-pooled at once (max_pool_2x2.h): neither
// the normalised tensor nor the ReLU output is ever written. Only the pooled output and the
// argmax indices (int32 flat h * W + w, as max_pool2d's) leave the kernel.
//
// Backward, from the pooled gradient gout: the gradient reaching BatchNorm is gout at each
// window's argmax where that element's pre-activation was positive (or NaN, as PyTorch's relu
// backward), and 0 everywhere else. The pooled output itself says where: out = relu(pre at the
// argmax) is positive or NaN exactly when the mask is on. With the forward's x at the argmax (pooled_x), both passes
// read only pooled-size tensors except for pass 2's own x and dx:
//   pass 1 (training, or dweight/dbias wanted): per channel, sum_g = sum of those gradients and
//          dot = sum of gradient * (pooled_x - mean) -- contiguous, vectorised;
//   pass 2: per plane, dx = x * k2 + k3 everywhere (the batch-statistics terms), then
//          dx[argmax] += gout * k1 where the mask is on -- the plane is still in L1.
// Traffic for the CNN's first block ([128, 32, 28, 28]) against batch_norm + relu + max_pool2d
// run separately: ~32 vs ~58 MB forward, ~51 vs ~83 MB backward (bench_norm).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/kernels/cpu/max_pool_2x2.h"
#include "kiln/kernels/cpu/batch_norm_common.h"
#include "kiln/kernels/conv_block.h"
#include "kiln/kernels/norm.h"
#include "kiln/kernels/pool.h"

namespace kiln::kernels::cpu {

namespace {

struct Block {
  int64_t N, C, H, W, OH, OW;
};

Block block_of(const char* op, const Tensor& x, const Tensor& pooled) {
  KILN_CHECK(x.dim() == 4 && x.is_contiguous(), op, ": expected a contiguous NCHW input, got sizes ", x.sizes(),
             " strides ", x.strides());
  Block b{x.size(0), x.size(1), x.size(2), x.size(3), x.size(2) / 2, x.size(3) / 2};
  KILN_CHECK(pooled.sizes() == IntList({b.N, b.C, b.OH, b.OW}) && pooled.is_contiguous(), op,
             ": pooled operand has sizes ", pooled.sizes(), ", expected contiguous ", IntList({b.N, b.C, b.OH, b.OW}));
  return b;
}

}  // namespace

void batch_norm_relu_max_pool2x2_forward(const Tensor& out, const Tensor& indices, const Tensor& pooled_x,
                                         const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& mean,
                                         const Tensor& invstd) {
  const char* op = "batch_norm_relu_max_pool2d";
  const Block b = block_of(op, x, out);
  KILN_CHECK(indices.dtype() == DType::I32 && indices.sizes() == out.sizes() && indices.is_contiguous(), op,
             ": indices must be contiguous int32 like the output");
  KILN_CHECK(!pooled_x.defined() ||
                 (pooled_x.sizes() == out.sizes() && pooled_x.is_contiguous() && pooled_x.dtype() == x.dtype()),
             op, ": pooled_x must be contiguous like the output");
  if (out.numel() == 0) return;
  dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto f = affine_maps<T>(weight, bias, mean, invstd, b.C);
    const T* xp = cptr<T>(x);
    T* op_ = mptr<T>(out);
    int32_t* ip = mptr<int32_t>(indices);
    T* rawp = mptr<T>(pooled_x);
    const int64_t planes = b.N * b.C, HW = b.H * b.W, OHW = b.OH * b.OW;
#pragma omp parallel for schedule(dynamic, 16) if (planes * HW >= 32768)  // planes are independent
    for (int64_t p = 0; p < planes; ++p) {
      const T* xpl = xp + p * HW;
      for (int64_t oh = 0; oh < b.OH; ++oh)
        pool2x2::max_2x2_row_pair(xpl + 2 * oh * b.W, xpl + (2 * oh + 1) * b.W, op_ + p * OHW + oh * b.OW,
                                  ip + p * OHW + oh * b.OW, b.OW, static_cast<int32_t>(2 * oh * b.W),
                                  static_cast<int32_t>(b.W), f[p % b.C], rawp ? rawp + p * OHW + oh * b.OW : nullptr);
    }
  });
}

namespace {

// The backward of the fused BN + ReLU + pool in its two halves: sums() (pass 1, then dweight /
// dbias and the dx coefficients) and plane() (pass 2 for one [H, W] plane), so that a caller can
// produce dx plane by plane into a cache-resident buffer (conv2d_batch_norm_relu_max_pool2x2_backward
// below) instead of a tensor.
template <class T> struct PooledBnBackward {
  using O = opmath_t<T>;
  using ST = stat_t<T>;
  Block b;
  const T *gp, *yp, *pxp, *wp;
  const int32_t* ip;
  const ST *mp, *isp;
  std::vector<O> k1, k2, k3;

  // ---- pass 1: per channel, over the argmax elements whose ReLU was on; writes dweight/dbias
  void sums(T* dwp, T* dbp, bool need_dx, bool training) {
    const int64_t HW = b.H * b.W, OHW = b.OH * b.OW;
    const int64_t M = b.N * HW;  // elements per channel the statistics were taken over
    const bool par = b.N * b.C * HW >= 32768;
    std::vector<double> sum_g(b.C, 0.0), dot(b.C, 0.0);
    if (dwp || dbp || (need_dx && training)) {
#pragma omp parallel for schedule(dynamic, 1) if (par)
      for (int64_t c = 0; c < b.C; ++c) {
        const double m = static_cast<double>(mp[c]);
        double s = 0, d = 0;
        for (int64_t n = 0; n < b.N; ++n) {
          const int64_t at = (n * b.C + c) * OHW;
          const T* gpl = gp + at;
          const T* ypl = yp + at;
          const T* xpl = pxp + at;
#pragma omp simd reduction(+ : s, d)
          for (int64_t o = 0; o < OHW; ++o) {
            const double gv = keep_or_zero(!(ypl[o] <= T(0)), static_cast<double>(gpl[o]));
            s += gv;
            d += gv * (static_cast<double>(xpl[o]) - m);
          }
        }
        sum_g[c] = s;
        dot[c] = d;
      }
    }
    bn_backward_coefficients(b.C, M, training, wp, mp, isp, sum_g, dot, dwp, dbp, k1, k2, k3);
  }

  // ---- pass 2 for plane p (= n * C + c): dx = g * k1 + x * k2 + k3 with g sparse
  void plane(int64_t p, const T* xpl, T* dpl) const {
    const int64_t c = p % b.C, HW = b.H * b.W, OHW = b.OH * b.OW;
    const O a2 = k2[c], a3 = k3[c], a1 = k1[c];
#pragma omp simd
    for (int64_t i = 0; i < HW; ++i) dpl[i] = static_cast<T>(bn_x_term(static_cast<O>(xpl[i]), a2) + a3);
    const T* gpl = gp + p * OHW;
    const T* ypl = yp + p * OHW;
    const int32_t* ipl = ip + p * OHW;
    // The argmax positions of a plane are distinct (the windows do not overlap), so the
    // scatter vectorises; no branch: the mask is on about half the time.
#pragma omp simd
    for (int64_t o = 0; o < OHW; ++o) {
      const O gv = keep_or_zero(!(ypl[o] <= T(0)), static_cast<O>(gpl[o]));
      dpl[ipl[o]] = static_cast<T>(static_cast<O>(dpl[ipl[o]]) + gv * a1);
    }
  }
};

void check_backward_operands(const char* op, const Tensor& gout, const Tensor& out, const Tensor& pooled_x,
                             const Tensor& indices, const Tensor& x) {
  KILN_CHECK(indices.dtype() == DType::I32 && indices.sizes() == gout.sizes() && indices.is_contiguous(), op,
             ": indices must be contiguous int32 like the pooled gradient");
  for (const Tensor* t : {&out, &pooled_x})
    KILN_CHECK(t->sizes() == gout.sizes() && t->is_contiguous() && t->dtype() == x.dtype(), op,
               ": the forward's output and pooled_x must be contiguous like the pooled gradient");
}

template <class T>
PooledBnBackward<T> pooled_backward(const Block& b, const Tensor& gout, const Tensor& out, const Tensor& pooled_x,
                                    const Tensor& indices, const Tensor& weight, const Tensor& mean,
                                    const Tensor& invstd) {
  using ST = stat_t<T>;
  PooledBnBackward<T> r;
  r.b = b;
  r.gp = cptr<T>(gout);
  r.yp = cptr<T>(out);
  r.pxp = cptr<T>(pooled_x);
  r.wp = cptr<T>(weight);
  r.ip = cptr<int32_t>(indices);
  r.mp = cptr<ST>(mean);
  r.isp = cptr<ST>(invstd);
  return r;
}

}  // namespace

void batch_norm_relu_max_pool2x2_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                                          const Tensor& gout, const Tensor& out, const Tensor& pooled_x,
                                          const Tensor& indices, const Tensor& x, const Tensor& weight,
                                          const Tensor& mean, const Tensor& invstd, bool training) {
  const char* op = "batch_norm_relu_max_pool2d_backward";
  const Block b = block_of(op, x, gout);
  check_backward_operands(op, gout, out, pooled_x, indices, x);
  KILN_CHECK(!dx.defined() || (dx.sizes() == x.sizes() && dx.is_contiguous()), op, ": dx must be contiguous like x");
  dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto bw = pooled_backward<T>(b, gout, out, pooled_x, indices, weight, mean, invstd);
    T* dxp = mptr<T>(dx);
    bw.sums(mptr<T>(dweight), mptr<T>(dbias), dxp != nullptr, training);
    if (!dxp) return;
    const T* xp = cptr<T>(x);
    const int64_t HW = b.H * b.W;
#pragma omp parallel for schedule(dynamic, 16) if (b.N * b.C * HW >= 32768)  // planes are independent
    for (int64_t plane = 0; plane < b.N * b.C; ++plane) bw.plane(plane, xp + plane * HW, dxp + plane * HW);
  });
}

void conv2d_batch_norm_relu_max_pool2x2_backward(const Tensor& dconv_x, const Tensor& dconv_w, const Tensor& dweight,
                                                 const Tensor& dbias, const Tensor& gout, const Tensor& out,
                                                 const Tensor& pooled_x, const Tensor& indices, const Tensor& y,
                                                 const Tensor& conv_x, const Tensor& conv_w, const ConvGeometry& g,
                                                 const Tensor& weight, const Tensor& mean, const Tensor& invstd,
                                                 bool training) {
  const char* op = "conv2d_batch_norm_relu_max_pool2d_backward";
  const Block b = block_of(op, y, gout);
  check_backward_operands(op, gout, out, pooled_x, indices, y);
  KILN_CHECK(y.dtype() == DType::F32 || y.dtype() == DType::F64, op, ": f32 or f64, got ", y.dtype());
  auto run = [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto bw = pooled_backward<T>(b, gout, out, pooled_x, indices, weight, mean, invstd);
    bw.sums(mptr<T>(dweight), mptr<T>(dbias), dconv_x.defined() || dconv_w.defined(), training);
    if (!dconv_x.defined() && !dconv_w.defined()) return;
    const T* yp = cptr<T>(y);
    const int64_t HW = b.H * b.W;
    // the conv's output gradient, one sample's planes at a time, straight into its GEMMs
    conv2d_backward_generated(dconv_x, dconv_w, conv_x, conv_w, g, [&](int64_t n, void* dy) {
      T* d = static_cast<T*>(dy);
      for (int64_t c = 0; c < b.C; ++c) bw.plane(n * b.C + c, yp + (n * b.C + c) * HW, d + c * HW);
    });
  };
  if (y.dtype() == DType::F64) run(TypeTag<double>{});
  else run(TypeTag<float>{});
}

}  // namespace kiln::kernels::cpu

namespace kiln::kernels {

bool supports_batch_norm_relu_max_pool2x2(const Tensor& x) {
  return x.defined() && x.device().is_cpu() && is_floating(x.dtype()) && x.dim() == 4 && x.is_contiguous() &&
         x.size(2) >= 2 && x.size(3) >= 2;
}

KILN_REGISTER_KERNEL(batch_norm_relu_max_pool2x2_forward, CPU, cpu::batch_norm_relu_max_pool2x2_forward);
KILN_REGISTER_KERNEL(batch_norm_relu_max_pool2x2_backward, CPU, cpu::batch_norm_relu_max_pool2x2_backward);
KILN_REGISTER_KERNEL(conv2d_batch_norm_relu_max_pool2x2_backward, CPU,
                     cpu::conv2d_batch_norm_relu_max_pool2x2_backward);

}  // namespace kiln::kernels
