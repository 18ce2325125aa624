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
}  // namespace detail

}  // namespace kiln::cudnn
