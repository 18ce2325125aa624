#pragma once
// Runs the ranks of this node to the end (docs/distributed.md, "kiln-run"): relays their output,
// forwards SIGINT/SIGTERM/SIGHUP, and stops all of them when one fails.
#include "options.h"

namespace kiln_run {

// How kiln-run itself ends.
struct Outcome {
  int exit_status = 0;  // 0, or the first failing rank's status (128 + signal for a signal)
  int die_by = 0;       // a signal kiln-run received and should end by (when no rank failed first)
};

// Starts the ranks and returns once every one has been reaped and its output written.
Outcome supervise(const Options& opt);

}  // namespace kiln_run
