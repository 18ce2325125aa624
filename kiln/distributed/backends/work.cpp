#include "kiln/distributed/backends/work.h"

#include "kiln/core/error.h"

namespace kiln::distributed {

bool Work::is_completed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

bool Work::is_success() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_ && !error_;
}

std::exception_ptr Work::exception() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void Work::then(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_) {
      callbacks_.push_back(std::move(fn));
      return;
    }
    if (error_) return;
  }
  fn();
}

void Work::mark_completed() {
  // Callbacks run outside the lock (they may take long, and may call then() themselves); the
  // work is done only once none is left, so wait() never returns before they ran.
  for (;;) {
    std::vector<std::function<void()>> batch;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (done_) return;
      if (callbacks_.empty()) {
        done_ = true;
        break;
      }
      batch.swap(callbacks_);
    }
    try {
      for (auto& fn : batch) fn();
    } catch (...) {
      mark_failed(std::current_exception());
      return;
    }
  }
  cv_.notify_all();
}

void Work::mark_failed(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    done_ = true;
    error_ = std::move(error);
    callbacks_.clear();
  }
  cv_.notify_all();
}

bool Work::wait_completed(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return done_; });
}

void Work::wait(std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) timeout = default_timeout();
  if (!wait_completed(timeout)) {
    mark_failed(std::make_exception_ptr(
        Error(detail::concat(description_, ": timed out after ", timeout.count(),
                             " ms; a peer may have died or may be "
                             "running a different collective (KILN_DISTRIBUTED_DEBUG=1 checks that every rank calls "
                             "the same ones). The process group was aborted."))));
    on_timeout();
  }
  std::exception_ptr error = exception();
  if (error) std::rethrow_exception(error);
}

}  // namespace kiln::distributed
