#pragma once
// Shared by the distributed benches (docs/distributed.md, "What is measured"): a bench program
// is both the driver and its ranks. Without RANK in the environment it re-executes itself once
// per rank over loopback (tests/distributed/spawn.h sets RANK, WORLD_SIZE, MASTER_ADDR/PORT and
// OMP_NUM_THREADS=1); with RANK set (its own children, or kiln-run) it is one rank.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "tests/distributed/spawn.h"

namespace kiln::bench::dist {

inline bool is_rank_process() { return std::getenv("RANK") != nullptr; }

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Runs this program as `world` ranks with `args`; returns rank 0's output. Any rank failing
// (including a validation failure) stops the driver: a wrong result is not a measurement.
inline std::string run_ranks(int world, const std::vector<std::string>& args, double deadline_s) {
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) {
    std::fprintf(stderr, "cannot find /proc/self/exe\n");
    std::exit(2);
  }
  self[n] = 0;
  std::vector<std::string> argv{self};
  argv.insert(argv.end(), args.begin(), args.end());
  kiln_test::SpawnOptions opt;
  opt.world_size = world;
  opt.deadline_seconds = deadline_s;
  auto results = kiln_test::spawn_ranks(argv, opt);
  for (const auto& r : results) {
    if (r.exit_code != 0) {
      std::fprintf(stderr, "a rank failed:\n%s", kiln_test::describe(results).c_str());
      std::exit(1);
    }
  }
  return results[0].output;
}

// Median and range of a set of per-round values.
struct Spread {
  double median = 0, lo = 0, hi = 0;
};
inline Spread spread(std::vector<double> v) {
  Spread s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  size_t m = v.size();
  s.median = m % 2 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
  s.lo = v.front();
  s.hi = v.back();
  return s;
}

inline std::string human_bytes(double b) {
  char buf[32];
  if (b >= 1 << 20) std::snprintf(buf, sizeof buf, "%.0f MB", b / (1 << 20));
  else if (b >= 1 << 10) std::snprintf(buf, sizeof buf, "%.0f KB", b / (1 << 10));
  else std::snprintf(buf, sizeof buf, "%.0f B", b);
  return buf;
}

}  // namespace kiln::bench::dist
