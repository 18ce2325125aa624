#pragma once
// A process group: the ranks that run collectives together, and the backend that moves the bytes
// (docs/distributed.md). kiln has two backends on existing engines:
//   "gloo"  CPU tensors, Gloo's TCP transport (built when the Gloo package is found)
//   "nccl"  CUDA tensors, one NCCL communicator per group on its own stream
// Collectives are issued in the same order on every rank of the group (each gets a sequence
// number); results land in place. Every collective returns a Work; the free functions of
// kiln/distributed/distributed.h wait on it unless asked for async_op.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/core/tensor.h"
#include "kiln/distributed/backends/work.h"

namespace kiln::distributed {

class Store;

enum class ReduceOp { Sum, Avg, Max, Min, Product };
const char* reduce_op_name(ReduceOp op);

struct ProcessGroupOptions {
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // The group ranks known to have exited (init_process_group answers from the store, whose
  // server notices a dead process's connection close). A failed collective names them.
  std::function<std::vector<int>()> exited_ranks;
};

class ProcessGroup {
 public:
  ProcessGroup(int rank, int size) : rank_(rank), size_(size) {}
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual std::string backend_name() const = 0;
  virtual std::chrono::milliseconds timeout() const = 0;

  // Every tensor of a list must be contiguous and on the group's device kind; a list is one
  // coalesced call (one NCCL group, one Gloo operation per tensor in order).
  // In place: each tensor becomes the reduction over ranks of that tensor.
  virtual std::shared_ptr<Work> all_reduce(std::vector<Tensor> tensors, ReduceOp op) = 0;
  // In place: each tensor becomes root's.
  virtual std::shared_ptr<Work> broadcast(std::vector<Tensor> tensors, int root) = 0;
  // outputs[r] receives rank r's input; outputs.size() == size(), each the input's sizes/dtype.
  virtual std::shared_ptr<Work> all_gather(std::vector<Tensor> outputs, Tensor input) = 0;
  // output: size() times input's elements, rank r's input in the r-th slice (ZeRO's gather).
  virtual std::shared_ptr<Work> all_gather_into_tensor(Tensor output, Tensor input) = 0;
  // output = reduction over ranks of inputs[rank()]; inputs.size() == size().
  virtual std::shared_ptr<Work> reduce_scatter(Tensor output, std::vector<Tensor> inputs, ReduceOp op) = 0;
  // input: size() times output's elements; output = reduction of slice rank() (ZeRO's scatter).
  virtual std::shared_ptr<Work> reduce_scatter_tensor(Tensor output, Tensor input, ReduceOp op) = 0;
  virtual std::shared_ptr<Work> barrier() = 0;

  // Stops the backend: pending and later collectives fail with an Error (what a timeout or a
  // dead peer leads to). Idempotent.
  virtual void abort() = 0;

  // The number of collectives issued so far on this group (the next one's sequence number).
  uint64_t sequence_number() const { return seq_; }

 protected:
  // Backends number each collective as they issue it (Work descriptions and errors name it).
  uint64_t next_sequence_number() { return seq_++; }

 private:
  int rank_, size_;
  uint64_t seq_ = 0;
};

// Backends. Each throws kiln::Error when kiln was built without it. `store` is this group's
// namespace in the job's store; every rank of the group calls with the same size.
std::shared_ptr<ProcessGroup> make_gloo_process_group(std::shared_ptr<Store> store, int rank, int size,
                                                      const ProcessGroupOptions& options);
std::shared_ptr<ProcessGroup> make_nccl_process_group(std::shared_ptr<Store> store, int rank, int size,
                                                      const ProcessGroupOptions& options);
bool gloo_available();
// Reads the Gloo backend's settings from the environment (KILN_GLOO_SEGMENT_BYTES) and throws
// kiln::Error on a bad one. init_process_group calls it before any rank connects, so every rank
// fails on its own with that message (rank 0 failing later would take the store from the others).
void check_gloo_environment();
bool nccl_available();

// KILN_DISTRIBUTED_DEBUG=1: wraps `group` so that before each collective the ranks all-gather a
// fingerprint of it (sequence number, op, dtype, sizes, root) and raise an Error naming the ranks
// that disagree instead of running mismatched collectives.
// The fingerprints travel through `store` (this group's namespace), so the check works for every
// backend and never needs the collective it is checking.
std::shared_ptr<ProcessGroup> make_debug_process_group(std::shared_ptr<ProcessGroup> group,
                                                       std::shared_ptr<Store> store);

// For backends: what a collective is about to do, in words and as a fingerprint the debug check
// compares ("all_reduce(Sum) float32 [[4, 3]]"), and the one check of its tensors' layout.
std::string describe_tensors(const std::vector<Tensor>& tensors);
void check_collective_tensors(const char* collective, const std::vector<Tensor>& tensors, DeviceType device_type,
                              const std::string& backend);
// ReduceOp::Avg divides by the group's size, so it takes floating-point tensors only; checked
// before anything is sent, so the ranks stay in step.
void check_reduce_op(const char* collective, ReduceOp op, DType dtype);

// For a failed collective's message: ". Rank 2 has exited (or been killed) in the meantime" when
// `exited_ranks` (ProcessGroupOptions) names ranks within `wait` (a dead rank's store connection
// closes a moment after its sockets), else "".
std::string exited_ranks_hint(const std::function<std::vector<int>()>& exited_ranks,
                              std::chrono::milliseconds wait = std::chrono::seconds(2));

}  // namespace kiln::distributed
