// 2-D convolution on the GPU through cuDNN's convolution API: forward, backward-to-input
// (cudnnConvolutionBackwardData) and backward-to-weight (cudnnConvolutionBackwardFilter). The
// bias is added, and its gradient summed, by kiln's own kernels (a broadcast add, a reduction with
// f32 accumulation for 16-bit data): the legacy cudnnAddTensor / cudnnConvolutionBackwardBias do
// not support bf16.
//
// Descriptors. x, out and their gradients are described as NCHW or NHWC (channels-last) packed
// tensors, as ConvGeometry says; groups via cudnnSetConvolutionGroupCount. kiln stores a weight
// as a contiguous [K, C/groups, kh, kw] (an NCHW filter). For NCHW data that is used as is. For
// channels-last data cuDNN's fast (tensor-core, no-transpose) kernels want an NHWC filter
// [K, kh, kw, C/groups], so the weight is copied into that layout for the call (and the weight
// gradient is computed in it and copied back); weights are small next to activations, and when
// kh == kw == 1 or C/groups == 1 (pointwise and depthwise convolutions) both layouts are the same
// memory and nothing is copied.
//
// Math. f16/bf16 run with f32 accumulation on tensor cores (CUDNN_TENSOR_OP_MATH). f32 uses
// plain FMA math (exact f32, as the CPU) unless kiln::cuda::allow_tf32() is on, which permits
// TF32 tensor cores (CUDNN_DEFAULT_MATH; never CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION, which would
// also let cuDNN round f32 data down to f16). f64 uses the default math.
//
// Algorithm choice (kiln/cuda/cudnn.h): benchmark off -> cuDNN's heuristics
// (cudnnGet...Algorithm_v7), the first algorithm whose workspace can be allocated; benchmark on
// -> cudnnFind...AlgorithmEx times every algorithm once. Either choice is cached per (direction,
// geometry, dtype, layout, device, operand alignment, flags) in kiln::cudnn's cache. With
// kiln::cudnn::deterministic() only algorithms reported CUDNN_DETERMINISTIC are eligible.
// Workspaces come from kiln's caching allocator (a byte tensor on the device), so they are
// stream-ordered and show up in kiln::cuda::memory_stats().
//
// cuDNN 9 marks this (legacy) convolution API deprecated in favour of the graph API; it is still
// shipped and supported, and is far smaller to use, so the deprecation warnings are silenced here.
#include "kiln/config.h"
#include "kiln/kernels/copy_fill.h"
#include "kiln/kernels/pointwise.h"
#include "kiln/kernels/reduce.h"
#include "kiln/kernels/conv.h"
#include "kiln/kernels/memory_format.h"
#include "kiln/kernels/pool.h"

#if KILN_WITH_CUDNN

