// lab_adamw_cuda: one AdamW step over a model's parameter list on the GPU, f32 (the rule and the
// GPT-2-like list of bench/lab/adamw_cpu.cpp):
//   p *= 1 - lr wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// Standalone (CUDA runtime only). GB/s counts the minimal traffic, 28 bytes per parameter (read p,
// g, m, v; write p, m, v), against the device-to-device copy bandwidth of this run.
//
//   1 unfused       a kernel per tensor operation, per tensor, one thread per element
//   2 fused         one kernel per tensor doing the whole update
//   3 multi-tensor  one launch for up to 80 tensors (their pointers in the kernel's arguments),
//                   16-byte float4 loads and stores
//
// Validation: three steps from p0 with m = v = 0 against the same steps in f64 (adamw_ref.h, shared
// with the CPU program); p against |p| + lr (tol 32 eps), m and v against themselves (tol 16 eps).
//
//   nvcc -std=c++17 -O3 -arch=sm_90 adamw_cuda.cu -o lab_adamw_cuda
//   lab_adamw_cuda [VERSION|all] [--size N] [--repeats N] [--warmup N] [--budget S]
#include "lab_cuda.cuh"
#include "adamw_ref.h"

namespace {

const char* kUsage =
    "  --size N   parameters in all (default 85000000: twelve GPT-2 blocks)\n"
    "versions: 1 unfused, 2 fused, 3 multi-tensor\n";
constexpr int kThreads = 256;
using lab::adamw::Hyper;  // the step's scalars, computed on the host and passed to the kernels
using lab::adamw::Param;

struct Buffers {  // device pointers of the flat arrays
  float *p, *g, *m, *v, *tmp;
};

// ------------------------------------------------------------------ 1: unfused
// What a loop of tensor ops launches: five kernels per tensor, each a full pass over its
// operands (about 14 arrays' traffic instead of 7, and a temporary), and five launches per tensor:
// for the many small tensors of a model (biases, norms) the launch cost, a few microseconds, is
// all the time there is.
__global__ void k_scale(float* p, float s, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] *= s;
}
__global__ void k_first_moment(float* m, const float* g, Hyper h, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    m[i] = h.b1 * m[i] + h.one_minus_b1 * g[i];
}
__global__ void k_second_moment(float* v, const float* g, Hyper h, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    v[i] = h.b2 * v[i] + h.one_minus_b2 * g[i] * g[i];
}
__global__ void k_denominator(float* d, const float* v, Hyper h, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    d[i] = sqrtf(v[i]) * h.inv_bc2_sqrt + h.eps;
}
__global__ void k_apply(float* p, const float* m, const float* d, Hyper h, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] -= h.step_size * (m[i] / d[i]);
}

unsigned grid_for(int64_t n) { return static_cast<unsigned>(std::min<int64_t>(lab::blocks_for(n, kThreads), 4096)); }

void v1(const std::vector<Param>& list, const Buffers& B, int t) {
  const Hyper h(t);
  for (const Param& X : list) {
    float *p = B.p + X.offset, *m = B.m + X.offset, *v = B.v + X.offset, *d = B.tmp + X.offset;
    const float* g = B.g + X.offset;
    const unsigned grid = grid_for(X.numel);
    k_scale<<<grid, kThreads>>>(p, h.decay, X.numel);
    LAUNCH_CHECK();
    k_first_moment<<<grid, kThreads>>>(m, g, h, X.numel);
    LAUNCH_CHECK();
    k_second_moment<<<grid, kThreads>>>(v, g, h, X.numel);
    LAUNCH_CHECK();
    k_denominator<<<grid, kThreads>>>(d, v, h, X.numel);
    LAUNCH_CHECK();
    k_apply<<<grid, kThreads>>>(p, m, d, h, X.numel);
    LAUNCH_CHECK();
  }
}

// ------------------------------------------------------------------ 2: fused
// The element's whole update while p, g, m, v are in registers: one pass, 7 arrays' traffic, one
// launch per tensor.
__device__ __forceinline__ void adamw_element(const Hyper& h, float& p, float g, float& m, float& v) {
  m = h.b1 * m + h.one_minus_b1 * g;
  v = h.b2 * v + h.one_minus_b2 * g * g;
  p = p * h.decay - h.step_size * (m / (sqrtf(v) * h.inv_bc2_sqrt + h.eps));
}

__global__ void k_fused(float* p, const float* g, float* m, float* v, Hyper h, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    adamw_element(h, p[i], g[i], m[i], v[i]);
}

void v2(const std::vector<Param>& list, const Buffers& B, int t) {
  const Hyper h(t);
  for (const Param& X : list) {
    k_fused<<<grid_for(X.numel), kThreads>>>(B.p + X.offset, B.g + X.offset, B.m + X.offset, B.v + X.offset, h,
                                             X.numel);
    LAUNCH_CHECK();
  }
}

// ------------------------------------------------------------------ 3: multi-tensor
// One launch covers many tensors: their pointers and sizes travel in the kernel's argument block
// (4 KB at most: 80 tensors per launch), every tensor is cut into chunks of kChunk elements,
// block b takes chunk b of the concatenation and finds its tensor by a search over the chunk
// offsets. Threads move float4s (16 bytes) when the tensor's pointers allow it; the last partial
// vector of a tensor is done element by element. Launch cost is paid per 80 tensors, not per
// tensor and operation, and large and small tensors keep every block equally busy.
constexpr int kMaxTensors = 80;
constexpr int kChunk = 4 * 4 * kThreads;  // each thread: 4 float4s per chunk

