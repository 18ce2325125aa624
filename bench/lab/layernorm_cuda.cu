// lab_layernorm_cuda: layer norm over the last dimension of x [R, C] on the GPU, forward and
// backward, f32 (the math of bench/lab/layernorm_cpu.cpp):
//   forward:  y = (x - mean) rstd w + b, saving mean and rstd per row
//   backward: dx = rstd (g w - mean_j(g w) - xhat mean_j(g w xhat)),  dw = sum_r g xhat,  db = sum_r g
// Standalone (CUDA runtime only). GB/s counts the minimal traffic (forward 8, backward 12 bytes
// per element, plus the statistics) against the device-to-device copy bandwidth of this run.
//
//   1 thread/row     one thread per row; dw, db by one thread per column
//   2 warp/row       a warp per row, reductions by warp shuffles
//   3 warp + float4  16-byte loads; the backward fuses dw, db into per-block partial sums
//   4 block/row      a block per row, the row cached in shared memory: for long rows, few rows
//
// Validation against the f64 CPU reference of the CPU program (layernorm_ref.h), with its scales
// and tolerances (4 eps (sqrt(C) + 4) for the per-row results, with R for C for dw, db).
//
//   nvcc -std=c++17 -O3 -arch=sm_90 layernorm_cuda.cu -o lab_layernorm_cuda
//   lab_layernorm_cuda [VERSION|all] [--size R,C] [--repeats N] [--warmup N] [--budget S]
#include "lab_cuda.cuh"
#include "layernorm_ref.h"

namespace {

const char* kUsage =
    "  --size R,C   rows and row length (default 32768,768; try 1024,16384 for long rows)\n"
    "versions: 1 thread/row, 2 warp/row, 3 warp + float4, 4 block/row\n";
using lab::layernorm::kEps;
constexpr int kThreads = 256;  // threads per block, every kernel

struct Args {  // device pointers and sizes shared by every kernel of a version
  const float *x, *w, *b, *g;
  float *y, *mean, *rstd, *dx, *dw, *db, *partial;  // partial: [blocks, 2, C] for versions 3, 4
  int R, C, partial_blocks;
};

// ------------------------------------------------------------------ 1: one thread per row
// The CPU loop moved to the GPU: thread r does row r. Neighbouring threads read addresses C floats
// apart, so every warp-wide load touches 32 different cache lines (uncoalesced), and the GPU has
// only R threads to hide memory latency with.
__global__ void fwd_thread_per_row(Args a) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= a.R) return;
  const float* x = a.x + (int64_t)r * a.C;
  float* y = a.y + (int64_t)r * a.C;
  float s = 0, v = 0;
  for (int j = 0; j < a.C; ++j) s += x[j];
  const float m = s / a.C;
  for (int j = 0; j < a.C; ++j) v += (x[j] - m) * (x[j] - m);
  const float rs = rsqrtf(v / a.C + kEps);
  for (int j = 0; j < a.C; ++j) y[j] = (x[j] - m) * rs * a.w[j] + a.b[j];
  a.mean[r] = m;
  a.rstd[r] = rs;
}

__global__ void bwd_dx_thread_per_row(Args a) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= a.R) return;
  const float *x = a.x + (int64_t)r * a.C, *g = a.g + (int64_t)r * a.C;
  const float m = a.mean[r], rs = a.rstd[r];
  float sa = 0, sb = 0;
  for (int j = 0; j < a.C; ++j) sa += g[j] * a.w[j], sb += g[j] * a.w[j] * (x[j] - m) * rs;
  sa /= a.C, sb /= a.C;
  for (int j = 0; j < a.C; ++j) a.dx[(int64_t)r * a.C + j] = rs * (g[j] * a.w[j] - sa - (x[j] - m) * rs * sb);
}

// dw_j, db_j: thread j walks column j down all rows. Loads are coalesced (neighbouring threads,
// neighbouring columns), but only C threads run, each with an R-long loop.
__global__ void bwd_dwdb_thread_per_column(Args a) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= a.C) return;
  float dw = 0, db = 0;
  for (int r = 0; r < a.R; ++r) {
    const float g = a.g[(int64_t)r * a.C + j];
    dw += g * (a.x[(int64_t)r * a.C + j] - a.mean[r]) * a.rstd[r];
    db += g;
  }
  a.dw[j] = dw;
  a.db[j] = db;
}

