// The "nccl" group's Works and watchdog (process_group_nccl.h): a collective is done when its end
// event on the NCCL stream is; a communicator error, a stuck collective or abort() fails every
// pending Work and aborts the communicator, so no rank waits forever on a dead peer
// (docs/distributed.md).
#include "kiln/config.h"

#if KILN_WITH_NCCL
#include "kiln/distributed/backends/process_group_nccl.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <exception>
#include <utility>

#include "kiln/cuda/cuda.h"
#include "kiln/core/error.h"
#include "kiln/distributed/backends/process_group.h"

namespace kiln::distributed::nccl {

using Clock = std::chrono::steady_clock;
using ::kiln::detail::concat;

namespace {

// Makes `device` current for a scope without throwing (for teardown paths).
class QuietDeviceScope {
 public:
  explicit QuietDeviceScope(int device) {
    if (cudaGetDevice(&prev_) != cudaSuccess) prev_ = -1;
    if (prev_ != device) cudaSetDevice(device);
  }
  ~QuietDeviceScope() {
    int cur = -1;
    if (prev_ >= 0 && cudaGetDevice(&cur) == cudaSuccess && cur != prev_) cudaSetDevice(prev_);
  }
  QuietDeviceScope(const QuietDeviceScope&) = delete;
  QuietDeviceScope& operator=(const QuietDeviceScope&) = delete;

 private:
  int prev_ = -1;
};

}  // namespace

std::string nccl_error_text(ncclResult_t r, ncclComm_t comm) {
  std::string text = ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last && *last) text += concat(" (", last, ")");
  return text;
}

// ---------------------------------------------------------------- NcclComm

NcclComm::NcclComm(ncclComm_t comm, int rank_, int size_, int device_, Stream stream_,
                   std::chrono::milliseconds timeout_, std::function<std::vector<int>()> exited_ranks)
    : rank(rank_),
      size(size_),
      device(device_),
      stream(stream_),
      timeout(timeout_),
      comm_(comm),
      exited_ranks_(std::move(exited_ranks)) {}

std::string NcclComm::exited_hint() const { return exited_ranks_hint(exited_ranks_); }

NcclComm::~NcclComm() { abort_comm_locked(); }  // a last resort: shutdown() normally ran

std::string NcclComm::where() const { return concat("rank ", rank, " of ", size, " on cuda:", device); }

std::string NcclComm::abort_reason() const {
  std::lock_guard<std::mutex> lk(mu_);
  return abort_reason_;
}

void NcclComm::abort_comm_locked() noexcept {
  if (!comm_) return;
  QuietDeviceScope scope(device);
  // The handle is gone whatever abort returns: nothing else can be done with it.
  (void)ncclCommAbort(comm_);
  comm_ = nullptr;
}

void NcclComm::abort(const std::string& reason) {
  std::vector<std::shared_ptr<NcclWork>> failed;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (abort_requested_.load()) return;
    abort_reason_ = reason;
    abort_requested_.store(true);  // an issuing thread polling NCCL gives up on seeing this
    failed.swap(pending_);
  }
  for (auto& w : failed) w->mark_failed(std::make_exception_ptr(Error(concat(w->description(), " failed: ", reason))));
  {
    std::lock_guard<std::mutex> lk(comm_mu);
    abort_comm_locked();
  }
  // The blocks were recorded on the NCCL stream: the allocator reuses them only after it ran.
  for (auto& w : failed) w->release();
}

void NcclComm::add_pending(const std::shared_ptr<NcclWork>& work) {
  std::string reason;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!abort_requested_.load()) {
      pending_.push_back(work);
      return;
    }
    reason = abort_reason_;
  }
  work->mark_failed(std::make_exception_ptr(Error(concat(work->description(), " failed: ", reason))));
  work->release();
}

void NcclComm::poll() {
  if (aborted()) return;
  // A communicator error first: once aborted, the kernels end early and their events complete,
  // which must not read as success.
  {
    std::unique_lock<std::mutex> lk(comm_mu, std::try_to_lock);
    // Busy: a collective is being issued (it polls NCCL itself); look again next round.
    if (lk.owns_lock() && comm_) {
      ncclResult_t state = ncclSuccess;
      ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess) state = r;
      if (state != ncclSuccess && state != ncclInProgress) {
        std::string text = nccl_error_text(state, comm_);
        lk.unlock();
        abort(concat("NCCL reported ", text, " on ", where(),
                     "; a peer may have died or the network failed, and the communicator was "
                     "aborted",
                     exited_hint()));
        return;
      }
    }
  }

  std::vector<std::shared_ptr<NcclWork>> snapshot;
  {
    std::lock_guard<std::mutex> lk(mu_);
    snapshot = pending_;
  }
  const auto now = Clock::now();
  for (auto& w : snapshot) {
    if (w->is_completed()) continue;
    bool finished = false;
    try {
      finished = w->gpu_done();
    } catch (const std::exception& e) {
      abort(concat("the NCCL stream failed during ", w->description(), " on ", where(), ": ", e.what()));
      return;
    }
    if (finished) {
      w->mark_completed();
    } else if (now - w->started > timeout) {
      abort(concat("timed out: ", w->description(), " did not finish within ", timeout.count(), " ms on ", where(),
                   "; a peer may have died, hung, or issued different collectives, and the "
                   "communicator was aborted",
                   exited_hint()));
      return;
    }
  }

  std::vector<std::shared_ptr<NcclWork>> done;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto split =
        std::stable_partition(pending_.begin(), pending_.end(), [](const auto& w) { return !w->is_completed(); });
    done.assign(split, pending_.end());
    pending_.erase(split, pending_.end());
  }
  for (auto& w : done) w->release();  // outside the lock: frees go to the allocator
}

