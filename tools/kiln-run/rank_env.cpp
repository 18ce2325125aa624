#include "rank_env.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

extern char** environ;

namespace kiln_run {
namespace {

bool starts_with(const std::string& s, const char* prefix) {
  return s.compare(0, std::char_traits<char>::length(prefix), prefix) == 0;
}

// Variables by which another launcher (mpirun, MPICH's hydra, srun) says which process this is.
// kiln-run may itself run under one of them (one kiln-run per node); the ranks it starts must
// not look like that one process, so these go. Job-wide ones (SLURM_JOB_NODELIST, ...) stay.
bool names_another_launchers_rank(const std::string& kv) {
  return starts_with(kv, "OMPI_COMM_WORLD_") || starts_with(kv, "PMI_") || starts_with(kv, "MPI_LOCALRANKID=") ||
         starts_with(kv, "MPI_LOCALNRANKS=") || starts_with(kv, "SLURM_PROCID=") || starts_with(kv, "SLURM_LOCALID=");
}

std::string name_of(const std::string& kv) { return kv.substr(0, kv.find('=')); }

}  // namespace

std::vector<std::string> current_environment() {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  return env;
}

int default_omp_threads(int nproc_per_node) {
  // The cores this process may run on (taskset, cgroup cpusets), not the machine's total.
  int cores = 0;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) cores = CPU_COUNT(&set);
  if (cores <= 0) cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, cores / std::max(1, nproc_per_node));
}

std::vector<std::string> rank_environment(const Options& opt, int local_rank,
                                          const std::vector<std::string>& inherited) {
  const int rank = opt.node_rank * opt.nproc_per_node + local_rank;
  const std::vector<std::pair<std::string, std::string>> ours = {
      {"RANK", std::to_string(rank)},
      {"WORLD_SIZE", std::to_string(opt.nnodes * opt.nproc_per_node)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(opt.nproc_per_node)},
      {"GROUP_RANK", std::to_string(opt.node_rank)},
      {"MASTER_ADDR", opt.master_addr},
      {"MASTER_PORT", std::to_string(opt.master_port)},
  };

  std::vector<std::string> env;
  bool omp_set = false;
  for (const auto& kv : inherited) {
    if (names_another_launchers_rank(kv)) continue;
    const std::string name = name_of(kv);
    if (std::any_of(ours.begin(), ours.end(), [&](const auto& p) { return p.first == name; })) {
      continue;
    }
    omp_set = omp_set || name == "OMP_NUM_THREADS";
    env.push_back(kv);
  }
  for (const auto& [name, value] : ours) env.push_back(name + "=" + value);

  // torchrun sets 1, which keeps N ranks from oversubscribing the cores but leaves CPU-only
  // training (kiln's CPU kernels run on OpenMP) N-times slower than it needs to be. Sharing the
  // cores evenly among the ranks avoids both. A value the user set is theirs and stays.
  if (!omp_set) env.push_back("OMP_NUM_THREADS=" + std::to_string(default_omp_threads(opt.nproc_per_node)));
  return env;
}

}  // namespace kiln_run