#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/cuda/cuda.h"
#include "kiln/cuda/check.h"
#include "kiln/cuda/cudnn.h"

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace kiln::kernels::cuda {

namespace {

std::string cudnn_last_error() {
#if CUDNN_MAJOR >= 9
  char buf[512] = {0};
  cudnnGetLastErrorString(buf, sizeof(buf));
  if (buf[0]) return std::string(" (") + buf + ")";
#endif
  return "";
}

}  // namespace

#define KILN_CUDNN_CHECK(call)                                                                                       \
  do {                                                                                                               \
    cudnnStatus_t kiln_st_ = (call);                                                                                 \
    if (kiln_st_ != CUDNN_STATUS_SUCCESS)                                                                            \
      throw ::kiln::Error(                                                                                           \
          ::kiln::detail::concat("cuDNN error in ", #call, ": ", cudnnGetErrorString(kiln_st_), cudnn_last_error()), \
          __FILE__, __LINE__);                                                                                       \
  } while (0)

// The count a cuDNN query writes through `&got` (algorithm counts), checked as above.
#define KILN_CUDNN_COUNT(call) \
  [&] {                        \
    int got = 0;               \
    KILN_CUDNN_CHECK(call);    \
    return got;                \
  }()

namespace {

// ------------------------------------------------------------------- device and stream

cudaStream_t stream_for(const Tensor& t) {
  return static_cast<cudaStream_t>(kiln::cuda::current_stream(t.device().index).handle);
}

// Makes the tensor's device current for the calls (multi-GPU processes).
struct DeviceGuard : kiln::cuda::internal::DeviceGuard {
  explicit DeviceGuard(const Tensor& t) : kiln::cuda::internal::DeviceGuard(t.device().index) {}
};

// ------------------------------------------------------------------------------- handles

// cuDNN handles are tied to the device current at creation and must not be used by two threads
// at once: a per-device pool hands each call its own, and takes it back afterwards. The pool is
// never destroyed (handles may be in use during static destruction; the driver frees them at
// exit).
class HandlePool {
 public:
  static HandlePool& get() {
    static HandlePool* p = new HandlePool();
    return *p;
  }
  cudnnHandle_t acquire(int device) {
    KILN_CHECK(device >= 0 && device < kMaxDevices, "cuDNN handle pool: device index ", device,
               " out of range (at most ", kMaxDevices, " devices)");
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& v = free_[device];
      if (!v.empty()) {
        cudnnHandle_t h = v.back();
        v.pop_back();
        return h;
      }
    }
    cudnnHandle_t h = nullptr;
    KILN_CUDNN_CHECK(cudnnCreate(&h));  // the caller made `device` current
    return h;
  }
  void release(int device, cudnnHandle_t h) {
    std::lock_guard<std::mutex> lock(mu_);
    free_[device].push_back(h);
  }

 private:
  static constexpr int kMaxDevices = 64;
  std::mutex mu_;
  std::vector<cudnnHandle_t> free_[kMaxDevices];
};

// A handle from the pool, set to the current stream of t's device (t's device must be current).
struct Handle {
  int device;
  cudnnHandle_t h;
  explicit Handle(const Tensor& t) : device(t.device().index), h(HandlePool::get().acquire(device)) {
    try {
      KILN_CUDNN_CHECK(cudnnSetStream(h, stream_for(t)));
    } catch (...) {
      HandlePool::get().release(device, h);
      throw;
    }
  }
  ~Handle() { HandlePool::get().release(device, h); }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
};

// ---------------------------------------------------------------------------- descriptors

// An owned cuDNN descriptor of type D, made and freed by the given cuDNN calls.
template <class D, cudnnStatus_t (*Create)(D*), cudnnStatus_t (*Destroy)(D)> struct Desc {
  D d = nullptr;
  Desc() { KILN_CUDNN_CHECK(Create(&d)); }
  ~Desc() { Destroy(d); }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
};
using TensorDesc = Desc<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using FilterDesc = Desc<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using ConvDesc =
    Desc<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor, cudnnDestroyConvolutionDescriptor>;

cudnnDataType_t data_type(DType t, const char* op) {
  switch (t) {
    case DType::F32: return CUDNN_DATA_FLOAT;
    case DType::F64: return CUDNN_DATA_DOUBLE;
    case DType::F16: return CUDNN_DATA_HALF;
    case DType::BF16: return CUDNN_DATA_BFLOAT16;
    default: KILN_FAIL(op, ": dtype ", t, " is not supported by the cuDNN convolution");
  }
}

// What the descriptors are set to before the search; the chosen algorithm's own math type
// replaces it for the call (see run_math_type).
cudnnMathType_t search_math_type(DType t) {
  switch (t) {
    case DType::F32: return kiln::cuda::allow_tf32() ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
    case DType::F16:
    case DType::BF16: return CUDNN_TENSOR_OP_MATH;
    default: return CUDNN_DEFAULT_MATH;
  }
}

// Whether an algorithm reported with math type m may run for dtype t under the current flags.
bool math_allowed(DType t, cudnnMathType_t m) {
  if (t == DType::F32 && !kiln::cuda::allow_tf32()) return m == CUDNN_FMA_MATH || m == CUDNN_DEFAULT_MATH;
  if (t == DType::F32 || t == DType::F64) return m != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
  return true;
}

cudnnMathType_t run_math_type(DType t, cudnnMathType_t reported) {
  // f32 without TF32 always runs with FMA math (a reported DEFAULT_MATH may mean TF32 on Ampere+)
  if (t == DType::F32 && !kiln::cuda::allow_tf32()) return CUDNN_FMA_MATH;
  return reported;
}

int as_int(int64_t v, const char* op, const char* what) {
  KILN_CHECK(v >= 0 && v <= INT_MAX, op, ": ", what, " = ", v, " does not fit cuDNN's int");
  return static_cast<int>(v);
}

// The descriptors of one convolution: x [N, C, H, W], y [N, K, OH, OW], w [K, C/g, kh, kw].
struct ConvDescs {
  TensorDesc x, y;
  FilterDesc w;
  ConvDesc conv;
  DType dtype;

  ConvDescs(const ConvGeometry& g, DType t, const char* op) : dtype(t) {
    const cudnnDataType_t dt = data_type(t, op);
    const cudnnTensorFormat_t fmt = g.channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    KILN_CHECK(g.N * g.C * g.H * g.W <= INT_MAX && g.N * g.K * g.OH * g.OW <= INT_MAX, op,
               ": tensors of 2^31 or more elements are not supported by the cuDNN convolution "
               "(input [",
               g.N, ", ", g.C, ", ", g.H, ", ", g.W, "], output [", g.N, ", ", g.K, ", ", g.OH, ", ", g.OW,
               "]); split the batch");
    KILN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x.d, fmt, dt, as_int(g.N, op, "N"), as_int(g.C, op, "C"),
                                                as_int(g.H, op, "H"), as_int(g.W, op, "W")));
    KILN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(y.d, fmt, dt, as_int(g.N, op, "N"), as_int(g.K, op, "K"),
                                                as_int(g.OH, op, "OH"), as_int(g.OW, op, "OW")));
    KILN_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w.d, dt, fmt, as_int(g.K, op, "K"),
                                                as_int(g.C / g.groups, op, "C/groups"), as_int(g.kh, op, "kh"),
                                                as_int(g.kw, op, "kw")));
    const cudnnDataType_t compute = t == DType::F64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    KILN_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv.d, as_int(g.ph, op, "padding"), as_int(g.pw, op, "padding"),
                                                     as_int(g.sh, op, "stride"), as_int(g.sw, op, "stride"),
                                                     as_int(g.dh, op, "dilation"), as_int(g.dw, op, "dilation"),
                                                     CUDNN_CROSS_CORRELATION, compute));
    KILN_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv.d, as_int(g.groups, op, "groups")));
    KILN_CUDNN_CHECK(cudnnSetConvolutionMathType(conv.d, search_math_type(t)));
  }
};

