#pragma once
// Sync-debug mode (docs/guide.md, speed-up 7: fewer host-device synchronisations):
// reports every implicit host<->device synchronisation - a blocking copy such as item() or
// to(cpu), a blocking host->device copy from pageable memory, a wait forced by the caching
// allocator - with the call site, so a user can find the syncs hiding in a training step.
// Off by default; Warn prints one report per call site to stderr; Error throws kiln::Error.
// Explicit synchronisation (kiln::cuda::synchronize, Event::synchronize) is never reported.
#include <cstdint>
#include <string>

namespace kiln::cuda {

enum class SyncDebugMode { Off, Warn, Error };

void set_sync_debug_mode(SyncDebugMode mode);
SyncDebugMode sync_debug_mode();

// How many implicit synchronisations the runtime has reported since the process started: every
// report while the mode is Warn or Error counts, the ones printed once per call site and the ones
// thrown alike; Off counts nothing (the runtime does not look for syncs then). Read it before and
// after a training step to count the syncs that step makes. Only the CUDA runtime reports syncs:
// on the CPU, item() reads memory that the CPU kernels have already written, so the count stays 0.
int64_t sync_count();

namespace internal {
// Called by the runtime right before an implicit synchronisation. `what` says which one
// ("device-to-host copy of 4 bytes"). Off: nothing; Warn: prints `what` and the call stack once
// per distinct call site; Error: throws kiln::Error with the same text, unless `may_throw` is
// false (the caching allocator's waits happen inside its bookkeeping: they are always printed).
void report_sync(const std::string& what, bool may_throw = true);
// The call stack of the caller as readable lines (kiln's own runtime frames dropped), for reports.
std::string call_site(int max_frames = 8);
}  // namespace internal

}  // namespace kiln::cuda
