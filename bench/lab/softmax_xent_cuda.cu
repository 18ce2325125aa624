// lab_softmax_xent_cuda: softmax + cross-entropy of logits x [R, C] with class targets, and the
// gradient dx, on the GPU, f32 (the math of bench/lab/softmax_xent_cpu.cpp):
//   forward:  lse = max x + log sum_j exp(x_j - max x),  loss_r = lse - x_t
//   backward: dx_j = (exp(x_j - lse) - [j == t]) g,  g = 1/R
// Standalone (CUDA runtime only). Each version computes the losses and dx, forward and backward
// timed together; GB/s counts the minimal traffic, one read of x and one write of dx (8 bytes per
// element), against the device-to-device copy bandwidth of this run.
//
//   1 naive     forward: a thread per row, three passes (max, sum, loss); backward: a thread per element
//   2 online    forward: a block per row, max and sum in one pass (online softmax); backward as 1
//   3 fused     the block of 2 writes its row of dx right after its lse: one launch, x read once
//               from memory (the second read hits L2)
//
// Validation against the f64 CPU reference of the CPU program (softmax_xent_ref.h): loss against
// 1 + |x_t - max| + log s, dx_j against g (p_j (1 + |x_j - max| + log s) + [j == t] + 1e-30),
// tol = C eps / 2 (the bound of a sum of positive terms; see the CPU program).
//
//   nvcc -std=c++17 -O3 -arch=sm_90 softmax_xent_cuda.cu -o lab_softmax_xent_cuda
//   lab_softmax_xent_cuda [VERSION|all] [--size R,C] [--repeats N] [--warmup N] [--budget S]
#include "lab_cuda.cuh"
#include "softmax_xent_ref.h"

namespace {

const char* kUsage =
    "  --size R,C   rows and classes (default 2048,50257: GPT-2's vocabulary)\n"
    "versions: 1 naive, 2 online, 3 fused\n";
constexpr int kRowThreads = 512;  // threads per row in versions 2 and 3

struct Args {
  const float* x;
  const int64_t* target;
  float g;  // the loss gradient of every row
  float *loss, *lse, *dx;
  int R, C;
};

// ------------------------------------------------------------------ 1: naive
// A thread per row reads its row three times (max, sum of exp, the target), each pass strided by C
// between neighbouring threads (uncoalesced), with only R threads to hide latency. The backward is
// a second launch that reads x again, a thread per element (coalesced, but a division per element
// to find the row).
__global__ void fwd_thread_per_row(Args a) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= a.R) return;
  const float* x = a.x + (int64_t)r * a.C;
  float m = -INFINITY, s = 0;
  for (int j = 0; j < a.C; ++j) m = fmaxf(m, x[j]);
  for (int j = 0; j < a.C; ++j) s += expf(x[j] - m);
  a.lse[r] = m + logf(s);
  a.loss[r] = logf(s) - (x[a.target[r]] - m);
}

__global__ void bwd_per_element(Args a) {
  const int64_t n = int64_t(a.R) * a.C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / a.C, j = i % a.C;
    a.dx[i] = (expf(a.x[i] - a.lse[r]) - (j == a.target[r] ? 1.0f : 0.0f)) * a.g;
  }
}

void launch_bwd_per_element(const Args& a) {
  bwd_per_element<<<static_cast<unsigned>(std::min<int64_t>(lab::blocks_for(int64_t(a.R) * a.C, 256), 65536)), 256>>>(
      a);
  LAUNCH_CHECK();
}

void v1(const Args& a) {
  fwd_thread_per_row<<<lab::blocks_for(a.R, 256), 256>>>(a);
  LAUNCH_CHECK();
  launch_bwd_per_element(a);
}

// ------------------------------------------------------------------ 2: online softmax
// A running pair (m, s) with s = sum exp(x_j - m) over the elements seen so far absorbs a new x:
// if x > m, s = s exp(m - x) + 1 and m = x, else s += exp(x - m). Two pairs merge the same way.
// So one pass finds both the max and the sum: each thread folds its strided elements (coalesced
// across the block), then the pairs merge across the warp by shuffles and across warps through
// shared memory.
struct MaxSum {
  float m, s;
};

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  if (a.m == -INFINITY) return b;  // also keeps exp(-inf - (-inf)) out
  if (b.m == -INFINITY) return a;
  const float m = fmaxf(a.m, b.m);
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

// The (m, s) of the whole block in every thread; `scratch`: 32 pairs of shared memory.
__device__ MaxSum block_maxsum(MaxSum v, MaxSum* scratch) {
  for (int o = 16; o > 0; o /= 2)
    v = merge(v, {__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)});
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < int(blockDim.x / 32) ? scratch[lane] : MaxSum{-INFINITY, 0.0f};
  for (int o = 16; o > 0; o /= 2)
    v = merge(v, {__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)});
  return v;
}