// alpha / beta as cuDNN wants them: double for f64 data, float otherwise.
struct Scalars {
  float f1 = 1.0f, f0 = 0.0f;
  double d1 = 1.0, d0 = 0.0;
  bool dbl;
  explicit Scalars(DType t) : dbl(t == DType::F64) {}
  const void* one() const { return dbl ? static_cast<const void*>(&d1) : &f1; }
  const void* zero() const { return dbl ? static_cast<const void*>(&d0) : &f0; }
};

// ------------------------------------------------------------------- algorithm selection

enum class Direction : int64_t { Forward = 1, BackwardData = 2, BackwardFilter = 3 };

// Workspaces above this are never asked for (cuDNN's FFT algorithms can want several GiB).
constexpr size_t kMaxWorkspace = size_t{1} << 30;

// Per-direction calls, so the search below is written once. Each direction's cuDNN calls take
// their descriptors in the order (A, B, conv, Out), Out being the buffer written: forward
// (x, w, y), backward data (w, y, x), backward filter (x, y, w).
enum class Slot { X, W, Y };

template <Slot S> auto desc_of(const ConvDescs& d) {
  if constexpr (S == Slot::X) return d.x.d;
  else if constexpr (S == Slot::W) return d.w.d;
  else return d.y.d;
}

template <Slot S> void* data_of(void* x, void* w, void* y) { return S == Slot::X ? x : S == Slot::W ? w : y; }

template <class PerfT, class AlgoT, Slot A, Slot B, Slot Out, auto MaxCount, auto Heuristics, auto Find, auto Workspace>
struct ConvOps {
  using Perf = PerfT;
  static int max_count(cudnnHandle_t h) { return KILN_CUDNN_COUNT(MaxCount(h, &got)); }
  static int heuristics(cudnnHandle_t h, const ConvDescs& d, int n, Perf* p) {
    return KILN_CUDNN_COUNT(Heuristics(h, desc_of<A>(d), desc_of<B>(d), d.conv.d, desc_of<Out>(d), n, &got, p));
  }
  // x, w, y: the data of the descriptors of those names (the Out one is written)
  static int find(cudnnHandle_t h, const ConvDescs& d, void* x, void* w, void* y, int n, Perf* p, void* ws,
                  size_t wsz) {
    return KILN_CUDNN_COUNT(Find(h, desc_of<A>(d), data_of<A>(x, w, y), desc_of<B>(d), data_of<B>(x, w, y), d.conv.d,
                                 desc_of<Out>(d), data_of<Out>(x, w, y), n, &got, p, ws, wsz));
  }
  // Workspace bytes of `algo` under the descriptor's current math type (status, no throw).
  static cudnnStatus_t workspace(cudnnHandle_t h, const ConvDescs& d, int algo, size_t* s) {
    return Workspace(h, desc_of<A>(d), desc_of<B>(d), d.conv.d, desc_of<Out>(d), static_cast<AlgoT>(algo), s);
  }
};

