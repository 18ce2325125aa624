#pragma once
// The state behind the CPU convolution settings of kiln/core/cpu_conv.h. It lives outside
// kiln/kernels/cpu, whose files are compiled once per CPU level (kiln/core/cpu_isa.h): every
// copy of the kernels must read the one switch the user set.
#include <atomic>

#include "kiln/core/autotune_cache.h"

namespace kiln::kernels::cpu_conv {

// On unless KILN_CPU_CONV_WINOGRAD=0 (for A/B runs of whole programs).
std::atomic<bool>& winograd_switch();
// 0 (per plane), 2 or 4; KILN_CPU_CONV_WINOGRAD_TILE sets it from the start.
std::atomic<int>& winograd_tile_setting();

// The layout autotuner's switch and its cache: key -> whether the other layout's kernel won.
struct Autotuner {
  std::atomic<bool> enabled{false};
  AutotuneCache<bool> use_other;
};
Autotuner& autotuner();

}  // namespace kiln::kernels::cpu_conv
