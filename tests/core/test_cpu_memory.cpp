// The CPU allocator's live/peak byte counters (kiln::cpu_memory_stats).
#include <catch2/catch.hpp>

#include <kiln/kiln.h>

TEST_CASE("cpu_memory_stats follows tensor lifetimes", "[core][memory]") {
  const size_t base = kiln::cpu_memory_stats().allocated_bytes;
  kiln::reset_cpu_peak_memory();
  {
    kiln::Tensor small = kiln::empty({100});      // 400 B: malloc'ed
    kiln::Tensor large = kiln::empty({1 << 20});  // 4 MiB: the large-block cache
    const auto s = kiln::cpu_memory_stats();
    CHECK(s.allocated_bytes >= base + 400 + (4u << 20));
    CHECK(s.peak_allocated_bytes >= s.allocated_bytes);
  }
  const auto after = kiln::cpu_memory_stats();
  CHECK(after.allocated_bytes == base);  // both blocks returned (the large one to the cache)
  CHECK(after.peak_allocated_bytes >= base + (4u << 20));
  CHECK(after.cached_bytes >= (4u << 20));
  kiln::reset_cpu_peak_memory();
  CHECK(kiln::cpu_memory_stats().peak_allocated_bytes == base);
}