struct FwdOps : ConvOps<cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t, Slot::X, Slot::W, Slot::Y,
                        cudnnGetConvolutionForwardAlgorithmMaxCount, cudnnGetConvolutionForwardAlgorithm_v7,
                        cudnnFindConvolutionForwardAlgorithmEx, cudnnGetConvolutionForwardWorkspaceSize> {
  static constexpr const char* name = "conv2d (cuDNN forward)";
};

struct BwdDataOps
    : ConvOps<cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t, Slot::W, Slot::Y, Slot::X,
              cudnnGetConvolutionBackwardDataAlgorithmMaxCount, cudnnGetConvolutionBackwardDataAlgorithm_v7,
              cudnnFindConvolutionBackwardDataAlgorithmEx, cudnnGetConvolutionBackwardDataWorkspaceSize> {
  static constexpr const char* name = "conv2d_backward_input (cuDNN backward data)";
};

struct BwdFilterOps
    : ConvOps<cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t, Slot::X, Slot::Y, Slot::W,
              cudnnGetConvolutionBackwardFilterAlgorithmMaxCount, cudnnGetConvolutionBackwardFilterAlgorithm_v7,
              cudnnFindConvolutionBackwardFilterAlgorithmEx, cudnnGetConvolutionBackwardFilterWorkspaceSize> {
  static constexpr const char* name = "conv2d_backward_weight (cuDNN backward filter)";
};

// Largest power of two (at most 16) dividing the address: cuDNN's kernels can depend on it.
int64_t alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  for (int64_t k = 16; k > 1; k /= 2)
    if (a % k == 0) return k;
  return 1;
}

std::string cache_key(Direction dir, const ConvGeometry& g, DType t, int device,
                      std::initializer_list<const void*> ptrs) {
  std::vector<int64_t> v = g.fields();
  v.insert(v.end(), {static_cast<int64_t>(dir), static_cast<int64_t>(t), device, kiln::cudnn::benchmark() ? 1 : 0,
                     kiln::cudnn::deterministic() ? 1 : 0, kiln::cuda::allow_tf32() ? 1 : 0});
  for (const void* p : ptrs) v.push_back(alignment(p));
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t));
}

// A workspace of `bytes` from the caching allocator (undefined for 0 bytes).
Tensor workspace_tensor(size_t bytes, const Tensor& like) {
  if (bytes == 0) return Tensor();
  return empty({static_cast<int64_t>(bytes)}, TensorOptions(DType::U8).device(like.device()));
}

