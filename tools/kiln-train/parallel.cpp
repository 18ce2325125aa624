#include "parallel.h"

#include <chrono>
#include <cstdio>
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
             env.world_size == 1 ? " rank" : " ranks",
             ") the gradient all-reduces run inside backward, which a "
             "graph cannot replay yet");
  KILN_CHECK(!o.find_lr, "--find-lr runs on one process; start it without a launcher");
  o.distributed = true;
  o.rank = env.rank;
  o.world_size = env.world_size;
  if (o.device == "cuda") {
    // One GPU per rank on each node, as torchrun's users expect. With more ranks than GPUs the
    // ranks share them round robin, and the "auto" backend gives their CUDA tensors to gloo
    // (docs/distributed.md, "Several ranks on one GPU").
    const int gpus = kiln::cuda::device_count();
    KILN_CHECK(gpus > 0, "--device cuda: no GPU on this node");
    o.cuda_device = env.local_rank % gpus;
    kiln::cuda::set_device(o.cuda_device);
    if (env.local_world_size > gpus && env.rank == 0)
      std::printf(
          "kiln-train: %d ranks per node share %d GPU%s: their gradients are all-reduced over gloo "
          "through pinned host memory (slower than NCCL; docs/distributed.md)\n",
          env.local_world_size, gpus, gpus == 1 ? "" : "s");
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

uint64_t weights_fingerprint(kiln::nn::Module& model) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over every parameter's bytes, in registration order
  for (const kiln::Tensor& p : model.parameters()) {
    const kiln::Tensor c = p.detach().cpu().contiguous();
    const auto* b = static_cast<const unsigned char*>(c.data_ptr());
    for (size_t i = 0; i < c.nbytes(); ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  return h;
}

void check_replicas_identical(const Options& o, kiln::nn::Module& model, const kiln::Device& device) {
  if (!o.distributed || o.world_size <= 1) return;
  const uint64_t mine = weights_fingerprint(model);
  kiln::Tensor t = kiln::full({1}, 0.0, kiln::TensorOptions().dtype(kiln::DType::I64));
  *static_cast<int64_t*>(t.data_ptr()) = static_cast<int64_t>(mine);
  kiln::Tensor all = kiln::empty({o.world_size}, kiln::TensorOptions().dtype(kiln::DType::I64).device(device));
  dist::all_gather_into_tensor(all, t.to(device));
  const kiln::Tensor got = all.cpu();
  const auto* h = static_cast<const int64_t*>(got.data_ptr());
  for (int r = 1; r < o.world_size; ++r)
    KILN_CHECK(h[r] == h[0], "the weights of rank ", r, " differ from rank 0's after training: the ",
               "replicas diverged (a bug in the gradient all-reduce or a rank-dependent update)");
  if (o.rank == 0) std::printf("replicas: the weights of all %d ranks are identical\n", o.world_size);
}

}  // namespace kiln_train
