#pragma once
// Every debugging switch that costs training speed, in one place (docs/guide.md, speed-up 13).
// All are off by default; each has its own setter where it belongs, and this header reads them
// together so a training program can say, in one line, which are on:
//   anomaly detection        kiln::autograd::set_detect_anomaly(true)   names the op whose backward made NaN
//   sync-debug               kiln::cuda::set_sync_debug_mode(Warn|Error) reports implicit host syncs
//   deterministic algorithms kiln::set_deterministic_algorithms(true)    ordered (slower) accumulation
//   cuDNN deterministic      kiln::cudnn::set_deterministic(true)        only deterministic conv algorithms
#include <string>

namespace kiln::debug {

struct Switches {
  bool anomaly_detection = false;
  bool sync_debug = false;
  bool deterministic_algorithms = false;
  bool cudnn_deterministic = false;
  bool any() const { return anomaly_detection || sync_debug || deterministic_algorithms || cudnn_deterministic; }
};

Switches current();
// Empty when every switch is off; otherwise one line, e.g.
// "debug switches on (slower training): anomaly detection, sync-debug (warn)".
std::string summary();
// Turns every switch off.
void all_off();

}  // namespace kiln::debug
