#pragma once
// The environment of one rank: kiln-run's own, with the launcher variables that kiln's
// read_launch_env understands (kiln/distributed/store/launch_env.h) set for this rank.
#include <string>
#include <vector>

#include "options.h"

namespace kiln_run {

// "NAME=value" strings for rank `local_rank` of this node, built from `inherited` (environ).
std::vector<std::string> rank_environment(const Options& opt, int local_rank,
                                          const std::vector<std::string>& inherited);

// The OMP_NUM_THREADS a rank gets when none is set: the usable cores shared among the ranks.
int default_omp_threads(int nproc_per_node);

// The current process's environment as "NAME=value" strings.
std::vector<std::string> current_environment();

}  // namespace kiln_run
