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

TEST_CASE("set_cpu_memory_limit: past the cap an allocation is an OutOfMemoryError naming it", "[core][memory]") {
  const size_t live = kiln::cpu_memory_stats().allocated_bytes;
  kiln::Tensor kept = kiln::ones({1000});
  kiln::set_cpu_memory_limit(live + (8u << 20));  // 8 MiB more than what lives now
  CHECK(kiln::cpu_memory_limit() == live + (8u << 20));
  std::string msg;
  bool typed = false;
  try {
    kiln::Tensor big = kiln::empty({4 << 20});  // 16 MiB
  } catch (const kiln::OutOfMemoryError& e) {
    typed = true;
    msg = e.what();
  } catch (const kiln::Error& e) {
    msg = e.what();
  }
  kiln::Tensor fits = kiln::full({1 << 20}, 2.0);  // 4 MiB: under the cap, the next step runs
  kiln::set_cpu_memory_limit(0);
  CHECK(typed);
  CHECK_THAT(msg, Catch::Matchers::Contains("out of memory on cpu: tried to allocate 16777216 bytes") &&
                      Catch::Matchers::Contains("set_cpu_memory_limit"));
  CHECK(fits.sum().item<double>() == 2.0 * (1 << 20));
  CHECK(kept.sum().item<double>() == 1000.0);
  kiln::Tensor big = kiln::empty({4 << 20});  // the cap lifted
  CHECK(big.numel() == 4 << 20);
}
