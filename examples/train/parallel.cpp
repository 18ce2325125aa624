#include "parallel.h"

#include <chrono>
#include <cstdlib>

namespace dist = kiln::distributed;

namespace kiln_train {

namespace {
// One rank started by kiln-run or torchrun (RANK and WORLD_SIZE=1 set) also trains under DDP or
// ZeRO-1, as a torchrun script does, which puts one GPU through the multi-rank code path. Other
// launchers' single tasks (an sbatch job, mpirun -n 1) stay plain processes.
bool started_by_launcher() {
  return dist::launched_distributed() || (std::getenv("RANK") && std::getenv("WORLD_SIZE"));
}
}  // namespace

bool init_parallel(Options& o) {
  if (!started_by_launcher()) return false;
  const dist::LaunchEnv env = dist::read_launch_env();
  KILN_CHECK(o.batch_size % env.world_size == 0, "--batch-size ", o.batch_size, " is the global batch; it must ",
             "divide among the ", env.world_size, " ranks");
  KILN_CHECK(!o.cuda_graphs, "--cuda-graphs captures one process's step; under a launcher (", env.world_size,
             env.world_size == 1 ? " rank" : " ranks", ") the gradient all-reduces run inside backward, which a "
             "graph cannot replay yet");
  KILN_CHECK(!o.find_lr, "--find-lr runs on one process; start it without a launcher");
  o.distributed = true;
  o.rank = env.rank;
  o.world_size = env.world_size;
  if (o.device == "cuda") {
    // One GPU per rank on each node, as torchrun's users expect.
    KILN_CHECK(env.local_rank < kiln::cuda::device_count(), "rank ", env.rank, " has LOCAL_RANK ", env.local_rank,
               " but this node has ", kiln::cuda::device_count(), " GPUs; start at most that many ranks per node");
    o.cuda_device = env.local_rank;
    kiln::cuda::set_device(o.cuda_device);
  }
  o.batch_size /= env.world_size;
  dist::init_process_group("auto", std::chrono::milliseconds(static_cast<int64_t>(o.dist_timeout * 1000)));
  return true;
}

void finish_parallel(const Options& o) {
  if (o.distributed) dist::destroy_process_group();
}

int max_over_ranks(const Options& o, int value, const kiln::Device& device) {
  if (o.world_size <= 1) return value;
  kiln::Tensor t = kiln::full({1}, static_cast<double>(value), kiln::TensorOptions().device(device));
  dist::all_reduce(t, dist::ReduceOp::Max);
  return static_cast<int>(t.item<double>());
}

}  // namespace kiln_train
