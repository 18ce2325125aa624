#pragma once
// kiln::distributed: torch.distributed's API over kiln's process groups (docs/distributed.md).
//
//   // started by kiln-run (or torchrun, mpirun, srun: kiln/distributed/store/launch_env.h)
//   kiln::distributed::init_process_group();             // "auto": gloo for CPU, nccl for CUDA
//   auto t = kiln::ones({4});
//   kiln::distributed::all_reduce(t);                     // every rank: 4 x world_size()
//   auto work = kiln::distributed::all_reduce(t, ReduceOp::Avg, /*async_op=*/true);
//   work->wait();
//   kiln::distributed::destroy_process_group();
//
// Collectives take contiguous tensors, change them in place, and must be called in the same
// order by every rank of the group. A dead peer, a rank that never joins or a timeout is a
// kiln::Error naming the collective and the ranks involved, never a hang.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "kiln/core/tensor.h"
#include "kiln/distributed/backends/process_group.h"
#include "kiln/distributed/backends/work.h"

namespace kiln::distributed {

class Store;
using Group = std::shared_ptr<ProcessGroup>;  // null: the default group

struct InitOptions {
  // "auto" (gloo for CPU tensors plus nccl for CUDA tensors when a GPU and NCCL are present),
  // "gloo", "nccl", or "gloo,nccl".
  std::string backend = "auto";
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // -1: from the environment (read_launch_env()).
  int rank = -1;
  int world_size = -1;
  // Null: a TCPStore on MASTER_ADDR:MASTER_PORT, hosted by rank 0.
  std::shared_ptr<Store> store;
};

// Joins the job: connects to (or, on rank 0, hosts) the store, waits until every rank arrived
// (an Error naming the ranks that did not within the timeout), and builds the default group.
void init_process_group(const InitOptions& options = {});
void init_process_group(const std::string& backend, std::chrono::milliseconds timeout = std::chrono::seconds(300));
// Waits for in-flight collectives of this process, then tears every group down. Safe to call
// when not initialized.
void destroy_process_group();
bool is_initialized();
int rank(const Group& group = nullptr);
int world_size(const Group& group = nullptr);
std::string backend_name(const Group& group = nullptr);
// The default group (throws kiln::Error when init_process_group was not called).
Group default_group();
// The job's store (for tools that need their own keys).
std::shared_ptr<Store> default_store();

// A group of some ranks of the default group. Every rank of the job calls it with the same list
// (as in PyTorch); a rank not in `ranks` gets a group whose collectives throw kiln::Error.
Group new_group(const std::vector<int>& ranks, const std::string& backend = "",
                std::chrono::milliseconds timeout = std::chrono::milliseconds(0));

// ---- collectives. With async_op the call returns at once and the caller waits on the Work;
// without it the call returns when the result is there (and the returned Work is completed).
std::shared_ptr<Work> all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::Sum, bool async_op = false,
                                 const Group& group = nullptr);
std::shared_ptr<Work> all_reduce_coalesced(const std::vector<Tensor>& tensors, ReduceOp op = ReduceOp::Sum,
                                           bool async_op = false, const Group& group = nullptr);
std::shared_ptr<Work> broadcast(const Tensor& tensor, int src, bool async_op = false, const Group& group = nullptr);
std::shared_ptr<Work> broadcast_coalesced(const std::vector<Tensor>& tensors, int src, bool async_op = false,
                                          const Group& group = nullptr);
// outputs: world_size tensors shaped as `input` (allocated here when the vector is empty).
std::shared_ptr<Work> all_gather(std::vector<Tensor>& outputs, const Tensor& input, bool async_op = false,
                                 const Group& group = nullptr);
std::shared_ptr<Work> all_gather_into_tensor(const Tensor& output, const Tensor& input, bool async_op = false,
                                             const Group& group = nullptr);
std::shared_ptr<Work> reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs,
                                     ReduceOp op = ReduceOp::Sum, bool async_op = false, const Group& group = nullptr);
std::shared_ptr<Work> reduce_scatter_tensor(const Tensor& output, const Tensor& input, ReduceOp op = ReduceOp::Sum,
                                            bool async_op = false, const Group& group = nullptr);
std::shared_ptr<Work> barrier(bool async_op = false, const Group& group = nullptr);

}  // namespace kiln::distributed
