// Catch2's main for the CPU test binaries.
//
// KILN_CPU_ISA=level runs every test at that CPU level (kiln/core/cpu_isa.h). A level this
// machine or build lacks exits 77, which CTest shows as skipped; so does the level the default
// run already covers when KILN_TEST_SKIP_BEST_ISA=1 (the per-level runs in tests/CMakeLists.txt).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "kiln/core/cpu_isa.h"
#include "kiln/core/error.h"

int main(int argc, char* argv[]) {
  const char* level = std::getenv("KILN_CPU_ISA");
  if (level && *level && std::string(level) != "auto") {
    kiln::CpuIsa isa;
    try {
      isa = kiln::parse_cpu_isa(level);
    } catch (const kiln::Error& e) {  // a typo in KILN_CPU_ISA: say so, not std::terminate
      std::fprintf(stderr, "%s\n", e.what());
      return 2;
    }
    if (!kiln::cpu_supports(isa) || !kiln::cpu_isa_built(isa)) {
      std::printf("skipped: KILN_CPU_ISA=%s, but this machine or build lacks it (%s)\n", level,
                  kiln::cpu_isa_summary().c_str());
      return 77;
    }
    const char* skip_best = std::getenv("KILN_TEST_SKIP_BEST_ISA");
    if (skip_best && std::string(skip_best) == "1" && isa == kiln::best_cpu_isa()) {
      std::printf("skipped: KILN_CPU_ISA=%s is this machine's best level, which the default run covers\n", level);
      return 77;
    }
    std::printf("CPU level: %s\n", kiln::cpu_isa_summary().c_str());
  }
  return Catch::Session().run(argc, argv);
}
