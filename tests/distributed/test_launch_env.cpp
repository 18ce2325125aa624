// read_launch_env / launched_distributed (kiln/distributed/launch_env.h): each launcher's
// variables, the per-field precedence, Slurm node lists, defaults, and bad values as errors that
// name the variable. Every case starts from an environment without launcher variables and puts
// the test process's own environment back afterwards.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "kiln/core/error.h"
#include "kiln/distributed/launch_env.h"

using kiln::distributed::launched_distributed;
using kiln::distributed::LaunchEnv;
using kiln::distributed::read_launch_env;
using Catch::Matchers::Contains;

namespace {

const char* const kVars[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE",
    "SLURM_JOB_NODELIST", "SLURM_NODELIST"};

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

}  // namespace

TEST_CASE("launch env: defaults when no launcher set anything") {
  CleanEnv env;
  LaunchEnv e = read_launch_env();
  CHECK(e.rank == 0);
  CHECK(e.world_size == 1);
  CHECK(e.local_rank == 0);
  CHECK(e.local_world_size == 1);
  CHECK(e.master_addr == "127.0.0.1");
  CHECK(e.master_port == 29500);
  CHECK(e.source == "none");
  CHECK_FALSE(launched_distributed());
}

TEST_CASE("launch env: torchrun / kiln-run variables") {
  CleanEnv env;
  env.set("RANK", "5");
  env.set("WORLD_SIZE", "8");
  env.set("LOCAL_RANK", "1");
  env.set("LOCAL_WORLD_SIZE", "4");
  env.set("MASTER_ADDR", "node07");
  env.set("MASTER_PORT", "12345");
  LaunchEnv e = read_launch_env();
  CHECK(e.rank == 5);
  CHECK(e.world_size == 8);
  CHECK(e.local_rank == 1);
  CHECK(e.local_world_size == 4);
  CHECK(e.master_addr == "node07");
  CHECK(e.master_port == 12345);
  CHECK(e.source == "torchrun");
  CHECK(launched_distributed());

  // one process launched by torchrun is not distributed
  env.set("RANK", "0");
  env.set("WORLD_SIZE", "1");
  CHECK_FALSE(launched_distributed());
  CHECK(read_launch_env().source == "torchrun");
}

TEST_CASE("launch env: Open MPI's mpirun") {
  CleanEnv env;
  env.set("OMPI_COMM_WORLD_RANK", "3");
  env.set("OMPI_COMM_WORLD_SIZE", "4");
  env.set("OMPI_COMM_WORLD_LOCAL_RANK", "1");
  env.set("OMPI_COMM_WORLD_LOCAL_SIZE", "2");
  env.set("MASTER_ADDR", "10.1.2.3");
  LaunchEnv e = read_launch_env();
  CHECK(e.rank == 3);
  CHECK(e.world_size == 4);
  CHECK(e.local_rank == 1);
  CHECK(e.local_world_size == 2);
  CHECK(e.master_addr == "10.1.2.3");
  CHECK(e.master_port == 29500);
  CHECK(e.source == "mpirun");
  CHECK(launched_distributed());
}

TEST_CASE("launch env: MPICH / Intel MPI (PMI)") {
  CleanEnv env;
  env.set("PMI_RANK", "2");
  env.set("PMI_SIZE", "3");
  env.set("MPI_LOCALRANKID", "0");
  env.set("MPI_LOCALNRANKS", "1");
  LaunchEnv e = read_launch_env();
  CHECK(e.rank == 2);
  CHECK(e.world_size == 3);
  CHECK(e.local_rank == 0);
  CHECK(e.local_world_size == 1);
  CHECK(e.master_addr == "127.0.0.1");
  CHECK(e.source == "mpirun");
  CHECK(launched_distributed());
}

