#include "kiln/core/determinism.h"

#include <atomic>

namespace kiln {

namespace {
std::atomic<bool> g_deterministic{false};
}

void set_deterministic_algorithms(bool on) { g_deterministic.store(on, std::memory_order_relaxed); }
bool deterministic_algorithms() { return g_deterministic.load(std::memory_order_relaxed); }

}  // namespace kiln
