#pragma once
// kiln's door to cudnn-frontend (NVIDIA's C++ graph API over cuDNN 9), for cuDNN's fused
// attention (SDPA). The frontend is heavy and header-only, so exactly one translation unit
// includes it: kiln/cuda/cudnn_graph.cpp, compiled when KILN_WITH_CUDNN_FRONTEND. This header
// does not include it.
//
// Two halves:
//  - pure functions, in every build (tests/core checks them without a GPU): which attention
//    cases the cuDNN path may take (sdpa_refusal), the rules a strided operand must follow
//    (sdpa_operand_ok), and the key of the graph cache (sdpa_graph_key);
//  - the runtime (KILN_WITH_CUDNN_FRONTEND builds only): sdpa_forward / sdpa_backward build a
//    cuDNN graph per key once (validate, build the operation graph, check support, build plans),
//    cache it, and execute it on the current stream of the tensors' device with a workspace from
//    kiln's caching allocator. A case cuDNN does not support is refused (the functions return
//    false, having written nothing) and the refusal is cached as well, so it costs one build
//    attempt per key. Failures while executing throw kiln::Error naming the op, the shapes and
//    cuDNN's message.
//
// Operands are 4-D [B, H, T, D] with any strides (unit stride in D), so q, k and v can be views
// of a fused [B, T, 3, H, D] projection and out a [B, T, H, D] buffer. Stats (the per-row
// log-sum-exp of the scaled scores, natural log, f32) are [B, H, Tq] contiguous, the layout and
// meaning of kiln's own kernel's lse, so either backward can follow either forward.
#include <cstdint>
#include <cstring>
#include <string>

#include "kiln/core/dtype.h"
#include "kiln/cuda/cudnn.h"

