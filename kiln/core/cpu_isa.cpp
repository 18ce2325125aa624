// The CPU level in use (kiln/core/cpu_isa.h): what the processor has, what the build holds,
// what KILN_CPU_ISA or set_cpu_isa asked for.
#include "kiln/core/cpu_isa.h"

#include <atomic>
#include <cstdlib>

#include "kiln/config.h"
#include "kiln/core/error.h"
#include "kiln/core/cpu_isa_level.h"

namespace kiln {

namespace detail {
std::atomic<int> g_cpu_isa_level{-1};
}

namespace {

constexpr const char* kNames[kNumCpuIsas] = {"baseline", "avx2", "avx512"};

// Why `isa` cannot run here, or "" when it can.
std::string unavailable(CpuIsa isa) {
  if (!cpu_supports(isa)) return std::string("this processor lacks ") + cpu_isa_name(isa);
  if (!cpu_isa_built(isa))
    return std::string("this build of kiln has no ") + cpu_isa_name(isa) + " kernels (CMake option KILN_CPU_ISAS)";
  return "";
}

CpuIsa checked(CpuIsa isa, const char* who) {
  const std::string why = unavailable(isa);
  KILN_CHECK(why.empty(), who, ": cannot run the CPU kernels at level ", cpu_isa_name(isa), ": ", why,
             "; available: ", cpu_isa_summary());
  return isa;
}

// The level KILN_CPU_ISA asks for, or the best one.
CpuIsa from_environment() {
  const char* env = std::getenv("KILN_CPU_ISA");
  if (!env || !*env || std::string(env) == "auto") return best_cpu_isa();
  return checked(parse_cpu_isa(env), "KILN_CPU_ISA");
}

}  // namespace

const char* cpu_isa_name(CpuIsa isa) {
  const int i = static_cast<int>(isa);
  KILN_CHECK(i >= 0 && i < kNumCpuIsas, "cpu_isa_name: no CPU level ", i);
  return kNames[i];
}

CpuIsa parse_cpu_isa(const std::string& name) {
  for (int i = 0; i < kNumCpuIsas; ++i)
    if (name == kNames[i]) return static_cast<CpuIsa>(i);
  KILN_FAIL("unknown CPU level '", name, "': expected auto, baseline, avx2 or avx512");
}

bool cpu_supports(CpuIsa isa) {
#if defined(__x86_64__)
  __builtin_cpu_init();  // may run before libgcc's own constructor (static initialisers)
  switch (isa) {
    case CpuIsa::baseline: return true;
    case CpuIsa::avx2: return __builtin_cpu_supports("x86-64-v3");
    case CpuIsa::avx512: return __builtin_cpu_supports("x86-64-v4");
  }
  return false;
#else
  return isa == CpuIsa::baseline;
#endif
}

bool cpu_isa_built(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::baseline: return true;
    case CpuIsa::avx2: return KILN_CPU_ISA_AVX2_BUILT != 0;
    case CpuIsa::avx512: return KILN_CPU_ISA_AVX512_BUILT != 0;
  }
  return false;
}

CpuIsa best_cpu_isa() {
  for (int i = kNumCpuIsas - 1; i > 0; --i) {
    const auto isa = static_cast<CpuIsa>(i);
    if (cpu_supports(isa) && cpu_isa_built(isa)) return isa;
  }
  return CpuIsa::baseline;
}

CpuIsa cpu_isa() { return static_cast<CpuIsa>(detail::cpu_isa_level()); }

void set_cpu_isa(CpuIsa isa) { detail::g_cpu_isa_level.store(static_cast<int>(checked(isa, "set_cpu_isa"))); }

void reset_cpu_isa() { detail::g_cpu_isa_level.store(static_cast<int>(from_environment())); }

std::string cpu_isa_summary() {
  std::string s = std::string(cpu_isa_name(cpu_isa())) + " (best: " + cpu_isa_name(best_cpu_isa()) + "; built:";
  for (int i = 0; i < kNumCpuIsas; ++i)
    if (cpu_isa_built(static_cast<CpuIsa>(i))) s += std::string(" ") + kNames[i];
  s += "; processor:";
  for (int i = 0; i < kNumCpuIsas; ++i)
    if (cpu_supports(static_cast<CpuIsa>(i))) s += std::string(" ") + kNames[i];
  return s + ")";
}

namespace detail {

int resolve_cpu_isa_level() {
  int expected = -1;
  const int level = static_cast<int>(from_environment());
  g_cpu_isa_level.compare_exchange_strong(expected, level);
  return g_cpu_isa_level.load();
}

}  // namespace detail

}  // namespace kiln