void v1_forward(const Args& a) {
  fwd_thread_per_row<<<lab::blocks_for(a.R, kThreads), kThreads>>>(a);
  LAUNCH_CHECK();
}
void v1_backward(const Args& a) {
  bwd_dx_thread_per_row<<<lab::blocks_for(a.R, kThreads), kThreads>>>(a);
  LAUNCH_CHECK();
  bwd_dwdb_thread_per_column<<<lab::blocks_for(a.C, kThreads), kThreads>>>(a);
  LAUNCH_CHECK();
}

// ------------------------------------------------------------------ 2: a warp per row
// 32 lanes share a row: lane l reads elements l, l + 32, ..., so each warp load is one 128-byte
// line (coalesced), there are 32x more threads in flight, and the row sums are combined by five
// register shuffles (warp_sum) instead of shared memory.
__global__ void fwd_warp_per_row(Args a) {
  const int r = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (r >= a.R) return;  // the whole warp leaves together, so the shuffles stay full-warp
  const float* x = a.x + (int64_t)r * a.C;
  float* y = a.y + (int64_t)r * a.C;
  float s = 0, v = 0;
  for (int j = lane; j < a.C; j += 32) s += x[j];
  const float m = warp_sum(s) / a.C;
  for (int j = lane; j < a.C; j += 32) v += (x[j] - m) * (x[j] - m);
  const float rs = rsqrtf(warp_sum(v) / a.C + kEps);
  for (int j = lane; j < a.C; j += 32) y[j] = (x[j] - m) * rs * a.w[j] + a.b[j];
  if (lane == 0) a.mean[r] = m, a.rstd[r] = rs;
}

__global__ void bwd_dx_warp_per_row(Args a) {
  const int r = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (r >= a.R) return;
  const float *x = a.x + (int64_t)r * a.C, *g = a.g + (int64_t)r * a.C;
  const float m = a.mean[r], rs = a.rstd[r];
  float sa = 0, sb = 0;
  for (int j = lane; j < a.C; j += 32) sa += g[j] * a.w[j], sb += g[j] * a.w[j] * (x[j] - m) * rs;
  sa = warp_sum(sa) / a.C, sb = warp_sum(sb) / a.C;
  for (int j = lane; j < a.C; j += 32) a.dx[(int64_t)r * a.C + j] = rs * (g[j] * a.w[j] - sa - (x[j] - m) * rs * sb);
}

void v2_forward(const Args& a) {
  fwd_warp_per_row<<<lab::blocks_for(int64_t(a.R) * 32, kThreads), kThreads>>>(a);
  LAUNCH_CHECK();
}
void v2_backward(const Args& a) {
  bwd_dx_warp_per_row<<<lab::blocks_for(int64_t(a.R) * 32, kThreads), kThreads>>>(a);
  LAUNCH_CHECK();
  bwd_dwdb_thread_per_column<<<lab::blocks_for(a.C, kThreads), kThreads>>>(a);
  LAUNCH_CHECK();
}

// ------------------------------------------------------------------ 3: warp per row, float4
// One 16-byte load moves 4 floats, so a warp moves 512 bytes per instruction: fewer instructions
// and more bytes in flight per thread. (Rows must start on 16 bytes: C % 4 == 0.) The backward
// also computes dw, db while x and g are loaded for dx: each block walks many rows, adds its
// terms into a shared-memory copy of dw, db (shared atomics), and writes them as one partial
// row; a second kernel sums the partials per column. No pass over all of x and g just for dw, db.
__global__ void fwd_warp_float4(Args a) {
  const int r = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32, C4 = a.C / 4;
  if (r >= a.R) return;
  const float4* x = reinterpret_cast<const float4*>(a.x + (int64_t)r * a.C);
  const float4 *w = reinterpret_cast<const float4*>(a.w), *b = reinterpret_cast<const float4*>(a.b);
  float4* y = reinterpret_cast<float4*>(a.y + (int64_t)r * a.C);
  float s = 0, v = 0;
  for (int j = lane; j < C4; j += 32) s += x[j].x + x[j].y + x[j].z + x[j].w;
  const float m = warp_sum(s) / a.C;
  for (int j = lane; j < C4; j += 32) {
    const float4 d = make_float4(x[j].x - m, x[j].y - m, x[j].z - m, x[j].w - m);
    v += d.x * d.x + d.y * d.y + d.z * d.z + d.w * d.w;
  }
  const float rs = rsqrtf(warp_sum(v) / a.C + kEps);
  for (int j = lane; j < C4; j += 32) {
    const float4 xv = x[j], wv = w[j], bv = b[j];
    y[j] = make_float4((xv.x - m) * rs * wv.x + bv.x, (xv.y - m) * rs * wv.y + bv.y, (xv.z - m) * rs * wv.z + bv.z,
                       (xv.w - m) * rs * wv.w + bv.w);
  }
  if (lane == 0) a.mean[r] = m, a.rstd[r] = rs;
}

