// cuDNN settings (kiln/cuda/cudnn.h): two process-wide flags and the autotuner's cache of chosen
// convolution algorithms. Compiled in every build; only version() talks to cuDNN itself.
#include "kiln/cuda/cudnn.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "kiln/config.h"
#include "kiln/core/autotune_cache.h"
#include "kiln/core/error.h"
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

namespace {
SdpaBackend backend_from_env() {
  const char* env = std::getenv("KILN_SDPA_BACKEND");
  if (env == nullptr || *env == '\0' || std::strcmp(env, "cudnn") == 0) return SdpaBackend::Cudnn;
  KILN_CHECK(std::strcmp(env, "kiln") == 0, "KILN_SDPA_BACKEND must be cudnn or kiln, got '", env, "'");
  return SdpaBackend::Kiln;
}
std::atomic<int>& backend_flag() {
  static std::atomic<int> flag{static_cast<int>(backend_from_env())};
  return flag;
}
constexpr int kSdpaEvents = 6;
std::atomic<int64_t> g_sdpa_counts[kSdpaEvents];
std::mutex g_refusal_mu;
std::string& last_refusal() {
  static auto* s = new std::string();  // never destroyed, as the autotune cache
  return *s;
}
}  // namespace

void set_sdpa_backend(SdpaBackend backend) { backend_flag() = static_cast<int>(backend); }
SdpaBackend sdpa_backend() { return static_cast<SdpaBackend>(backend_flag().load()); }
bool built_with_frontend() { return KILN_WITH_CUDNN_FRONTEND != 0; }

SdpaCounts sdpa_counts() {
  SdpaCounts c;
  c.cudnn_forward = g_sdpa_counts[static_cast<int>(detail::SdpaEvent::CudnnForward)].load();
  c.cudnn_backward = g_sdpa_counts[static_cast<int>(detail::SdpaEvent::CudnnBackward)].load();
  c.kiln_forward = g_sdpa_counts[static_cast<int>(detail::SdpaEvent::KilnForward)].load();
  c.kiln_backward = g_sdpa_counts[static_cast<int>(detail::SdpaEvent::KilnBackward)].load();
  c.graphs_built = g_sdpa_counts[static_cast<int>(detail::SdpaEvent::GraphBuilt)].load();
  c.refused = g_sdpa_counts[static_cast<int>(detail::SdpaEvent::Refused)].load();
  return c;
}

void reset_sdpa_counts() {
  for (auto& c : g_sdpa_counts) c = 0;
}

std::string sdpa_last_refusal() {
  std::lock_guard<std::mutex> lock(g_refusal_mu);
  return last_refusal();
}

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

void count_sdpa(SdpaEvent event) { g_sdpa_counts[static_cast<int>(event)]++; }

void set_sdpa_last_refusal(const std::string& why) {
  std::lock_guard<std::mutex> lock(g_refusal_mu);
  last_refusal() = why;
}

}  // namespace detail

}  // namespace kiln::cudnn