void* ptr_of(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

template <class Perf> bool eligible(const Perf& p, DType t) {
  if (p.status != CUDNN_STATUS_SUCCESS) return false;
  if (kiln::cudnn::deterministic() && p.determinism != CUDNN_DETERMINISTIC) return false;
  return math_allowed(t, p.mathType);
}

std::string flags_text() {
  return ::kiln::detail::concat("benchmark=", kiln::cudnn::benchmark() ? "on" : "off",
                                ", deterministic=", kiln::cudnn::deterministic() ? "on" : "off",
                                ", allow_tf32=", kiln::cuda::allow_tf32() ? "on" : "off");
}

std::string geometry_text(const ConvGeometry& g, DType t) {
  return ::kiln::detail::concat("input [", g.N, ", ", g.C, ", ", g.H, ", ", g.W, "], weight [", g.K, ", ",
                                g.C / g.groups, ", ", g.kh, ", ", g.kw, "], output [", g.N, ", ", g.K, ", ", g.OH, ", ",
                                g.OW, "], stride [", g.sh, ", ", g.sw, "], padding [", g.ph, ", ", g.pw,
                                "], dilation [", g.dh, ", ", g.dw, "], groups ", g.groups, ", ",
                                g.channels_last ? "channels-last" : "NCHW", ", ", t);
}

// Workspace bytes of `algo` when run with math type m (which the descriptor is left set to);
// false when cuDNN cannot say (the algorithm is then not used).
template <class Ops>
bool workspace_for(const Handle& h, const ConvDescs& d, int algo, cudnnMathType_t m, size_t* bytes) {
  if (cudnnSetConvolutionMathType(d.conv.d, m) != CUDNN_STATUS_SUCCESS) return false;
  return Ops::workspace(h.h, d, algo, bytes) == CUDNN_STATUS_SUCCESS;
}

// The algorithm (cached, or searched now) and a workspace for it. `a`, `b`, `c` are the data of
// the x, w and y descriptors (Ops::find's order); the written one may be overwritten by the search.
// On return the convolution descriptor's math type is the choice's.
// Thrown (not a kiln::Error, so no annotation catches it) when cuDNN has no algorithm for a
// channels-last geometry, as can happen for exact f32 with dilation or groups: the entry points
// then run the convolution on NCHW copies (run_nchw_instead).
struct NoChannelsLastAlgorithm {};

template <class Ops>
kiln::cudnn::detail::AlgoChoice choose(const Handle& h, const ConvDescs& d, const ConvGeometry& g, Direction dir,
                                       const Tensor& ref, void* a, void* b, void* c, Tensor& ws) {
  using Perf = typename Ops::Perf;
  const std::string key = cache_key(dir, g, d.dtype, h.device, {a, b, c});
  kiln::cudnn::detail::AlgoChoice choice;
  if (g.channels_last && kiln::cudnn::detail::refuse_channels_last_for_testing()) throw NoChannelsLastAlgorithm{};
  bool found = kiln::cudnn::detail::autotune_lookup(key, &choice);
  if (found) {
    ws = workspace_tensor(choice.workspace, ref);
  } else {
    const int max_n = std::max(1, Ops::max_count(h.h));
    std::vector<Perf> perfs(max_n);
    const int got = Ops::heuristics(h.h, d, max_n, perfs.data());

    if (!kiln::cudnn::benchmark()) {
      // Heuristic order; the first eligible algorithm whose workspace can be allocated.
      for (int i = 0; i < got && !found; ++i) {
        const Perf& p = perfs[i];
        if (!eligible(p, d.dtype)) continue;
        const cudnnMathType_t m = run_math_type(d.dtype, p.mathType);
        size_t need = 0;
        if (!workspace_for<Ops>(h, d, p.algo, m, &need) || need > kMaxWorkspace) continue;
        try {
          ws = workspace_tensor(need, ref);
        } catch (const kiln::Error&) {  // out of memory: try an algorithm that needs less
          continue;
        }
        choice.algo = static_cast<int>(p.algo);
        choice.math_type = static_cast<int>(m);
        choice.workspace = need;
        found = true;
      }
    } else {
      // Time every algorithm: give cudnnFind a workspace as large as the largest eligible
      // algorithm needs (within kMaxWorkspace), or none when that cannot be allocated.
      size_t need = 0;
      for (int i = 0; i < got; ++i) {
        const Perf& p = perfs[i];
        size_t s = 0;
        if (eligible(p, d.dtype) && workspace_for<Ops>(h, d, p.algo, run_math_type(d.dtype, p.mathType), &s) &&
            s <= kMaxWorkspace)
          need = std::max(need, std::max(s, std::min(p.memory, kMaxWorkspace)));
      }
      Tensor search_ws;
      try {
        search_ws = workspace_tensor(need, ref);
      } catch (const kiln::Error&) {
        need = 0;
      }
      KILN_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv.d, search_math_type(d.dtype)));
      std::vector<Perf> timed(max_n);
      const int n = Ops::find(h.h, d, a, b, c, max_n, timed.data(), ptr_of(search_ws), need);
      for (int i = 0; i < n && !found; ++i) {  // sorted fastest first
        const Perf& p = timed[i];
        if (!eligible(p, d.dtype) || p.memory > need) continue;
        const cudnnMathType_t m = run_math_type(d.dtype, p.mathType);
        size_t bytes = 0;
        if (!workspace_for<Ops>(h, d, p.algo, m, &bytes) || bytes > kMaxWorkspace) continue;
        choice.algo = static_cast<int>(p.algo);
        choice.math_type = static_cast<int>(m);
        choice.workspace = bytes;
        found = true;
      }
      if (found)
        ws = choice.workspace <= need && search_ws.defined() ? search_ws : workspace_tensor(choice.workspace, ref);
    }
    if (!found && g.channels_last) throw NoChannelsLastAlgorithm{};  // the caller retries in NCHW
    KILN_CHECK(found, Ops::name, ": cuDNN offers no ", kiln::cudnn::deterministic() ? "deterministic " : "",
               "algorithm for ", geometry_text(g, d.dtype), " (", flags_text(), ")");
    kiln::cudnn::detail::autotune_store(key, choice);
  }
  KILN_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv.d, static_cast<cudnnMathType_t>(choice.math_type)));
  return choice;
}