__global__ void bwd_warp_float4(Args a) {
  extern __shared__ float acc[];  // [2, C]: this block's dw, db
  const int lane = threadIdx.x % 32, C4 = a.C / 4, warps = blockDim.x / 32;
  for (int j = threadIdx.x; j < 2 * a.C; j += blockDim.x) acc[j] = 0;
  __syncthreads();
  const float4* w = reinterpret_cast<const float4*>(a.w);
  for (int r = blockIdx.x * warps + threadIdx.x / 32; r < a.R; r += gridDim.x * warps) {
    const float4 *x = reinterpret_cast<const float4*>(a.x + (int64_t)r * a.C),
                 *g = reinterpret_cast<const float4*>(a.g + (int64_t)r * a.C);
    float4* dx = reinterpret_cast<float4*>(a.dx + (int64_t)r * a.C);
    const float m = a.mean[r], rs = a.rstd[r];
    float sa = 0, sb = 0;
    for (int j = lane; j < C4; j += 32) {
      const float4 gv = g[j], wv = w[j], xv = x[j];
      sa += gv.x * wv.x + gv.y * wv.y + gv.z * wv.z + gv.w * wv.w;
      sb += gv.x * wv.x * (xv.x - m) * rs + gv.y * wv.y * (xv.y - m) * rs + gv.z * wv.z * (xv.z - m) * rs +
            gv.w * wv.w * (xv.w - m) * rs;
    }
    sa = warp_sum(sa) / a.C, sb = warp_sum(sb) / a.C;
    for (int j = lane; j < C4; j += 32) {
      const float4 gv = g[j], wv = w[j], xv = x[j];
      const float h[4] = {(xv.x - m) * rs, (xv.y - m) * rs, (xv.z - m) * rs, (xv.w - m) * rs};
      const float gg[4] = {gv.x, gv.y, gv.z, gv.w}, ww[4] = {wv.x, wv.y, wv.z, wv.w};
      float d[4];
      for (int k = 0; k < 4; ++k) {
        d[k] = rs * (gg[k] * ww[k] - sa - h[k] * sb);
        atomicAdd(&acc[4 * j + k], gg[k] * h[k]);
        atomicAdd(&acc[a.C + 4 * j + k], gg[k]);
      }
      dx[j] = make_float4(d[0], d[1], d[2], d[3]);
    }
  }
  __syncthreads();
  for (int j = threadIdx.x; j < 2 * a.C; j += blockDim.x) a.partial[(int64_t)blockIdx.x * 2 * a.C + j] = acc[j];
}

// dw_j, db_j = the sums of the blocks' partials, in block order (thread per column).
__global__ void sum_partials(Args a) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= a.C) return;
  float dw = 0, db = 0;
  for (int k = 0; k < a.partial_blocks; ++k) {
    dw += a.partial[(int64_t)k * 2 * a.C + j];
    db += a.partial[(int64_t)k * 2 * a.C + a.C + j];
  }
  a.dw[j] = dw;
  a.db[j] = db;
}

void v3_forward(const Args& a) {
  fwd_warp_float4<<<lab::blocks_for(int64_t(a.R) * 32, kThreads), kThreads>>>(a);
  LAUNCH_CHECK();
}
void v3_backward(const Args& a) {
  bwd_warp_float4<<<a.partial_blocks, kThreads, 2 * a.C * sizeof(float)>>>(a);
  LAUNCH_CHECK();
  sum_partials<<<lab::blocks_for(a.C, kThreads), kThreads>>>(a);
  LAUNCH_CHECK();
}

