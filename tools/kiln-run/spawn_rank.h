#pragma once
// Starts one rank: fork, then exec of the program (looked up in PATH, as execvp does) in a
// process group of its own, with stdin from /dev/null and stdout/stderr into pipes kiln-run reads.
#include <sys/types.h>

#include <string>
#include <vector>

namespace kiln_run {

struct RankProcess {
  pid_t pid = -1;   // also the id of the rank's process group
  int out_fd = -1;  // read ends, non-blocking
  int err_fd = -1;
};

// The exit status of a rank whose program could not be exec'd (as a shell's "command not found").
constexpr int kExecFailedStatus = 127;

// Throws std::runtime_error when the pipes or the fork fail. A program that cannot be exec'd
// is not an error here: that rank prints why on its stderr and exits with kExecFailedStatus.
RankProcess spawn_rank(const std::vector<std::string>& argv, const std::vector<std::string>& env);

}  // namespace kiln_run