// ------------------------------------------------------------------------- operand checks

void check_operands(const char* op, const ConvGeometry& g, std::initializer_list<const Tensor*> ts) {
  const Tensor* first = nullptr;
  for (const Tensor* t : ts) {
    if (!t->defined()) continue;
    if (!first) first = t;
    KILN_CHECK(t->device() == first->device() && t->dtype() == first->dtype(), op,
               ": operands must share one device and dtype, got ", first->dtype(), " on ", first->device(), " and ",
               t->dtype(), " on ", t->device());
  }
}

void check_image(const char* op, const char* what, const Tensor& t, const ConvGeometry& g, int64_t C, int64_t H,
                 int64_t W) {
  KILN_CHECK(t.dim() == 4 && t.size(0) == g.N && t.size(1) == C && t.size(2) == H && t.size(3) == W, op, ": ", what,
             " has sizes ", t.sizes(), ", expected [", g.N, ", ", C, ", ", H, ", ", W, "]");
  const MemoryFormat fmt = g.channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
  KILN_CHECK(has_layout(t, fmt), op, ": ", what, " (sizes ", t.sizes(), ", strides ", t.strides(), ") is not ",
             g.channels_last ? "channels-last" : "NCHW-contiguous", " as the geometry says");
}

void check_weight(const char* op, const Tensor& w, const ConvGeometry& g) {
  KILN_CHECK(w.dim() == 4 && w.size(0) == g.K && w.size(1) * g.groups == g.C && w.size(2) == g.kh &&
                 w.size(3) == g.kw && w.is_contiguous(),
             op, ": weight must be a contiguous [", g.K, ", ", g.C / g.groups, ", ", g.kh, ", ", g.kw, "], got sizes ",
             w.sizes(), " strides ", w.strides());
}

// The filter in the layout the descriptors say: kiln's [K, C/g, kh, kw] for NCHW data, a copy as
// [K, kh, kw, C/g] for channels-last data (unless both are the same memory).
bool filter_needs_nhwc_copy(const ConvGeometry& g) {
  return g.channels_last && !(g.kh == 1 && g.kw == 1) && g.C / g.groups != 1;
}

Tensor filter_for(const Tensor& w, const ConvGeometry& g) {
  if (!filter_needs_nhwc_copy(g)) return w;
  return contiguous(w.detach().permute({0, 2, 3, 1}));
}

[[noreturn]] void annotate(const char* op, const ConvGeometry& g, DType t, const kiln::Error& e) {
  throw kiln::Error(
      ::kiln::detail::concat(e.what(), "\n  in ", op, " with ", geometry_text(g, t), " (", flags_text(), ")"), e.file(),
      e.line());
}

// The forward and backward-data calls' common part: descriptors, handle and scaling constants for
// t (the tensor whose device and dtype they take), the filter in the descriptors' layout, and the
// algorithm with its workspace for the data a and c of the x and y descriptors (as in choose);
// then call(h, d, s, w, choice, ws) makes the cuDNN call. A kiln::Error is annotated with the
// geometry.
template <class Ops, class Call>
void run_with_filter(const char* op, const ConvGeometry& g, Direction dir, const Tensor& t, const Tensor& weight,
                     void* a, void* c, Call&& call) {
  try {
    ConvDescs d(g, t.dtype(), op);
    Handle h(t);
    Scalars s(t.dtype());
    Tensor w = filter_for(weight, g);
    Tensor ws;
    const kiln::cudnn::detail::AlgoChoice choice = choose<Ops>(h, d, g, dir, t, a, w.data_ptr(), c, ws);
    call(h, d, s, w, choice, ws);
  } catch (const kiln::Error& e) {
    annotate(op, g, t.dtype(), e);
  }
}