namespace kiln::cudnn::graph {

// ------------------------------------------------------------------ pure: the choice of path

// Why the cuDNN path does not take an attention case; None: it may (cuDNN's own support check
// still decides).
enum class SdpaRefusal {
  None,
  NotBuilt,     // kiln was built without cudnn-frontend
  Disabled,     // set_sdpa_backend(SdpaBackend::Kiln) / KILN_SDPA_BACKEND=kiln
  NotCuda,      // CPU tensors
  DType,        // only f16 and bf16
  OldGpu,       // compute capability below 8.0
  HeadDim,      // head dims must be multiples of 8, at most kMaxHeadDim
  Empty,        // a zero-sized dimension
  Mask,         // an explicit attn_mask (the composite path)
  Dropout,      // dropout (the composite path: kiln's Philox numbers, identical on CPU and GPU)
  Unsupported,  // cuDNN's support check refused the graph (see sdpa_last_refusal())
};

inline const char* to_string(SdpaRefusal r) {
  switch (r) {
    case SdpaRefusal::None: return "none";
    case SdpaRefusal::NotBuilt: return "kiln was built without cudnn-frontend";
    case SdpaRefusal::Disabled: return "the sdpa backend is set to kiln";
    case SdpaRefusal::NotCuda: return "not a CUDA tensor";
    case SdpaRefusal::DType: return "cuDNN's fused attention takes f16 and bf16 only";
    case SdpaRefusal::OldGpu: return "cuDNN's fused attention needs compute capability 8.0 or newer";
    case SdpaRefusal::HeadDim: return "head dims must be multiples of 8 up to 256";
    case SdpaRefusal::Empty: return "an empty batch, head count or sequence";
    case SdpaRefusal::Mask: return "an explicit attention mask";
    case SdpaRefusal::Dropout: return "dropout (kept on the composite path)";
    case SdpaRefusal::Unsupported: return "cuDNN does not support this case";
  }
  return "?";
}

inline constexpr int64_t kMaxHeadDim = 256;
inline constexpr int kSmUnknown = -1;  // the caller does not know the device yet: not checked

// One attention call as the choice sees it.
struct SdpaCase {
  bool built = false;  // built_with_frontend()
  SdpaBackend backend = SdpaBackend::Cudnn;
  bool cuda = false;
  int sm = kSmUnknown;  // compute capability major * 10 + minor (kSmUnknown: not checked)
  DType dtype = DType::F32;
  int64_t B = 0, H = 0, Tq = 0, Tk = 0, D = 0, Dv = 0;
  bool mask = false;
  double dropout = 0.0;
};

// The first reason, in this order, that the cuDNN path cannot take `c`; None when it may.
inline SdpaRefusal sdpa_refusal(const SdpaCase& c) {
  if (!c.built) return SdpaRefusal::NotBuilt;
  if (c.backend != SdpaBackend::Cudnn) return SdpaRefusal::Disabled;
  if (!c.cuda) return SdpaRefusal::NotCuda;
  if (c.dtype != DType::F16 && c.dtype != DType::BF16) return SdpaRefusal::DType;
  if (c.mask) return SdpaRefusal::Mask;
  if (c.dropout > 0.0) return SdpaRefusal::Dropout;
  if (c.sm != kSmUnknown && c.sm < 80) return SdpaRefusal::OldGpu;
  if (c.B <= 0 || c.H <= 0 || c.Tq <= 0 || c.Tk <= 0) return SdpaRefusal::Empty;
  auto head_ok = [](int64_t d) { return d > 0 && d % 8 == 0 && d <= kMaxHeadDim; };
  if (!head_ok(c.D) || !head_ok(c.Dv)) return SdpaRefusal::HeadDim;
  return SdpaRefusal::None;
}

// -------------------------------------------------------------- pure: operands and the key

// A 4-D [B, H, T, D] operand in elements: data pointer, sizes, strides.
struct SdpaOperand {
  const void* data = nullptr;
  int64_t size[4] = {0, 0, 0, 0};
  int64_t stride[4] = {0, 0, 0, 0};
};

// What cuDNN is handed: unit stride in D, every other stride positive and a multiple of 8
// elements (16 bytes of f16/bf16), a 16-byte aligned pointer. Size-1 dimensions are exempt
// from the stride rule (sdpa_canonical gives them a canonical stride). Operands that break a
// rule are copied to contiguous ones by the caller.
inline bool sdpa_operand_ok(const SdpaOperand& o) {
  if (reinterpret_cast<uintptr_t>(o.data) % 16 != 0) return false;
  if (o.size[3] > 1 && o.stride[3] != 1) return false;
  for (int d = 0; d < 3; ++d)
    if (o.size[d] > 1 && (o.stride[d] <= 0 || o.stride[d] % 8 != 0)) return false;
  return true;
}

// The operand with each size-1 dimension's stride replaced by the extent of the dimensions after
// it (any stride is valid there; a fixed one keeps the cache key and cuDNN's checks stable).
inline SdpaOperand sdpa_canonical(SdpaOperand o) {
  for (int d = 3; d >= 0; --d) {
    if (o.size[d] != 1) continue;
    o.stride[d] = d == 3 ? 1 : o.stride[d + 1] * o.size[d + 1];
    if (o.stride[d] <= 0) o.stride[d] = 1;
  }
  return o;
}

enum class SdpaOp : uint8_t { Forward = 1, Backward = 2 };

// The graph cache's key: everything a built graph depends on (op, dtype, causal, deterministic,
// device, and each operand's sizes and strides, in the op's operand order), never the data
// pointers or the scale (which is passed by value at execution). A byte string.
inline std::string sdpa_graph_key(SdpaOp op, DType dtype, bool causal, bool deterministic, int device,
                                  const SdpaOperand* operands, int n) {
  std::string key;
  auto put = [&key](int64_t v) { key.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(static_cast<int64_t>(op));
  put(static_cast<int64_t>(dtype));
  put(causal ? 1 : 0);
  put(deterministic ? 1 : 0);
  put(device);
  put(n);
  for (int i = 0; i < n; ++i) {
    for (int d = 0; d < 4; ++d) put(operands[i].size[d]);
    for (int d = 0; d < 4; ++d) put(operands[i].stride[d]);
  }
  return key;
}

// ------------------------------------------------------ runtime (KILN_WITH_CUDNN_FRONTEND)

struct SdpaForwardArgs {
  SdpaOperand q, k, v;     // [B, H, Tq, D], [B, H, Tk, D], [B, H, Tk, Dv]
  SdpaOperand out;         // [B, H, Tq, Dv], written
  float* stats = nullptr;  // [B, H, Tq] contiguous f32, written
  DType dtype = DType::F16;
  double scale = 1.0;
  bool causal = false;  // top-left aligned: query i sees keys j <= i
  int device = 0;
  void* stream = nullptr;  // cudaStream_t
};

struct SdpaBackwardArgs {
  SdpaOperand q, k, v, out, dout;  // as in the forward; dout like out
  SdpaOperand dq, dk, dv;          // like q, k, v; written (all three)
  const float* stats = nullptr;    // the forward's
  DType dtype = DType::F16;
  double scale = 1.0;
  bool causal = false;
  bool deterministic = false;  // cuDNN's deterministic backward (no atomics in dQ)
  int device = 0;
  void* stream = nullptr;
};

// Run through cuDNN; false when cuDNN refuses the case (nothing written). Defined only in builds
// with cudnn-frontend; callers check built_with_frontend() first.
bool sdpa_forward(const SdpaForwardArgs& args);
bool sdpa_backward(const SdpaBackwardArgs& args);
// The device's compute capability as major * 10 + minor (cached per device).
int device_sm(int device);

}  // namespace kiln::cudnn::graph
