// CPU conv2d: the NCHW im2col + GEMM path against the channels-last (NHWC) path whose patch
// matrix is copied straight from NHWC rows, on the two convolutions of the Fashion-MNIST CNN at
// batch 128 (conv3x3 1->32 on 28x28 and conv3x3 32->64 on 14x14, padding 1, no bias), forward
// and forward+backward, plus the pooling that follows each. Peer: one plain Eigen GEMM with the
// same FLOPs as the convolution (the im2col GEMM alone, without gathering patches), measured in
// the same run. Every path is validated against a direct convolution in double on a few samples
// and the two paths' gradients against each other before any time is printed.
#include <Eigen/Core>
#include <omp.h>

#include <algorithm>
#include <functional>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <kiln/kiln.h>
#include <kiln/nn/functional.h>

#include "../bench_util.h"

namespace F = kiln::nn::functional;
using kiln::Tensor;

namespace {

// Best of `reps` runs: this bench shares a 2-core machine with compilers, and the minimum is the
// least disturbed estimate of what the kernel costs.
double time_best(const std::function<void()>& fn, int reps = 9) {
  fn();
  double best = 1e30;
  for (int i = 0; i < reps; ++i) best = std::min(best, kiln::bench::time_median(fn, 1, 0));
  return best;
}

struct Shape {
  const char* name;
  int64_t N, C, H, W, K;
  bool input_grad;  // the first layer's input (the images) needs no gradient
};

Tensor channels_last(const Tensor& x) { return x.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2}); }

// Direct 3x3 / pad 1 / stride 1 convolution of sample n in double; max abs error vs y.
double check_sample(const Tensor& x_in, const Tensor& w_in, const Tensor& y_in, int64_t n) {
  kiln::NoGradGuard ng;
  Tensor x = x_in.contiguous(), w = w_in.contiguous(), y = y_in.contiguous();
  const int64_t C = x.size(1), H = x.size(2), W = x.size(3), K = w.size(0);
  const float* xp = x.data_ptr<float>() + n * C * H * W;
  const float* wp = w.data_ptr<float>();
  const float* yp = y.data_ptr<float>() + n * K * H * W;
  double err = 0;
  for (int64_t k = 0; k < K; ++k)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t ww = 0; ww < W; ++ww) {
        double s = 0;
        for (int64_t c = 0; c < C; ++c)
          for (int64_t i = 0; i < 3; ++i)
            for (int64_t j = 0; j < 3; ++j) {
              int64_t ih = h - 1 + i, iw = ww - 1 + j;
              if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
              s += double(xp[(c * H + ih) * W + iw]) * wp[((k * C + c) * 3 + i) * 3 + j];
            }
        err = std::max(err, std::abs(s - yp[(k * H + h) * W + ww]));
      }
  return err;
}

double max_diff(const Tensor& a, const Tensor& b) {
  kiln::NoGradGuard ng;
  return (a.contiguous() - b.contiguous()).abs().max().item();
}

}  // namespace