ConvGeometry as_nchw(ConvGeometry g) {
  g.channels_last = false;
  return g;
}

// The fallback for NoChannelsLastAlgorithm: `run(g_nchw, out_nchw)` computes into an NCHW
// temporary from NCHW copies of the inputs (the caller makes them), then the result is copied into
// the channels-last `out`. Costs two layout copies; counted by cudnn::detail::channels_last_fallbacks.
template <class Run> void run_nchw_instead(const ConvGeometry& g, const Tensor& out, Run&& run) {
  kiln::cudnn::detail::count_channels_last_fallback();
  Tensor tmp = empty(out.sizes(), out.options());
  run(as_nchw(g), tmp);
  copy(out, tmp);
}

}  // namespace

// ------------------------------------------------------------------------------- entry points

void conv2d_forward(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias,
                    const ConvGeometry& g) {
  const char* op = "conv2d";
  check_operands(op, g, {&out, &x, &weight, &bias});
  check_image(op, "input", x, g, g.C, g.H, g.W);
  check_image(op, "output", out, g, g.K, g.OH, g.OW);
  check_weight(op, weight, g);
  if (bias.defined())
    KILN_CHECK(bias.dim() == 1 && bias.size(0) == g.K && bias.is_contiguous(), op, ": bias must be a contiguous [", g.K,
               "], got sizes ", bias.sizes());
  if (out.numel() == 0) return;
  DeviceGuard guard(x);
  if (x.numel() == 0) {  // no input channels: the output is the bias
    fill(out, 0.0);
    if (bias.defined()) binary(BinaryOp::Add, out, out, bias.detach().view({1, g.K, 1, 1}), 1.0, 0.0);
    return;
  }
  try {
    run_with_filter<FwdOps>(
        op, g, Direction::Forward, x, weight, x.data_ptr(), out.data_ptr(),
        [&](Handle& h, ConvDescs& d, Scalars& s, Tensor& w, const auto& c, Tensor& ws) {
          KILN_CUDNN_CHECK(cudnnConvolutionForward(h.h, s.one(), d.x.d, x.data_ptr(), d.w.d, w.data_ptr(), d.conv.d,
                                                   static_cast<cudnnConvolutionFwdAlgo_t>(c.algo), ptr_of(ws),
                                                   c.workspace, s.zero(), d.y.d, out.data_ptr()));
          if (bias.defined()) binary(BinaryOp::Add, out, out, bias.detach().view({1, g.K, 1, 1}), 1.0, 0.0);
        });
  } catch (const NoChannelsLastAlgorithm&) {
    const Tensor xn = contiguous(x.detach());
    run_nchw_instead(g, out, [&](const ConvGeometry& gn, const Tensor& o) { conv2d_forward(o, xn, weight, bias, gn); });
  }
}
KILN_REGISTER_KERNEL(kernels::conv2d_forward, CUDA, conv2d_forward);

void conv2d_backward_input(const Tensor& grad_x, const Tensor& grad_out, const Tensor& weight, const ConvGeometry& g) {
  const char* op = "conv2d_backward_input";
  check_operands(op, g, {&grad_x, &grad_out, &weight});
  check_image(op, "grad_input", grad_x, g, g.C, g.H, g.W);
  check_image(op, "grad_output", grad_out, g, g.K, g.OH, g.OW);
  check_weight(op, weight, g);
  if (grad_x.numel() == 0) return;
  DeviceGuard guard(grad_x);
  if (grad_out.numel() == 0 || weight.numel() == 0) {
    fill(grad_x, 0.0);
    return;
  }
  try {
    run_with_filter<BwdDataOps>(
        op, g, Direction::BackwardData, grad_x, weight, grad_x.data_ptr(), grad_out.data_ptr(),
        [&](Handle& h, ConvDescs& d, Scalars& s, Tensor& w, const auto& c, Tensor& ws) {
          KILN_CUDNN_CHECK(cudnnConvolutionBackwardData(h.h, s.one(), d.w.d, w.data_ptr(), d.y.d, grad_out.data_ptr(),
                                                        d.conv.d, static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo),
                                                        ptr_of(ws), c.workspace, s.zero(), d.x.d, grad_x.data_ptr()));
        });
  } catch (const NoChannelsLastAlgorithm&) {
    const Tensor gyn = contiguous(grad_out.detach());
    run_nchw_instead(g, grad_x,
                     [&](const ConvGeometry& gn, const Tensor& o) { conv2d_backward_input(o, gyn, weight, gn); });
  }
}
KILN_REGISTER_KERNEL(kernels::conv2d_backward_input, CUDA, conv2d_backward_input);