void NcclComm::shutdown() noexcept {
  const auto deadline = Clock::now() + timeout;
  try {
    // Collectives still in flight finish first (peers expect them); a stuck one aborts.
    for (;;) {
      poll();
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (pending_.empty()) break;
      }
      if (Clock::now() >= deadline) {
        abort(concat("the process group was destroyed on ", where(), " while collectives were still running after ",
                     timeout.count(), " ms"));
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  } catch (...) {
    try {
      abort(concat("the process group was destroyed on ", where(), " after an error"));
    } catch (...) {
    }
  }

  std::lock_guard<std::mutex> lk(comm_mu);
  if (!comm_) return;
  if (aborted()) {
    abort_comm_locked();
    return;
  }
  QuietDeviceScope scope(device);
  // Finalize flushes the communicator's work; on a non-blocking communicator it may return
  // ncclInProgress and is done when the communicator's state leaves it.
  ncclResult_t r = ncclCommFinalize(comm_);
  if (r == ncclSuccess || r == ncclInProgress) {
    auto nap = std::chrono::microseconds(50);
    for (;;) {
      ncclResult_t state = ncclInProgress;
      ncclResult_t q = ncclCommGetAsyncError(comm_, &state);
      r = q != ncclSuccess ? q : state;
      if (r != ncclInProgress || Clock::now() >= deadline) break;
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(2000));
    }
  }
  if (r == ncclSuccess) {
    (void)ncclCommDestroy(comm_);  // frees local resources only once finalized
    comm_ = nullptr;
  } else {
    abort_comm_locked();  // an error or a finalize past the deadline: never hang here
  }
}

// ---------------------------------------------------------------- NcclWork

NcclWork::NcclWork(std::string description, const std::shared_ptr<NcclComm>& comm, bool host_wait)
    : Work(std::move(description)),
      comm_(comm),
      device_(comm->device),
      timeout_(comm->timeout),
      host_wait_(host_wait) {}

void NcclWork::release() {
  std::vector<Tensor> drop;
  {
    std::lock_guard<std::mutex> lk(tensors_mu_);
    drop.swap(tensors);
  }
}

void NcclWork::on_timeout() {
  if (auto comm = comm_.lock())
    comm->abort(concat("timed out: wait() on ", description(), " gave up on ", comm->where(),
                       "; the communicator was aborted", comm->exited_hint()));
}

void NcclWork::host_wait(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  auto nap = std::chrono::microseconds(20);
  while (!is_completed()) {
    bool finished = false;
    try {
      finished = gpu_done();
    } catch (const std::exception& e) {
      std::string reason = concat("the NCCL stream failed: ", e.what());
      mark_failed(std::make_exception_ptr(Error(concat(description(), " failed: ", reason))));
      if (auto comm = comm_.lock()) comm->abort(concat(reason, " (during ", description(), ")"));
      return;
    }
    // A failure marked meanwhile wins over this (the first mark counts): an aborted
    // communicator's events complete too.
    if (finished) {
      mark_completed();
      return;
    }
    if (Clock::now() >= deadline) {
      mark_failed(std::make_exception_ptr(Error(concat(description(), " timed out after ", timeout.count(),
                                                       " ms waiting on the host; the process group was aborted"))));
      on_timeout();
      return;
    }
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(2000));
  }
}

void NcclWork::wait(std::chrono::milliseconds timeout) {
  if (host_wait_ || timeout.count() > 0) host_wait(timeout.count() > 0 ? timeout : timeout_);
  if (std::exception_ptr e = exception()) std::rethrow_exception(e);
  if (is_completed()) return;
  // The usual case: later work on the current stream waits for the collective on the device.
  end.wait(cuda::current_stream(device_));
}

// ---------------------------------------------------------------- Watchdog

Watchdog::Watchdog(std::shared_ptr<NcclComm> comm) : comm_(std::move(comm)) {
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::run() {
  // This thread's event queries and frees go to the group's device.
  (void)cudaSetDevice(comm_->device);
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_) {
    lk.unlock();
    try {
      comm_->poll();
    } catch (const std::exception& e) {
      try {
        comm_->abort(concat("the NCCL watchdog failed on ", comm_->where(), ": ", e.what()));
      } catch (...) {
      }
    } catch (...) {
    }
    lk.lock();
    cv_.wait_for(lk, std::chrono::milliseconds(100), [this] { return stop_; });
  }
}

}  // namespace kiln::distributed::nccl

#endif  // KILN_WITH_NCCL
