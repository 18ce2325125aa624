#pragma once
// Internal: the pieces of the "nccl" process group (docs/distributed.md) that its two source files
// share. process_group_nccl.cpp creates the communicator and issues collectives;
// nccl_watchdog.cpp completes, fails and times out their Works and tears the communicator down.
// Only for translation units built with NCCL.
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kiln/cuda/stream.h"
#include "kiln/core/device.h"
#include "kiln/core/tensor.h"
#include "kiln/distributed/backends/work.h"

namespace kiln::distributed::nccl {

class NcclWork;

// "ncclSystemError: <what NCCL last logged>". `comm` may be null (the text is then global).
std::string nccl_error_text(ncclResult_t r, ncclComm_t comm);

// The communicator and the collectives in flight on it. Shared by the group, its watchdog and
// its Works (a Work may outlive the group: it then finds the communicator gone).
//
// Locks: `comm_mu` guards the communicator handle (NCCL communicators are not thread-safe, so
// every call on it holds this lock); `mu` guards `pending` and the aborted state. The issuing
// path takes comm_mu then mu; nothing takes them the other way round.
class NcclComm {
 public:
  NcclComm(ncclComm_t comm, int rank, int size, int device, Stream stream, std::chrono::milliseconds timeout,
           std::function<std::vector<int>()> exited_ranks = {});
  ~NcclComm();  // aborts a communicator that shutdown() did not release
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  const int rank, size, device;
  const Stream stream;  // the NCCL stream (never destroyed: see process_group_nccl.cpp)
  const std::chrono::milliseconds timeout;
  std::string where() const;  // "rank 1 of 4 on cuda:1"
  // ". Rank 2 has exited (or been killed) in the meantime", or "" (exited_ranks_hint).
  std::string exited_hint() const;

  // Fails every pending Work with "<its description> failed: <reason>", then aborts the
  // communicator; later collectives throw. Idempotent (the first reason is kept). Pending Works
  // are failed before ncclCommAbort because the abort ends the NCCL kernels early and their
  // end events then complete although the results are garbage.
  void abort(const std::string& reason);
  bool aborted() const { return abort_requested_.load(); }
  std::string abort_reason() const;

  // Adds a launched collective; fails it at once when the group was aborted meanwhile.
  void add_pending(const std::shared_ptr<NcclWork>& work);

  // One round of the watchdog: async NCCL errors, finished and timed-out Works.
  void poll();

  // For the group's destructor: waits (up to `timeout`) for the pending Works, then releases
  // the communicator: finalize + destroy when everything finished cleanly, abort otherwise.
  // Never throws, never waits past the timeout.
  void shutdown() noexcept;

  // The communicator while it is usable. Call with comm_mu held.
  ncclComm_t handle_locked() const { return comm_; }
  std::mutex comm_mu;

 private:
  void abort_comm_locked() noexcept;  // ncclCommAbort; comm_mu held

  ncclComm_t comm_ = nullptr;  // null once aborted or destroyed
  const std::function<std::vector<int>()> exited_ranks_;
  std::atomic<bool> abort_requested_{false};
  mutable std::mutex mu_;
  std::string abort_reason_;
  std::vector<std::shared_ptr<NcclWork>> pending_;
};

// A collective launched on the NCCL stream. Done when its end event is: the watchdog (or a host
// wait) marks it completed and drops the tensors it kept alive.
class NcclWork final : public Work {
 public:
  NcclWork(std::string description, const std::shared_ptr<NcclComm>& comm, bool host_wait);

  // Orders the current stream of the communicator's device after the collective (no host wait),
  // or waits on the host for a barrier or when an explicit timeout is given. Rethrows a failure.
  void wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) override;

  // Set by the issuing path before the Work is shared.
  cuda::Event end{false};
  std::vector<Tensor> tensors;  // inputs, outputs and scratch buffers, alive until done
  std::chrono::steady_clock::time_point started;

  // The end event finished (throws the CUDA error of a failed stream).
  bool gpu_done() const { return end.query(); }
  // Drops the kept tensors (after completion).
  void release();

 protected:
  void on_timeout() override;
  std::chrono::milliseconds default_timeout() const override { return timeout_; }

 private:
  void host_wait(std::chrono::milliseconds timeout);

  std::weak_ptr<NcclComm> comm_;
  const int device_;
  const std::chrono::milliseconds timeout_;
  const bool host_wait_;
  std::mutex tensors_mu_;
};

// The thread that calls NcclComm::poll about every 100 ms until stopped.
class Watchdog {
 public:
  explicit Watchdog(std::shared_ptr<NcclComm> comm);
  ~Watchdog();  // stops and joins
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  void run();

  std::shared_ptr<NcclComm> comm_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace kiln::distributed::nccl
