// read_launch_env / launched_distributed (kiln/distributed/store/launch_env.h): each launcher's
// variables, the per-field precedence, Slurm node lists, defaults, and bad values as errors that
// name the variable. Every case starts from an environment without launcher variables and puts
// the test process's own environment back afterwards.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "kiln/core/error.h"
#include "kiln/distributed/store/launch_env.h"

using Catch::Matchers::Contains;
using kiln::distributed::launched_distributed;
using kiln::distributed::LaunchEnv;
using kiln::distributed::read_launch_env;

namespace {

const char* const kVars[] = {"RANK",
                             "WORLD_SIZE",
                             "LOCAL_RANK",
                             "LOCAL_WORLD_SIZE",
                             "MASTER_ADDR",
                             "MASTER_PORT",
                             "OMPI_COMM_WORLD_RANK",
                             "OMPI_COMM_WORLD_SIZE",
                             "OMPI_COMM_WORLD_LOCAL_RANK",
                             "OMPI_COMM_WORLD_LOCAL_SIZE",
                             "PMI_RANK",
                             "PMI_SIZE",
                             "MPI_LOCALRANKID",
                             "MPI_LOCALNRANKS",
                             "SLURM_PROCID",
                             "SLURM_NTASKS",
                             "SLURM_LOCALID",
                             "SLURM_NTASKS_PER_NODE",
                             "SLURM_JOB_NODELIST",
                             "SLURM_NODELIST"};

// (name, value) pairs of environment variables.
using Vars = std::initializer_list<std::pair<const char*, std::string>>;

// Clears every launcher variable for the test's lifetime, then restores what was there.
class CleanEnv {
 public:
  CleanEnv() {
    for (const char* v : kVars) {
      const char* old = std::getenv(v);
      saved_[v] = old ? std::optional<std::string>(old) : std::nullopt;
      ::unsetenv(v);
    }
  }
  ~CleanEnv() {
    for (const auto& [k, v] : saved_) {
      if (v) {
        ::setenv(k.c_str(), v->c_str(), 1);
      } else {
        ::unsetenv(k.c_str());
      }
    }
  }
  void set(const char* name, const std::string& value) { ::setenv(name, value.c_str(), 1); }
  void set(Vars vars) {
    for (const auto& [name, value] : vars) set(name, value);
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

std::string error_of_read() {
  try {
    read_launch_env();
  } catch (const kiln::Error& e) {
    return e.what();
  }
  return "";
}

// error_of_read() in an environment where of the launcher variables only `vars` are set.
std::string error_with(Vars vars) {
  CleanEnv env;
  env.set(vars);
  return error_of_read();
}

// CHECKs every field of `e` against `want`.
void check_env(const LaunchEnv& e, const LaunchEnv& want) {
  CHECK(e.rank == want.rank);
  CHECK(e.world_size == want.world_size);
  CHECK(e.local_rank == want.local_rank);
  CHECK(e.local_world_size == want.local_world_size);
  CHECK(e.master_addr == want.master_addr);
  CHECK(e.master_port == want.master_port);
  CHECK(e.source == want.source);
}

// Sets `vars` in `env`, then CHECKs read_launch_env() against `want` and that the launch counts
// as distributed.
void check_launch(CleanEnv& env, Vars vars, const LaunchEnv& want) {
  env.set(vars);
  check_env(read_launch_env(), want);
  CHECK(launched_distributed());
}

}  // namespace

// The expected LaunchEnvs below list rank, world_size, local_rank, local_world_size,
// master_addr, master_port, source.

TEST_CASE("launch env: defaults when no launcher set anything") {
  CleanEnv env;
  check_env(read_launch_env(), {0, 1, 0, 1, "127.0.0.1", 29500, "none"});
  CHECK_FALSE(launched_distributed());
}

TEST_CASE("launch env: torchrun / kiln-run variables") {
  CleanEnv env;
  check_launch(env,
               {{"RANK", "5"},
                {"WORLD_SIZE", "8"},
                {"LOCAL_RANK", "1"},
                {"LOCAL_WORLD_SIZE", "4"},
                {"MASTER_ADDR", "node07"},
                {"MASTER_PORT", "12345"}},
               {5, 8, 1, 4, "node07", 12345, "torchrun"});

  // one process launched by torchrun is not distributed
  env.set({{"RANK", "0"}, {"WORLD_SIZE", "1"}});
  CHECK_FALSE(launched_distributed());
  CHECK(read_launch_env().source == "torchrun");
}

TEST_CASE("launch env: ranks started by hand without LOCAL_WORLD_SIZE") {
  CleanEnv env;
  // as under torch: the local world is taken to be the whole world, on every rank alike
  env.set({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}});
  LaunchEnv e = read_launch_env();
  CHECK(e.local_rank == 1);
  CHECK(e.local_world_size == 2);
  env.set({{"RANK", "0"}, {"LOCAL_RANK", "0"}});
  CHECK(read_launch_env().local_world_size == 2);
}

TEST_CASE("launch env: Open MPI's mpirun") {
  CleanEnv env;
  check_launch(env,
               {{"OMPI_COMM_WORLD_RANK", "3"},
                {"OMPI_COMM_WORLD_SIZE", "4"},
                {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                {"MASTER_ADDR", "10.1.2.3"}},
               {3, 4, 1, 2, "10.1.2.3", 29500, "mpirun"});
}

TEST_CASE("launch env: MPICH / Intel MPI (PMI)") {
  CleanEnv env;
  check_launch(env, {{"PMI_RANK", "2"}, {"PMI_SIZE", "3"}, {"MPI_LOCALRANKID", "0"}, {"MPI_LOCALNRANKS", "1"}},
               {2, 3, 0, 1, "127.0.0.1", 29500, "mpirun"});
}

TEST_CASE("launch env: Slurm's srun, MASTER_ADDR from the first host of the node list") {
  CleanEnv env;
  check_launch(env,
               {{"SLURM_PROCID", "6"},
                {"SLURM_NTASKS", "8"},
                {"SLURM_LOCALID", "2"},
                {"SLURM_NTASKS_PER_NODE", "4"},
                {"SLURM_JOB_NODELIST", "node[03-05,07],gpu1"}},
               {6, 8, 2, 4, "node03", 29500, "slurm"});

  const std::pair<const char*, const char*> lists[] = {
      {"gpu1,node[1-2]", "gpu1"}, {"single", "single"},
      {"node[7,9-10]", "node7"},  {"rack[2-3]-n[011-012]", "rack2-n011"},
      {"a-b[1-2]-ib", "a-b1-ib"},
  };
  for (const auto& [list, first] : lists) {
    env.set("SLURM_JOB_NODELIST", list);
    INFO(list);
    CHECK(read_launch_env().master_addr == first);
  }
  // the older variable name when the job one is absent; MASTER_ADDR wins over both
  ::unsetenv("SLURM_JOB_NODELIST");
  env.set("SLURM_NODELIST", "old[5-6]");
  CHECK(read_launch_env().master_addr == "old5");
  env.set("MASTER_ADDR", "explicit");
  CHECK(read_launch_env().master_addr == "explicit");
}

TEST_CASE("launch env: the first launcher wins per field") {
  CleanEnv env;
  // torchrun inside a Slurm allocation: torchrun's values, Slurm's node list for the address
  env.set({{"RANK", "1"},
           {"WORLD_SIZE", "2"},
           {"SLURM_PROCID", "0"},
           {"SLURM_NTASKS", "1"},
           {"SLURM_LOCALID", "0"},
           {"SLURM_NTASKS_PER_NODE", "3"},
           {"SLURM_JOB_NODELIST", "head[1-4]"}});
  // local rank and local world size from SLURM_LOCALID and SLURM_NTASKS_PER_NODE: torchrun set
  // neither
  check_env(read_launch_env(), {1, 2, 0, 3, "head1", 29500, "torchrun"});
  CHECK(launched_distributed());  // WORLD_SIZE says 2
}

TEST_CASE("launch env: bad values are errors naming the variable") {
  CHECK_THAT(error_with({{"RANK", "two"}}), Contains("RANK='two'"));
  CHECK_THAT(error_with({{"WORLD_SIZE", "0"}}), Contains("WORLD_SIZE='0'"));
  {
    CleanEnv env;
    env.set("OMPI_COMM_WORLD_SIZE", "4x");
    CHECK_THAT(error_of_read(), Contains("OMPI_COMM_WORLD_SIZE='4x'"));
    CHECK_FALSE(launched_distributed());  // an unreadable size says nothing
  }
  CHECK_THAT(error_with({{"LOCAL_RANK", "-1"}}), Contains("LOCAL_RANK='-1'"));
  CHECK_THAT(error_with({{"SLURM_NTASKS", ""}}), Contains("SLURM_NTASKS=''"));
  CHECK_THAT(error_with({{"RANK", "99999999999999999999"}}), Contains("RANK="));
  for (const char* port : {"http", "70000", "0"}) {
    CHECK_THAT(error_with({{"MASTER_PORT", port}}), Contains("MASTER_PORT='" + std::string(port) + "'"));
  }
  CHECK_THAT(error_with({{"RANK", "4"}, {"WORLD_SIZE", "4"}}), Contains("RANK=4 is not below WORLD_SIZE=4"));
  // no size anywhere: the world of one has no rank 1
  CHECK_THAT(error_with({{"PMI_RANK", "1"}}), Contains("PMI_RANK=1 is not below"));
  CHECK_THAT(error_with({{"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}}),
             Contains("LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"));
}
