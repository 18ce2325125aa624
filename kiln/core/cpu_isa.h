#pragma once
// The CPU instruction-set level kiln's CPU kernels run at, chosen when the program runs.
//
// The library is compiled for a portable x86-64 baseline; its CPU kernels are compiled once more
// per level (docs/kernels.md, "One binary, every x86-64"), and each kernel call runs the copy of
// the level in use. That level is, in this order:
//   - set_cpu_isa(level), from the program;
//   - the environment variable KILN_CPU_ISA=auto|baseline|avx2|avx512 (read once, at the first
//     kernel call or query), for tests and A/B runs of whole programs;
//   - otherwise the best level this processor and this build both have.
// Asking for a level the processor lacks, or one this build left out, raises kiln::Error.
//
//   baseline  x86-64 with SSE2: every x86-64 processor
//   avx2      x86-64-v3: AVX2, FMA, F16C, BMI1/2 (Intel Haswell, AMD Zen and later)
//   avx512    x86-64-v4: AVX-512 F/BW/CD/DQ/VL (Intel Skylake-SP, AMD Zen 4 and later)
#include <string>

namespace kiln {

enum class CpuIsa : int { baseline = 0, avx2 = 1, avx512 = 2 };
inline constexpr int kNumCpuIsas = 3;

const char* cpu_isa_name(CpuIsa isa);
// "auto" is not a level; anything but the three names raises kiln::Error.
CpuIsa parse_cpu_isa(const std::string& name);

// The level in use.
CpuIsa cpu_isa();
// Runs every following CPU kernel call at `isa` (kiln::Error if unavailable, see above).
// Meant for tests and benchmarks; not for use while other threads run kernels.
void set_cpu_isa(CpuIsa isa);
// Back to what KILN_CPU_ISA or the processor says.
void reset_cpu_isa();

// Whether this processor (and its operating system, which must save the wider registers) can
// run `isa`.
bool cpu_supports(CpuIsa isa);
// Whether this build holds kernels compiled for `isa` (CMake option KILN_CPU_ISAS).
bool cpu_isa_built(CpuIsa isa);
// The best level both have.
CpuIsa best_cpu_isa();

// "avx512 (best: avx512; built: baseline avx2 avx512)": for logs and reports.
std::string cpu_isa_summary();

}  // namespace kiln
