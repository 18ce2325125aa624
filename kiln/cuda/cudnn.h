#pragma once
// cuDNN settings, as torch.backends.cudnn: how CUDA convolutions choose their algorithm.
//
//   kiln::cudnn::set_benchmark(true);      // autotune: time every algorithm once per shape
//   kiln::cudnn::set_deterministic(true);  // only bitwise-reproducible algorithms
//
// benchmark off (the default): cuDNN's heuristics pick the algorithm (the first one that fits
// the workspace), with no timing runs. benchmark on: the first convolution of each (geometry,
// dtype, memory format, device, direction) runs every algorithm once (cudnnFind...Ex) and the
// fastest is cached for the rest of the process; worth it when the shapes repeat, as in a
// training loop with a fixed batch size. deterministic on: algorithms that use atomics (whose
// result can differ bitwise from run to run) are skipped in both modes.
//
// Every function exists in every build. Without cuDNN (or without CUDA) the flags are still
// stored, is_available() is false and version() is 0.
#include <cstddef>
#include <cstdint>
#include <string>

namespace kiln::cudnn {

void set_benchmark(bool enabled);
bool benchmark();
void set_deterministic(bool enabled);
bool deterministic();

bool built_with_cudnn();  // compiled with cuDNN
bool is_available();      // built with cuDNN and a CUDA device is present
// cuDNN's version as major * 10000 + minor * 100 + patch (9.19.0 -> 91900) of the library
// loaded at run time; 0 without cuDNN.
int version();

// Forgets every algorithm the autotuner chose (the next convolution of each shape searches
// again). The cache is per process and keyed by everything the choice depends on.
void clear_autotune_cache();
size_t autotune_cache_size();  // number of cached choices

// Scaled dot-product attention on CUDA tensors (docs/gpu.md, "Attention"). Cudnn (the default):
// f16/bf16 attention without a mask or dropout runs cuDNN's fused attention on sm_80 and newer
// (through cudnn-frontend, when kiln was built with it), and kiln's own kernel wherever cuDNN
// does not take the case; Kiln: always kiln's own kernel. The initial value comes from the
// environment variable KILN_SDPA_BACKEND (cudnn or kiln).
enum class SdpaBackend { Cudnn, Kiln };
void set_sdpa_backend(SdpaBackend backend);
SdpaBackend sdpa_backend();
bool built_with_frontend();  // compiled with cudnn-frontend (cuDNN's fused attention)

// Which path CUDA attention took, counted since the process started (or the last reset), so a
// test or a profile can tell: forward/backward calls through cuDNN and through kiln's kernel
// (on CUDA tensors; the composite path of masks and dropout is not counted), cuDNN graphs
// built, and cases cuDNN refused (each refused case once: refusals are cached like graphs).
struct SdpaCounts {
  int64_t cudnn_forward = 0, cudnn_backward = 0;
  int64_t kiln_forward = 0, kiln_backward = 0;
  int64_t graphs_built = 0, refused = 0;
};
SdpaCounts sdpa_counts();
void reset_sdpa_counts();
// Why cuDNN last refused an attention case ("" when it never did): its own message.
std::string sdpa_last_refusal();

namespace detail {
// The autotuner's cache, shared by the convolution kernels (kernels/cuda/conv_cudnn.cpp).
// Thread-safe. `key` is an opaque byte string built by the caller.
struct AlgoChoice {
  int algo = 0;          // cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t
  int math_type = 0;     // cudnnMathType_t
  size_t workspace = 0;  // bytes
};
bool autotune_lookup(const std::string& key, AlgoChoice* out);
void autotune_store(const std::string& key, const AlgoChoice& choice);
// cuDNN may offer no algorithm for some channels-last geometries (exact f32 with dilation or
// groups); the convolution then runs on NCHW copies. This counts those runs; the test hook makes
// the kernels act as if no channels-last algorithm existed.
int64_t channels_last_fallbacks();
void count_channels_last_fallback();
void set_refuse_channels_last_for_testing(bool refuse);
bool refuse_channels_last_for_testing();
// The attention counters (kiln/nn/functional/attention.cpp, kiln/cuda/cudnn_graph.cpp).
enum class SdpaEvent { CudnnForward, CudnnBackward, KilnForward, KilnBackward, GraphBuilt, Refused };
void count_sdpa(SdpaEvent event);
void set_sdpa_last_refusal(const std::string& why);
}  // namespace detail

}  // namespace kiln::cudnn