// ------------------------------------------------------------------ 4: a block per row
// For long rows a warp per row leaves each lane hundreds of elements in sequence, and when there
// are few rows too little of the GPU is busy. Here a whole block shares a row: it is read from
// memory once into shared memory (each thread reads back the elements it loaded: shared memory
// as a cache bigger than the registers), the mean, variance and output passes read it from there,
// and the sums combine warp shuffles with one shared-memory step (block_sum). The backward keeps
// x and g of the row the same way, and dw, db in shared memory too: thread t owns columns t,
// t + blockDim, ... of them, so they need no atomics; the partials are summed as in 3.
__global__ void fwd_block_per_row(Args a) {
  extern __shared__ float row[];  // [C] + 32 floats of scratch
  float* scratch = row + a.C;
  const int r = blockIdx.x;
  const float* x = a.x + (int64_t)r * a.C;
  float s = 0, v = 0;
  for (int j = threadIdx.x; j < a.C; j += blockDim.x) s += (row[j] = x[j]);
  const float m = block_sum(s, scratch) / a.C;
  for (int j = threadIdx.x; j < a.C; j += blockDim.x) v += (row[j] - m) * (row[j] - m);
  const float rs = rsqrtf(block_sum(v, scratch) / a.C + kEps);
  for (int j = threadIdx.x; j < a.C; j += blockDim.x) a.y[(int64_t)r * a.C + j] = (row[j] - m) * rs * a.w[j] + a.b[j];
  if (threadIdx.x == 0) a.mean[r] = m, a.rstd[r] = rs;
}

__global__ void bwd_block_per_row(Args a) {
  extern __shared__ float sm[];  // x row [C], g row [C], dw [C], db [C], scratch [32]
  float *xs = sm, *gs = sm + a.C, *dw = sm + 2 * a.C, *db = sm + 3 * a.C, *scratch = sm + 4 * a.C;
  for (int j = threadIdx.x; j < a.C; j += blockDim.x) dw[j] = 0, db[j] = 0;
  for (int r = blockIdx.x; r < a.R; r += gridDim.x) {
    const float m = a.mean[r], rs = a.rstd[r];
    float sa = 0, sb = 0;
    for (int j = threadIdx.x; j < a.C; j += blockDim.x) {
      const float xv = xs[j] = a.x[(int64_t)r * a.C + j], gv = gs[j] = a.g[(int64_t)r * a.C + j];
      sa += gv * a.w[j], sb += gv * a.w[j] * (xv - m) * rs;
    }
    sa = block_sum(sa, scratch) / a.C, sb = block_sum(sb, scratch) / a.C;
    for (int j = threadIdx.x; j < a.C; j += blockDim.x) {  // thread t reads back its own xs, gs
      const float h = (xs[j] - m) * rs;
      a.dx[(int64_t)r * a.C + j] = rs * (gs[j] * a.w[j] - sa - h * sb);
      dw[j] += gs[j] * h;
      db[j] += gs[j];
    }
  }
  for (int j = threadIdx.x; j < a.C; j += blockDim.x) {
    a.partial[(int64_t)blockIdx.x * 2 * a.C + j] = dw[j];
    a.partial[(int64_t)blockIdx.x * 2 * a.C + a.C + j] = db[j];
  }
}

void v4_forward(const Args& a) {
  fwd_block_per_row<<<a.R, kThreads, (a.C + 32) * sizeof(float)>>>(a);
  LAUNCH_CHECK();
}
void v4_backward(const Args& a) {
  bwd_block_per_row<<<a.partial_blocks, kThreads, (4 * a.C + 32) * sizeof(float)>>>(a);
  LAUNCH_CHECK();
  sum_partials<<<lab::blocks_for(a.C, kThreads), kThreads>>>(a);
  LAUNCH_CHECK();
}

// ------------------------------------------------------------------ reference and driver

// The f32 statistics the backward of every version gets (the CPU's two-pass formulas).
void host_statistics(const float* x, float* mean, float* rstd, int64_t R, int64_t C) {
  for (int64_t r = 0; r < R; ++r) {
    double s = 0, v = 0;
    for (int64_t j = 0; j < C; ++j) s += x[r * C + j];
    const double m = s / C;
    for (int64_t j = 0; j < C; ++j) v += (x[r * C + j] - m) * (x[r * C + j] - m);
    mean[r] = float(m), rstd[r] = float(1.0 / std::sqrt(v / C + kEps));
  }
}

struct Version {
  const char* name;
  void (*fwd)(const Args&);
  void (*bwd)(const Args&);
};
const Version kVersions[] = {
    {"thread per row", v1_forward, v1_backward},                // 1
    {"warp per row", v2_forward, v2_backward},                  // 2
    {"warp per row, float4", v3_forward, v3_backward},          // 3
    {"block per row, shared memory", v4_forward, v4_backward},  // 4
};

// A device output of a pass and its host copy.
struct Output {
  lab::DeviceBuffer<float>* device;
  float* host;
};

// The validating call of a pass (a version's forward or backward): its outputs poisoned first, so
// an element the kernels do not write fails the check, then the pass, then the outputs copied back.
void validating_call(void (*pass)(const Args&), const Args& args, std::initializer_list<Output> outputs) {
  for (const Output& o : outputs) o.device->poison();
  pass(args);
  CUDA_CHECK(cudaDeviceSynchronize());
  for (const Output& o : outputs) o.device->download(o.host);
}

