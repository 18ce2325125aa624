// cuDNN settings (kiln/cuda/cudnn.h): two process-wide flags and the autotuner's cache of chosen
// convolution algorithms. Compiled in every build; only version() talks to cuDNN itself.
#include "kiln/cuda/cudnn.h"

#include <atomic>

#include "kiln/config.h"
#include "kiln/core/autotune_cache.h"
#include "kiln/cuda/cuda.h"

#if KILN_WITH_CUDNN
#include <cudnn.h>
#endif

namespace kiln::cudnn {

namespace {

std::atomic<bool> g_benchmark{false};
std::atomic<bool> g_deterministic{false};

AutotuneCache<detail::AlgoChoice>& cache() {
  static auto* c =
      new AutotuneCache<detail::AlgoChoice>();  // never destroyed: convolutions may run during static teardown
  return *c;
}

}  // namespace

void set_benchmark(bool enabled) { g_benchmark = enabled; }
bool benchmark() { return g_benchmark; }
void set_deterministic(bool enabled) { g_deterministic = enabled; }
bool deterministic() { return g_deterministic; }

bool built_with_cudnn() { return KILN_WITH_CUDNN != 0; }

bool is_available() { return built_with_cudnn() && kiln::cuda::is_available() && version() > 0; }

int version() {
#if KILN_WITH_CUDNN
  // cudnnGetVersion() is major * 10000 + minor * 100 + patch since cuDNN 9 (and major * 1000 +
  // minor * 100 + patch before); report the 9.x form for both.
  const size_t v = cudnnGetVersion();
  if (v < 90000) return static_cast<int>((v / 1000) * 10000 + (v % 1000));
  return static_cast<int>(v);
#else
  return 0;
#endif
}

void clear_autotune_cache() { cache().clear(); }

size_t autotune_cache_size() { return cache().size(); }

namespace detail {

bool autotune_lookup(const std::string& key, AlgoChoice* out) {
  const std::optional<AlgoChoice> hit = cache().find(key);
  if (hit) *out = *hit;
  return hit.has_value();
}

void autotune_store(const std::string& key, const AlgoChoice& choice) { cache().store(key, choice); }

namespace {
std::atomic<int64_t> g_channels_last_fallbacks{0};
std::atomic<bool> g_refuse_channels_last{false};
}  // namespace
int64_t channels_last_fallbacks() { return g_channels_last_fallbacks.load(); }
void count_channels_last_fallback() { g_channels_last_fallbacks++; }
void set_refuse_channels_last_for_testing(bool refuse) { g_refuse_channels_last = refuse; }
bool refuse_channels_last_for_testing() { return g_refuse_channels_last.load(); }

}  // namespace detail

}  // namespace kiln::cudnn