int main() {
  kiln::manual_seed(0);
  const Shape shapes[] = {{"conv1 1->32 28x28", 128, 1, 28, 28, 32, false},
                          {"conv2 32->64 14x14", 128, 32, 14, 14, 64, true}};
  F::Conv2dParams p;
  p.padding = {1, 1};
  std::printf("CPU conv2d, batch 128, 3x3, padding 1, f32, %d threads, best of 9 runs\n", omp_get_max_threads());
  std::printf("%-20s %-14s %10s %10s %12s %10s\n", "shape", "path", "fwd ms", "GFLOP/s", "fwd+bwd ms", "GFLOP/s");
  for (const Shape& s : shapes) {
    Tensor x = kiln::randn({s.N, s.C, s.H, s.W});
    Tensor w = kiln::randn({s.K, s.C, 3, 3}) * (1.0 / std::sqrt(9.0 * s.C));
    Tensor gy = kiln::randn({s.N, s.K, s.H, s.W});
    const double fwd_flops = 2.0 * s.N * s.K * s.H * s.W * s.C * 9;
    const double bwd_flops = fwd_flops * (s.input_grad ? 3 : 2);

    Tensor xs[2] = {x, channels_last(x)};
    Tensor gys[2] = {gy, channels_last(gy)};
    Tensor dx[2], dw[2];
    double t_fwd[2], t_all[2];
    const char* names[2] = {"NCHW im2col", "NHWC im2row"};
    for (int path = 0; path < 2; ++path) {
      Tensor xi = xs[path];
      Tensor y;
      {
        kiln::NoGradGuard ng;
        t_fwd[path] = time_best([&] { y = F::conv2d(xi, w, Tensor(), p); }, 9);
      }
      double err = 0;
      for (int64_t n : {int64_t(0), s.N / 2, s.N - 1}) err = std::max(err, check_sample(xi, w, y, n));
      kiln::bench::validate(err < 1e-3, (std::string(names[path]) + " forward vs direct").c_str(), err);
      Tensor xr = xi.detach().requires_grad_(s.input_grad);
      Tensor wr = w.detach().requires_grad_();
      Tensor gyi = gys[path];
      t_all[path] = time_best(
          [&] {
            xr.set_grad(Tensor());
            wr.set_grad(Tensor());
            F::conv2d(xr, wr, Tensor(), p).backward(gyi);
          },
          9);
      dw[path] = wr.grad();
      if (s.input_grad) dx[path] = xr.grad();
      std::printf("%-20s %-14s %10.3f %10.1f %12.3f %10.1f\n", s.name, names[path], t_fwd[path] * 1e3,
                  fwd_flops / t_fwd[path] / 1e9, t_all[path] * 1e3, (fwd_flops + bwd_flops) / t_all[path] / 1e9);
    }
    double e = max_diff(dw[0], dw[1]);
    kiln::bench::validate(e < 1e-3 * std::sqrt(double(s.N * s.H * s.W)), "dw NCHW vs NHWC", e);
    if (s.input_grad) {
      e = max_diff(dx[0], dx[1]);
      kiln::bench::validate(e < 1e-3, "dx NCHW vs NHWC", e);
    }
    // Peer: the forward GEMM alone, [K, C*9] @ [C*9, N*H*W], as one plain Eigen product.
    using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    Mat A = Mat::Random(s.K, s.C * 9), B = Mat::Random(s.C * 9, s.N * s.H * s.W), Cm(s.K, s.N * s.H * s.W);
    double t_gemm = time_best([&] { Cm.noalias() = A * B; }, 9);
    std::printf("%-20s %-14s %10.3f %10.1f\n", s.name, "Eigen GEMM peer", t_gemm * 1e3, fwd_flops / t_gemm / 1e9);
    std::printf("%-20s NHWC/NCHW time: fwd %.2f, fwd+bwd %.2f; NCHW fwd = %.0f%% of peer GEMM speed\n", s.name,
                t_fwd[1] / t_fwd[0], t_all[1] / t_all[0], 100 * t_gemm / t_fwd[0]);
  }

  // The pooling after each conv (2x2 max), forward and forward+backward, both layouts.
  std::printf("\n%-20s %-14s %10s %12s\n", "max_pool2d 2x2", "layout", "fwd ms", "fwd+bwd ms");
  for (auto sz : {std::vector<int64_t>{128, 32, 28, 28}, std::vector<int64_t>{128, 64, 14, 14}}) {
    Tensor x = kiln::randn(sz);
    for (int cl = 0; cl < 2; ++cl) {
      Tensor xi = cl ? channels_last(x) : x;
      double tf;
      {
        kiln::NoGradGuard ng;
        tf = time_best([&] { F::max_pool2d(xi, 2); }, 9);
      }
      Tensor xr = xi.detach().requires_grad_();
      Tensor g = kiln::ones({sz[0], sz[1], sz[2] / 2, sz[3] / 2});
      double tb = time_best(
          [&] {
            xr.set_grad(Tensor());
            F::max_pool2d(xr, 2).backward(g);
          },
          9);
      char name[64];
      std::snprintf(name, sizeof name, "[%lld,%lld,%lld,%lld]", (long long)sz[0], (long long)sz[1], (long long)sz[2],
                    (long long)sz[3]);
      std::printf("%-20s %-14s %10.3f %12.3f\n", name, cl ? "channels-last" : "NCHW", tf * 1e3, tb * 1e3);
    }
  }
  std::printf("GFLOP/s count 2*N*K*OH*OW*C*9 per pass; fwd+bwd counts dx only where the input needs it\n");
  return 0;
}