// This block's row: the (m, s) pair, loss and lse written; returns lse.
__device__ float row_forward(const Args& a, int r) {
  __shared__ MaxSum scratch[32];
  const float* x = a.x + (int64_t)r * a.C;
  MaxSum v{-INFINITY, 0.0f};
  for (int j = threadIdx.x; j < a.C; j += blockDim.x) {
    const float xj = x[j];
    if (xj > v.m) {
      v.s = v.s * expf(v.m - xj) + 1.0f;  // v.m = -inf at first: 0 * 0 + 1
      v.m = xj;
    } else {
      v.s += expf(xj - v.m);
    }
  }
  v = block_maxsum(v, scratch);
  const float log_s = logf(v.s);
  if (threadIdx.x == 0) {
    a.lse[r] = v.m + log_s;
    a.loss[r] = log_s - (x[a.target[r]] - v.m);
  }
  return v.m + log_s;
}

__global__ void fwd_online(Args a) { row_forward(a, blockIdx.x); }

void v2(const Args& a) {
  fwd_online<<<a.R, kRowThreads>>>(a);
  LAUNCH_CHECK();
  launch_bwd_per_element(a);
}

// ------------------------------------------------------------------ 3: fused forward + backward
// The block that has just computed a row's lse writes the row's dx: no second launch, no lse
// round trip through memory, and the row (200 KB for GPT-2) is read again while it is still in
// L2, so memory sees one read of x and one write of dx, the minimum.
__global__ void fused(Args a) {
  const int r = blockIdx.x;
  const float lse = row_forward(a, r);
  const float* x = a.x + (int64_t)r * a.C;
  float* dx = a.dx + (int64_t)r * a.C;
  const int64_t t = a.target[r];
  for (int j = threadIdx.x; j < a.C; j += blockDim.x) dx[j] = (expf(x[j] - lse) - (j == t ? 1.0f : 0.0f)) * a.g;
}

void v3(const Args& a) {
  fused<<<a.R, kRowThreads>>>(a);
  LAUNCH_CHECK();
}

// ------------------------------------------------------------------ driver

struct Version {
  const char* name;
  void (*run)(const Args&);
};
const Version kVersions[] = {
    {"naive: 3 passes, 2 launches", v1},    // 1
    {"online softmax, block per row", v2},  // 2
    {"fused forward + backward", v3},       // 3
};

}  // namespace

int main(int argc, char** argv) {
  const lab::Options opt = lab::parse_args(argc, argv, kVersions, {2048, 50257}, {2}, kUsage);
  const int64_t R = opt.size[0], C = opt.size[1];
  lab::require_device("lab_softmax_xent_cuda");
  std::printf("lab_softmax_xent_cuda: cross-entropy of x[%lld, %lld], f32, forward + backward\n", (long long)R,
              (long long)C);
  std::vector<float> x(R * C), dx(R * C), loss(R);
  std::vector<int64_t> target(R);
  lab::softmax_xent::fill_inputs(x.data(), target.data(), R, C);
  const float g = 1.0f / R;
  const lab::softmax_xent::Reference ref(x.data(), target.data(), g, R, C);

  lab::DeviceBuffer<float> d_x(R * C), d_dx(R * C), d_loss(R), d_lse(R);
  lab::DeviceBuffer<int64_t> d_target(R);
  d_x.upload(x.data());
  d_target.upload(target.data());
  const Args args{d_x.data(), d_target.data(), g, d_loss.data(), d_lse.data(), d_dx.data(), int(R), int(C)};

  const std::vector<lab::Peak> peaks{{"D2D copy", lab::device_copy_gbs()}};
  lab::Report report("GB/s");
  report.header(peaks);
  for (int vi : opt.versions) {
    const Version& v = kVersions[vi - 1];
    d_dx.poison(), d_loss.poison(), d_lse.poison();
    v.run(args);
    CUDA_CHECK(cudaDeviceSynchronize());
    d_dx.download(dx.data());
    d_loss.download(loss.data());
    report.row(
        vi, v.name, 0, ref.check(loss.data(), dx.data()), [&] { return lab::time_gpu([&] { v.run(args); }, opt); },
        lab::softmax_xent::bytes(R, C), peaks[0]);
  }
  std::printf(
      "GB/s: minimal traffic (read x, write dx: 8 bytes per element) / median time; %%peak: of the "
      "device-to-device copy; max err: worst |out - ref| / scale, tol = C eps / 2\n");
  return report.exit_code();
}
