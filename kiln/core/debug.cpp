#include "kiln/core/debug.h"

#include "kiln/core/autograd.h"
#include "kiln/cuda/cudnn.h"
#include "kiln/core/determinism.h"
#include "kiln/core/sync_debug.h"

namespace kiln::debug {

Switches current() {
  Switches s;
  s.anomaly_detection = autograd::is_anomaly_enabled();
  s.sync_debug = cuda::sync_debug_mode() != cuda::SyncDebugMode::Off;
  s.deterministic_algorithms = deterministic_algorithms();
  s.cudnn_deterministic = cudnn::deterministic();
  return s;
}

std::string summary() {
  Switches s = current();
  if (!s.any()) return "";
  std::string out = "debug switches on (slower training):";
  auto add = [&](bool on, const std::string& what) {
    if (!on) return;
    out += (out.back() == ':' ? " " : ", ") + what;
  };
  add(s.anomaly_detection, "anomaly detection");
  add(s.sync_debug,
      std::string("sync-debug (") + (cuda::sync_debug_mode() == cuda::SyncDebugMode::Error ? "error" : "warn") + ")");
  add(s.deterministic_algorithms, "deterministic algorithms");
  add(s.cudnn_deterministic, "cuDNN deterministic");
  return out;
}

void all_off() {
  autograd::set_detect_anomaly(false);
  cuda::set_sync_debug_mode(cuda::SyncDebugMode::Off);
  set_deterministic_algorithms(false);
  cudnn::set_deterministic(false);
}

}  // namespace kiln::debug
