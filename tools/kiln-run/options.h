#pragma once
// kiln-run's command line (docs/distributed.md, "kiln-run"): torchrun's spelling, parsed by hand
// so the launcher stays a standalone POSIX program.
#include <stdexcept>
#include <string>
#include <vector>

namespace kiln_run {

struct Options {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool prefix = true;        // "[rank R] " in front of every line of output
  double kill_timeout = 30;  // seconds from SIGTERM to SIGKILL (hidden --kill-timeout)
  bool help = false;
  std::vector<std::string> program;  // PROGRAM ARGS...
};

// A bad command line; main prints the message and exits with status 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws UsageError for an unknown option, a missing or malformed value, or values that do not
// describe a job (N < 1, node-rank >= nnodes, a port outside 1..65535, no program).
Options parse_options(int argc, char** argv);

std::string usage_text();

}  // namespace kiln_run
