#pragma once
// The CPU level every CPU kernel call runs at, as the dispatch mechanism reads it
// (kiln/kernels/dispatch.h); the user's view is kiln/core/cpu_isa.h.
#include <atomic>

// The level a CPU kernel file is being compiled for: the build compiles kiln/kernels/cpu once
// per level (CMake, "CPU levels") and sets this; everything else is baseline code.
#ifndef KILN_THIS_CPU_ISA
#define KILN_THIS_CPU_ISA 0
#endif

namespace kiln::detail {

extern std::atomic<int> g_cpu_isa_level;  // -1 until the first call resolves it
int resolve_cpu_isa_level();

inline int cpu_isa_level() {
  const int level = g_cpu_isa_level.load(std::memory_order_relaxed);
  return level >= 0 ? level : resolve_cpu_isa_level();
}

}  // namespace kiln::detail
