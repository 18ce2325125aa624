#pragma once
// The handle of an asynchronous collective (torch.distributed's Work): collectives called with
// async_op return one; the synchronous forms wait on it before returning.
//
// A Work that failed (a peer died, the backend timed out, the communicator was aborted) holds a
// kiln::Error that names the collective, its sequence number in the group and, where known, the
// peer; wait() rethrows it. wait(timeout) never blocks longer than the timeout: when it passes,
// the Work is marked failed with an Error saying so and the process group is aborted, since a
// collective that is half done leaves every later one undefined.
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace kiln::distributed {

class Work {
 public:
  explicit Work(std::string description) : description_(std::move(description)) {}
  virtual ~Work() = default;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // Non-blocking.
  virtual bool is_completed() const;  // NCCL queries its end event
  bool is_success() const;            // completed without an error
  // The error, when it failed (null otherwise).
  std::exception_ptr exception() const;

  // Blocks until done. For CUDA tensors, "done" means the result is ordered before any later
  // work on the current stream (the host may return before the GPU finished, as in PyTorch).
  // Throws the collective's kiln::Error; throws one naming this collective after `timeout`
  // (zero: the process group's timeout).
  virtual void wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(0));

  // "all_reduce #12 (Sum, f32, 1 tensor, 262144 elements) on gloo group of 4 ranks".
  const std::string& description() const { return description_; }

  // Runs `fn` once the work has succeeded, before wait() returns anywhere: on the thread that
  // completes it (the backend's worker for gloo, the watchdog for NCCL - so fn must not launch
  // device work), or at once on this thread when it already has. A throwing fn fails the work
  // with its error; fn is dropped when the work fails.
  void then(std::function<void()> fn);

  // For backends: finish the work (after running the then() callbacks). Thread-safe; the
  // first call wins.
  void mark_completed();
  void mark_failed(std::exception_ptr error);
  // Waits for completion on the host (up to `timeout`); returns false on timeout.
  bool wait_completed(std::chrono::milliseconds timeout) const;

 protected:
  // Called by wait() when `timeout` passed (backends abort their communicator here).
  virtual void on_timeout() {}
  // The timeout used by wait() when none is given.
  virtual std::chrono::milliseconds default_timeout() const { return std::chrono::minutes(5); }

 private:
  std::string description_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  std::vector<std::function<void()>> callbacks_;
};

}  // namespace kiln::distributed