struct TensorList {
  float* p[kMaxTensors];
  const float* g[kMaxTensors];
  float* m[kMaxTensors];
  float* v[kMaxTensors];
  int64_t numel[kMaxTensors];
  int chunk_start[kMaxTensors + 1];  // tensor k owns chunks [chunk_start[k], chunk_start[k + 1])
  int count;
};
static_assert(sizeof(TensorList) + sizeof(Hyper) <= 4096, "kernel arguments are limited to 4 KB");

__device__ __forceinline__ bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ void store4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }

__global__ void k_multi_tensor(TensorList L, Hyper h) {
  int lo = 0, hi = L.count - 1;  // the last tensor whose first chunk is <= blockIdx.x
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (L.chunk_start[mid] <= int(blockIdx.x)) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int k = lo;
  const int64_t begin = int64_t(blockIdx.x - L.chunk_start[k]) * kChunk, end = min(L.numel[k], begin + kChunk);
  float *p = L.p[k], *m = L.m[k], *v = L.v[k];
  const float* g = L.g[k];
  const bool vectors = aligned16(p) && aligned16(g) && aligned16(m) && aligned16(v);
  const int64_t vec_end = vectors ? begin + (end - begin) / 4 * 4 : begin;
  for (int64_t i = begin + 4 * int64_t(threadIdx.x); i < vec_end; i += 4 * int64_t(blockDim.x)) {
    float4 pv = load4(p + i), mv = load4(m + i), vv = load4(v + i);
    const float4 gv = load4(g + i);
    adamw_element(h, pv.x, gv.x, mv.x, vv.x);
    adamw_element(h, pv.y, gv.y, mv.y, vv.y);
    adamw_element(h, pv.z, gv.z, mv.z, vv.z);
    adamw_element(h, pv.w, gv.w, mv.w, vv.w);
    store4(p + i, pv), store4(m + i, mv), store4(v + i, vv);
  }
  for (int64_t i = vec_end + threadIdx.x; i < end; i += blockDim.x) adamw_element(h, p[i], g[i], m[i], v[i]);
}

void v3(const std::vector<Param>& list, const Buffers& B, int t) {
  const Hyper h(t);
  for (size_t first = 0; first < list.size(); first += kMaxTensors) {
    TensorList L{};
    L.count = static_cast<int>(std::min<size_t>(kMaxTensors, list.size() - first));
    for (int k = 0; k < L.count; ++k) {
      const Param& X = list[first + k];
      L.p[k] = B.p + X.offset, L.g[k] = B.g + X.offset, L.m[k] = B.m + X.offset, L.v[k] = B.v + X.offset;
      L.numel[k] = X.numel;
      L.chunk_start[k + 1] = L.chunk_start[k] + static_cast<int>((X.numel + kChunk - 1) / kChunk);
    }
    k_multi_tensor<<<L.chunk_start[L.count], kThreads>>>(L, h);
    LAUNCH_CHECK();
  }
}

// ------------------------------------------------------------------ driver

struct Version {
  const char* name;
  void (*step)(const std::vector<Param>&, const Buffers&, int);
};
const Version kVersions[] = {
    {"unfused: 5 kernels per tensor", v1},  // 1
    {"fused: 1 kernel per tensor", v2},     // 2
    {"multi-tensor, float4", v3},           // 3
};

}  // namespace

int main(int argc, char** argv) {
  const lab::Options opt = lab::parse_args(argc, argv, kVersions, {85000000}, {1}, kUsage);
  lab::require_device("lab_adamw_cuda");
  int64_t padded = 0;
  const std::vector<Param> list = lab::adamw::gpt2_like_list(opt.size[0], &padded);
  const int64_t N = opt.size[0];
  std::printf("lab_adamw_cuda: AdamW step, f32, %lld parameters in %zu tensors\n", (long long)N, list.size());
  std::vector<float> p0(padded), g(padded), out(padded);
  lab::adamw::fill_inputs(p0.data(), g.data(), padded);
  const lab::adamw::Reference ref(p0.data(), g.data(), list, padded);

  lab::DeviceBuffer<float> d_p(padded), d_g(padded), d_m(padded), d_v(padded), d_tmp(padded);
  d_g.upload(g.data());
  const Buffers B{d_p.data(), d_g.data(), d_m.data(), d_v.data(), d_tmp.data()};

  const std::vector<lab::Peak> peaks{{"D2D copy", lab::device_copy_gbs()}};
  lab::Report report("GB/s");
  report.header(peaks);
  for (int vi : opt.versions) {
    const Version& ver = kVersions[vi - 1];
    d_p.upload(p0.data());
    CUDA_CHECK(cudaMemset(d_m.data(), 0, padded * sizeof(float)));
    CUDA_CHECK(cudaMemset(d_v.data(), 0, padded * sizeof(float)));
    for (int t = 1; t <= lab::adamw::kCheckedSteps; ++t) ver.step(list, B, t);
    CUDA_CHECK(cudaDeviceSynchronize());
    lab::Check check;  // p, m and v in turn through one host copy
    d_p.download(out.data()), ref.compare_p(check, out.data());
    d_m.download(out.data()), ref.compare_m(check, out.data());
    d_v.download(out.data()), ref.compare_v(check, out.data());
    int t = lab::adamw::kCheckedSteps + 1;
    report.row(
        vi, ver.name, 0, check, [&] { return lab::time_gpu([&] { ver.step(list, B, t++); }, opt); },
        lab::adamw::bytes(N), peaks[0]);
  }
  std::printf(
      "GB/s: minimal traffic (28 bytes per parameter) / median time; %%peak: of the device-to-device copy; "
      "max err: worst |out - ref| / scale (see the header of bench/lab/adamw_cuda.cu)\n");
  return report.exit_code();
}