// Why version v cannot run at this size on this device ("" when it can).
std::string unavailable(int v, int64_t C, const cudaDeviceProp& prop) {
  if (v == 3 && C % 4 != 0) return "needs C % 4 == 0 (16-byte aligned rows)";
  if (v == 3 && 2 * C * sizeof(float) > prop.sharedMemPerBlockOptin) return "dw, db do not fit in shared memory";
  if (v == 4 && (4 * C + 32) * sizeof(float) > prop.sharedMemPerBlockOptin)
    return "the row does not fit in shared memory";
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  const lab::Options opt = lab::parse_args(argc, argv, kVersions, {32768, 768}, {2}, kUsage);
  const int64_t R = opt.size[0], C = opt.size[1];
  const cudaDeviceProp prop = lab::require_device("lab_layernorm_cuda");
  std::printf("lab_layernorm_cuda: layer norm of x[%lld, %lld], f32, forward and backward\n", (long long)R,
              (long long)C);
  // every kernel with a dynamic shared-memory size may use what the device allows
  for (const void* k : {(const void*)bwd_warp_float4, (const void*)fwd_block_per_row, (const void*)bwd_block_per_row})
    CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(prop.sharedMemPerBlockOptin)));

  std::vector<float> x(R * C), g(R * C), w(C), b(C), smean(R), srstd(R);
  lab::layernorm::fill_inputs(x.data(), g.data(), w.data(), b.data(), R, C);
  host_statistics(x.data(), smean.data(), srstd.data(), R, C);
  const lab::layernorm::Reference ref(x.data(), g.data(), w.data(), b.data(), smean.data(), srstd.data(), R, C);

  const int partial_blocks = prop.multiProcessorCount * 2;
  lab::DeviceBuffer<float> d_x(R * C), d_g(R * C), d_w(C), d_b(C), d_y(R * C), d_dx(R * C), d_mean(R), d_rstd(R),
      d_smean(R), d_srstd(R), d_dw(C), d_db(C), d_partial(size_t(partial_blocks) * 2 * C);
  d_x.upload(x.data()), d_g.upload(g.data()), d_w.upload(w.data()), d_b.upload(b.data());
  d_smean.upload(smean.data()), d_srstd.upload(srstd.data());
  const Args fwd{d_x.data(),  d_w.data(),  d_b.data(),  d_g.data(),       d_y.data(), d_mean.data(), d_rstd.data(),
                 d_dx.data(), d_dw.data(), d_db.data(), d_partial.data(), int(R),     int(C),        partial_blocks};
  Args bwd = fwd;  // the backward reads the shared f32 statistics
  bwd.mean = d_smean.data(), bwd.rstd = d_srstd.data();
  std::vector<float> out(R * C), mean(R), rstd(R), dw(C), db(C);  // host copies of the outputs (out: y or dx)

  const std::vector<lab::Peak> peaks{{"D2D copy", lab::device_copy_gbs()}};
  lab::Report report("GB/s");
  report.header(peaks);
  for (int vi : opt.versions) {
    const Version& v = kVersions[vi - 1];
    if (const std::string why = unavailable(vi, C, prop); !why.empty()) {
      report.skipped(vi, v.name, why);
      continue;
    }
    validating_call(v.fwd, fwd, {{&d_y, out.data()}, {&d_mean, mean.data()}, {&d_rstd, rstd.data()}});
    report.row(
        vi, std::string(v.name) + ": forward", 0, ref.check_forward(out.data(), mean.data(), rstd.data()),
        [&] { return lab::time_gpu([&] { v.fwd(fwd); }, opt); }, lab::layernorm::forward_bytes(R, C), peaks[0]);
    validating_call(v.bwd, bwd, {{&d_dx, out.data()}, {&d_dw, dw.data()}, {&d_db, db.data()}});
    report.row(
        vi, std::string(v.name) + ": backward", 0, ref.check_backward(out.data(), dw.data(), db.data()),
        [&] { return lab::time_gpu([&] { v.bwd(bwd); }, opt); }, lab::layernorm::backward_bytes(R, C), peaks[0]);
  }
  std::printf(
      "GB/s: minimal traffic / median time; %%peak: of the device-to-device copy; "
      "max err: worst |out - ref| / scale, tol = 4 eps (sqrt(C) + 4) (R for dw, db)\n");
  return report.exit_code();
}