void conv2d_backward_weight(const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_out, const Tensor& x,
                            const ConvGeometry& g) {
  const char* op = "conv2d_backward_weight";
  check_operands(op, g, {&grad_weight, &grad_bias, &grad_out, &x});
  check_image(op, "grad_output", grad_out, g, g.K, g.OH, g.OW);
  if (grad_weight.defined()) {
    check_image(op, "input", x, g, g.C, g.H, g.W);
    check_weight(op, grad_weight, g);
  }
  if (grad_bias.defined())
    KILN_CHECK(grad_bias.dim() == 1 && grad_bias.size(0) == g.K && grad_bias.is_contiguous(), op,
               ": grad_bias must be a contiguous [", g.K, "], got sizes ", grad_bias.sizes());
  const Tensor& ref = grad_out;
  DeviceGuard guard(ref);
  const DType dt = grad_out.dtype();
  if (grad_out.numel() == 0) {  // N == 0 (or empty output): zero gradients
    if (grad_weight.defined() && grad_weight.numel() > 0) fill(grad_weight, 0.0);
    if (grad_bias.defined() && grad_bias.numel() > 0) fill(grad_bias, 0.0);
    return;
  }
  try {
    ConvDescs d(g, dt, op);
    Handle h(ref);
    Scalars s(dt);
    if (grad_weight.defined() && grad_weight.numel() > 0) {
      const bool nhwc_copy = filter_needs_nhwc_copy(g);
      Tensor dw = nhwc_copy ? empty({g.K, g.kh, g.kw, g.C / g.groups}, grad_weight.options()) : grad_weight;
      Tensor ws;
      auto c = choose<BwdFilterOps>(h, d, g, Direction::BackwardFilter, ref, x.data_ptr(), dw.data_ptr(),
                                    grad_out.data_ptr(), ws);
      KILN_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h.h, s.one(), d.x.d, x.data_ptr(), d.y.d, grad_out.data_ptr(),
                                                      d.conv.d, static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo),
                                                      ptr_of(ws), c.workspace, s.zero(), d.w.d, dw.data_ptr()));
      if (nhwc_copy) copy(grad_weight, dw.permute({0, 3, 1, 2}));
    }
    if (grad_bias.defined()) reduce(ReduceOp::Sum, grad_bias, grad_out, {0, 2, 3});
  } catch (const kiln::Error& e) {
    annotate(op, g, dt, e);
  } catch (const NoChannelsLastAlgorithm&) {  // the weight gradient has one layout: no copy back
    kiln::cudnn::detail::count_channels_last_fallback();
    conv2d_backward_weight(grad_weight, grad_bias, contiguous(grad_out.detach()), contiguous(x.detach()), as_nchw(g));
  }
}
KILN_REGISTER_KERNEL(kernels::conv2d_backward_weight, CUDA, conv2d_backward_weight);

}  // namespace kiln::kernels::cuda

#else  // !KILN_WITH_CUDNN

#include "kiln/core/error.h"

namespace kiln::kernels::cuda {

namespace {
[[noreturn]] void no_cudnn(const char* op, const Tensor& t) {
  KILN_FAIL(op, ": kiln was built without cuDNN, which CUDA convolutions need (tensor sizes ", t.sizes(), " on ",
            t.device(),
            "); install cuDNN and reconfigure kiln (-DKILN_CUDNN=ON), "
            "or run the convolution on the CPU");
}
}  // namespace

void conv2d_forward(const Tensor& out, const Tensor& x, const Tensor&, const Tensor&, const ConvGeometry&) {
  no_cudnn("conv2d", x);
}
void conv2d_backward_input(const Tensor& grad_x, const Tensor&, const Tensor&, const ConvGeometry&) {
  no_cudnn("conv2d_backward_input", grad_x);
}
void conv2d_backward_weight(const Tensor&, const Tensor&, const Tensor& grad_out, const Tensor&, const ConvGeometry&) {
  no_cudnn("conv2d_backward_weight", grad_out);
}

}  // namespace kiln::kernels::cuda

#endif  // KILN_WITH_CUDNN
