#include "kiln/core/sync_debug.h"

#include <cxxabi.h>
#include <execinfo.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <sstream>

#include "kiln/core/error.h"

namespace kiln::cuda {

namespace {
std::atomic<int> g_mode{static_cast<int>(SyncDebugMode::Off)};
std::atomic<int64_t> g_count{0};  // reported syncs (sync_count)

// "libkiln.so.0(_ZN4kiln6Tensor4itemIfEET_v+0x2c) [0x7f..]" -> "kiln::Tensor::item<float>()";
// falls back to the raw line when there is no symbol (static functions, stripped binaries).
std::string readable_frame(const char* raw) {
  std::string s(raw);
  const auto open = s.find('('), plus = s.find('+', open == std::string::npos ? 0 : open);
  if (open == std::string::npos || plus == std::string::npos || plus == open + 1) return s;
  std::string mangled = s.substr(open + 1, plus - open - 1);
  int status = 0;
  char* dem = abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status);
  std::string name = (status == 0 && dem) ? dem : mangled;
  std::free(dem);
  return name + "  [" + s.substr(0, open) + "]";
}

// Frames of the sync machinery itself, which say nothing about where the sync comes from.
bool internal_frame(const std::string& f) {
  for (const char* p : {"kiln::cuda::internal::", "kiln::cuda::memcpy", "CudaBackend",
                        "CachingAllocator::", "kiln::kernels::copy", "kiln::kernels::cuda::copy"})
    if (f.find(p) != std::string::npos) return true;
  return false;
}
}  // namespace

void set_sync_debug_mode(SyncDebugMode mode) { g_mode = static_cast<int>(mode); }
SyncDebugMode sync_debug_mode() { return static_cast<SyncDebugMode>(g_mode.load()); }
int64_t sync_count() { return g_count.load(std::memory_order_relaxed); }

namespace internal {

std::string call_site(int max_frames) {
  void* frames[64];
  int n = backtrace(frames, 64);
  char** syms = backtrace_symbols(frames, n);
  std::ostringstream os;
  int shown = 0;
  for (int i = 1; i < n && shown < max_frames; ++i) {  // frame 0 is call_site itself
    std::string f = syms ? readable_frame(syms[i]) : std::string("?");
    if (internal_frame(f)) continue;
    os << "    at " << f << "\n";
    ++shown;
  }
  std::free(syms);
  return os.str();
}

void report_sync(const std::string& what, bool may_throw) {
  SyncDebugMode mode = sync_debug_mode();
  if (mode == SyncDebugMode::Off) return;
  g_count.fetch_add(1, std::memory_order_relaxed);
  std::string where = call_site();
  std::string msg = "kiln sync-debug: implicit host-device synchronization (" + what + ")\n" + where;
  if (mode == SyncDebugMode::Error && may_throw)
    throw Error(msg + "(set_sync_debug_mode(SyncDebugMode::Error) turns these into errors)");
  static std::mutex mu;
  static std::set<std::string> seen;  // one report per call site, not one per step
  std::lock_guard<std::mutex> lock(mu);
  if (!seen.insert(where).second) return;
  std::fprintf(stderr, "%s", msg.c_str());
  std::fflush(stderr);
}

}  // namespace internal
}  // namespace kiln::cuda
