// The CPU convolution settings (kiln/core/cpu_conv.h) and the state behind them
// (kiln/kernels/cpu_conv_settings.h).
#include "kiln/kernels/cpu_conv_settings.h"

#include <cstdlib>

#include "kiln/core/cpu_conv.h"
#include "kiln/core/error.h"

namespace kiln::kernels::cpu_conv {

std::atomic<bool>& winograd_switch() {
  static std::atomic<bool> on{[] {
    const char* e = std::getenv("KILN_CPU_CONV_WINOGRAD");
    return !(e && std::string(e) == "0");
  }()};
  return on;
}

std::atomic<int>& winograd_tile_setting() {
  static std::atomic<int> m{[] {
    const char* e = std::getenv("KILN_CPU_CONV_WINOGRAD_TILE");
    const std::string s = e ? e : "";
    return s == "2" ? 2 : s == "4" ? 4 : 0;
  }()};
  return m;
}

Autotuner& autotuner() {
  static Autotuner t;
  return t;
}

}  // namespace kiln::kernels::cpu_conv

namespace kiln {

using kernels::cpu_conv::autotuner;

void set_cpu_conv_autotune(bool enabled) { autotuner().enabled = enabled; }
bool cpu_conv_autotune() { return autotuner().enabled; }

void clear_cpu_conv_autotune_cache() { autotuner().use_other.clear(); }

size_t cpu_conv_autotune_cache_size() { return autotuner().use_other.size(); }

void set_cpu_conv_winograd(bool enabled) { kernels::cpu_conv::winograd_switch() = enabled; }
bool cpu_conv_winograd() { return kernels::cpu_conv::winograd_switch(); }

void set_cpu_conv_winograd_tile(int m) {
  KILN_CHECK(m == 0 || m == 2 || m == 4,
             "set_cpu_conv_winograd_tile: the tile is 0 (per plane), 2 (F(2x2, 3x3)) or 4 (F(4x4, 3x3)); got ", m);
  kernels::cpu_conv::winograd_tile_setting() = m;
}
int cpu_conv_winograd_tile() { return kernels::cpu_conv::winograd_tile_setting(); }

}  // namespace kiln
