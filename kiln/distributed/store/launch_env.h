#pragma once
// Where this process sits in the job, read from the environment its launcher set
// (docs/distributed.md, "Launchers"). Understood, first match wins per field:
//   kiln-run / torchrun:  RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
//   Open MPI's mpirun:    OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
//   MPICH / Intel MPI:    PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS
//   Slurm's srun:         SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE,
//                         and the first host of SLURM_JOB_NODELIST / SLURM_NODELIST as MASTER_ADDR
// MASTER_ADDR defaults to 127.0.0.1 and MASTER_PORT to 29500 when no launcher says.
#include <string>

namespace kiln::distributed {

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string source;  // which launcher's variables were read: "torchrun", "mpirun", "slurm", "none"
};

// Throws kiln::Error naming the variable when one is present but not a valid number, or when
// rank >= world_size.
LaunchEnv read_launch_env();

// True when some launcher's variables say this process is one of several.
bool launched_distributed();

}  // namespace kiln::distributed