TEST_CASE("launch env: Slurm's srun, MASTER_ADDR from the first host of the node list") {
  CleanEnv env;
  env.set("SLURM_PROCID", "6");
  env.set("SLURM_NTASKS", "8");
  env.set("SLURM_LOCALID", "2");
  env.set("SLURM_NTASKS_PER_NODE", "4");
  env.set("SLURM_JOB_NODELIST", "node[03-05,07],gpu1");
  LaunchEnv e = read_launch_env();
  CHECK(e.rank == 6);
  CHECK(e.world_size == 8);
  CHECK(e.local_rank == 2);
  CHECK(e.local_world_size == 4);
  CHECK(e.master_addr == "node03");
  CHECK(e.master_port == 29500);
  CHECK(e.source == "slurm");
  CHECK(launched_distributed());

  const std::pair<const char*, const char*> lists[] = {
      {"gpu1,node[1-2]", "gpu1"},
      {"single", "single"},
      {"node[7,9-10]", "node7"},
      {"rack[2-3]-n[011-012]", "rack2-n011"},
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
  env.set("RANK", "1");
  env.set("WORLD_SIZE", "2");
  env.set("SLURM_PROCID", "0");
  env.set("SLURM_NTASKS", "1");
  env.set("SLURM_LOCALID", "0");
  env.set("SLURM_NTASKS_PER_NODE", "3");
  env.set("SLURM_JOB_NODELIST", "head[1-4]");
  LaunchEnv e = read_launch_env();
  CHECK(e.rank == 1);
  CHECK(e.world_size == 2);
  CHECK(e.local_rank == 0);          // SLURM_LOCALID: torchrun set none
  CHECK(e.local_world_size == 3);    // SLURM_NTASKS_PER_NODE
  CHECK(e.master_addr == "head1");
  CHECK(e.source == "torchrun");
  CHECK(launched_distributed());     // WORLD_SIZE says 2
}

TEST_CASE("launch env: bad values are errors naming the variable") {
  {
    CleanEnv env;
    env.set("RANK", "two");
    CHECK_THAT(error_of_read(), Contains("RANK='two'"));
  }
  {
    CleanEnv env;
    env.set("WORLD_SIZE", "0");
    CHECK_THAT(error_of_read(), Contains("WORLD_SIZE='0'"));
  }
  {
    CleanEnv env;
    env.set("OMPI_COMM_WORLD_SIZE", "4x");
    CHECK_THAT(error_of_read(), Contains("OMPI_COMM_WORLD_SIZE='4x'"));
    CHECK_FALSE(launched_distributed());  // an unreadable size says nothing
  }
  {
    CleanEnv env;
    env.set("LOCAL_RANK", "-1");
    CHECK_THAT(error_of_read(), Contains("LOCAL_RANK='-1'"));
  }
  {
    CleanEnv env;
    env.set("SLURM_NTASKS", "");
    CHECK_THAT(error_of_read(), Contains("SLURM_NTASKS=''"));
  }
  {
    CleanEnv env;
    env.set("RANK", "99999999999999999999");
    CHECK_THAT(error_of_read(), Contains("RANK="));
  }
  {
    CleanEnv env;
    env.set("MASTER_PORT", "http");
    CHECK_THAT(error_of_read(), Contains("MASTER_PORT='http'"));
    env.set("MASTER_PORT", "70000");
    CHECK_THAT(error_of_read(), Contains("MASTER_PORT='70000'"));
    env.set("MASTER_PORT", "0");
    CHECK_THAT(error_of_read(), Contains("MASTER_PORT='0'"));
  }
  {
    CleanEnv env;
    env.set("RANK", "4");
    env.set("WORLD_SIZE", "4");
    CHECK_THAT(error_of_read(), Contains("RANK=4 is not below WORLD_SIZE=4"));
  }
  {
    CleanEnv env;
    env.set("PMI_RANK", "1");  // no size anywhere: the world of one has no rank 1
    CHECK_THAT(error_of_read(), Contains("PMI_RANK=1 is not below"));
  }
  {
    CleanEnv env;
    env.set("LOCAL_RANK", "2");
    env.set("LOCAL_WORLD_SIZE", "2");
    CHECK_THAT(error_of_read(), Contains("LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"));
  }
}
