// read_launch_env: this process's rank, world size and rendezvous address from whichever
// launcher started it (the variables each one sets are listed in launch_env.h).
#include "kiln/distributed/store/launch_env.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/distributed/store/parse_int.h"

namespace kiln::distributed {

namespace {

// The launchers in the order they are consulted; a field takes the first variable that is set.
struct Launcher {
  const char* name;
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* local_world_size;
};

constexpr Launcher kLaunchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"mpirun", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
};

const char* get(const char* name) { return std::getenv(name); }

// The integer in `name`, which must be >= `min`; throws naming the variable otherwise.
int read_int(const char* name, long long min) {
  std::string s = get(name);
  auto v = parse_int(s);
  KILN_CHECK(v && *v >= min && *v <= (1 << 30), "distributed: the environment variable ", name, "='", s, "' is not ",
             min == 0 ? "a non-negative" : "a positive", " integer (set by the launcher, or by hand?)");
  return static_cast<int>(*v);
}

// Reads one field from the first launcher that sets it; `var` names the variable used.
template <class Field> bool read_field(Field field, long long min, int* out, const char** var) {
  for (const Launcher& l : kLaunchers) {
    const char* name = l.*field;
    if (get(name)) {
      *out = read_int(name, min);
      *var = name;
      return true;
    }
  }
  return false;
}

// The first host of a Slurm node list: "node[03-05,07],gpu1" -> "node03", "a[1-2]-ib[4-5]" ->
// "a1-ib4". Commas inside brackets separate ranges, outside them hosts.
std::string first_slurm_host(const std::string& nodelist) {
  std::string host;
  bool in_bracket = false, took_range = false;
  for (char c : nodelist) {
    if (in_bracket) {
      if (c == ']') {
        in_bracket = false;
      } else if (c == ',' || c == '-') {
        took_range = true;  // the first number of the first range is the first host
      } else if (!took_range) {
        host += c;
      }
    } else if (c == '[') {
      in_bracket = true;
      took_range = false;
    } else if (c == ',' || c == ' ') {
      break;
    } else {
      host += c;
    }
  }
  return host;
}

}  // namespace

LaunchEnv read_launch_env() {
  LaunchEnv env;
  const char* rank_var = nullptr;
  const char* world_var = nullptr;
  const char* local_var = nullptr;
  const char* local_world_var = nullptr;
  read_field(&Launcher::rank, 0, &env.rank, &rank_var);
  read_field(&Launcher::world_size, 1, &env.world_size, &world_var);
  read_field(&Launcher::local_rank, 0, &env.local_rank, &local_var);
  read_field(&Launcher::local_world_size, 1, &env.local_world_size, &local_world_var);
  // A rank started by hand may name its local rank without the local world size (torch does not
  // read it): take the whole world as local, the same answer on every rank.
  if (!local_world_var && local_var) env.local_world_size = env.world_size;

  env.source = "none";
  for (const Launcher& l : kLaunchers) {
    if (get(l.rank) || get(l.world_size)) {
      env.source = l.name;
      break;
    }
  }

  KILN_CHECK(env.rank < env.world_size, "distributed: ", rank_var ? rank_var : "the rank", "=", env.rank,
             " is not below ", world_var ? world_var : "the world size (unset: 1)", "=", env.world_size,
             " (ranks count from 0)");
  KILN_CHECK(env.local_rank < env.local_world_size, "distributed: ", local_var ? local_var : "the local rank", "=",
             env.local_rank, " is not below ",
             local_world_var ? local_world_var : "the local world size (unset: the world size)", "=",
             env.local_world_size);

  if (const char* addr = get("MASTER_ADDR"); addr && *addr) {
    env.master_addr = addr;
  } else {
    for (const char* name : {"SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
      const char* list = get(name);
      if (!list || !*list) continue;
      std::string host = first_slurm_host(list);
      KILN_CHECK(!host.empty(), "distributed: cannot read a host name from ", name, "='", list, "'");
      env.master_addr = host;
      break;
    }
  }
  if (get("MASTER_PORT")) {
    env.master_port = read_int("MASTER_PORT", 1);
    KILN_CHECK(env.master_port <= 65535, "distributed: the environment variable MASTER_PORT='", get("MASTER_PORT"),
               "' is not a TCP port (1..65535)");
  }
  return env;
}

bool launched_distributed() {
  for (const Launcher& l : kLaunchers) {
    const char* s = get(l.world_size);
    if (!s) continue;
    auto v = parse_int(s);
    if (v && *v > 1) return true;
  }
  return false;
}

}  // namespace kiln::distributed
