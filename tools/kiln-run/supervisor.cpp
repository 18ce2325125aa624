#include "supervisor.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "line_relay.h"
#include "rank_env.h"
#include "signals.h"
#include "spawn_rank.h"

namespace kiln_run {
namespace {

using Clock = std::chrono::steady_clock;

// After the last rank has exited, a process it left behind (a daemon) may still hold its pipes
// open; output is read for this long more and then given up, so kiln-run cannot hang on it.
constexpr std::chrono::seconds kDrainAfterExit{5};

// One of a rank's two output streams.
struct Stream {
  int fd = -1;  // -1 once it reached EOF (or was given up)
  std::unique_ptr<LineRelay> relay;
};

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  Stream out, err;
};

void note(const std::string& message) { write_all(2, "kiln-run: " + message + "\n"); }

// Reads what `s` holds right now; at EOF the last partial line is written and the pipe closed.
void drain(Stream& s) {
  char buf[65536];
  while (s.fd >= 0) {
    ssize_t n = ::read(s.fd, buf, sizeof buf);
    if (n > 0) {
      s.relay->feed(buf, static_cast<std::size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;
    } else {  // EOF, or an error that will not go away
      s.relay->finish();
      ::close(s.fd);
      s.fd = -1;
    }
  }
}

void give_up(Stream& s) {
  if (s.fd < 0) return;
  drain(s);
  if (s.fd < 0) return;
  s.relay->finish();
  ::close(s.fd);
  s.fd = -1;
}

std::string describe_end(int status) {
  if (WIFSIGNALED(status)) return "was killed by signal " + signal_name(WTERMSIG(status));
  return "exited with status " + std::to_string(WEXITSTATUS(status));
}

int shell_status(int status) {
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

class Supervisor {
 public:
  explicit Supervisor(const Options& opt) : opt_(opt) {}

  Outcome run() {
    signal_fd_ = install_signal_handlers();
    if (signal_fd_ < 0) throw std::runtime_error("cannot create the signal pipe");
    start_ranks();
    loop();
    return outcome_;
  }

 private:
  void start_ranks() {
    const auto inherited = current_environment();
    ranks_.resize(opt_.nproc_per_node);
    for (int l = 0; l < opt_.nproc_per_node; ++l) {
      Rank& r = ranks_[l];
      r.rank = opt_.node_rank * opt_.nproc_per_node + l;
      const std::string prefix = opt_.prefix ? "[rank " + std::to_string(r.rank) + "] " : "";
      RankProcess p;
      try {
        p = spawn_rank(opt_.program, rank_environment(opt_, l, inherited));
      } catch (const std::exception& e) {
        note("cannot start rank " + std::to_string(r.rank) + ": " + e.what());
        fail(1);
        break;
      }
      r.pid = p.pid;
      r.running = true;
      r.out = Stream{p.out_fd, std::make_unique<LineRelay>(prefix, 1)};
      r.err = Stream{p.err_fd, std::make_unique<LineRelay>(prefix, 2)};
      // a signal that came while starting: the ranks started so far get it, later ones never start
      handle_signals();
      if (stopping_) break;
    }
  }

  void loop() {
    for (;;) {
      reap();
      const bool any_running = count_running() > 0;
      if (!any_running && !open_streams()) return;
      if (!any_running) {
        if (all_exited_at_ == Clock::time_point{}) all_exited_at_ = Clock::now();
        if (Clock::now() - all_exited_at_ > kDrainAfterExit) {
          for (Rank& r : ranks_) give_up(r.out), give_up(r.err);
          return;
        }
      }
      if (stopping_ && !killed_ && Clock::now() >= kill_at_) kill_remaining();

      std::vector<pollfd> fds{{signal_fd_, POLLIN, 0}};
      std::vector<Stream*> streams{nullptr};
      for (Rank& r : ranks_) {
        for (Stream* s : {&r.out, &r.err}) {
          if (s->fd < 0) continue;
          fds.push_back({s->fd, POLLIN, 0});
          streams.push_back(s);
        }
      }
      // a timer as well as the self-pipe, for the kill deadline and as a safety net
      ::poll(fds.data(), fds.size(), 100);
      for (std::size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents) drain(*streams[i]);
      }
      handle_signals();
    }
  }

  void handle_signals() {
    for (int sig : pending_signals()) {
      if (sig == SIGCHLD) continue;  // reap() runs on every turn of the loop
      if (received_signal_ == 0) received_signal_ = sig;
      if (stopping_ && forwarded_once_) {
        // a second Ctrl-C: whoever presses it twice does not want to wait for the kill timeout
        note("got " + signal_name(sig) + " again; killing the ranks");
        kill_remaining();
        continue;
      }
      note("got " + signal_name(sig) + "; forwarding it to the ranks");
      forwarded_once_ = true;
      begin_stopping(sig);
    }
  }

  // Waits for every rank that has ended, without blocking.
  void reap() {
    for (;;) {
      int status = 0;
      pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid <= 0) return;  // none ended (0) or no children left (-1, ECHILD)
      for (Rank& r : ranks_) {
        if (r.pid != pid || !r.running) continue;
        r.running = false;
        // its last words before the exit, ahead of kiln-run's message about it
        drain(r.out);
        drain(r.err);
        const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        if (failed && !stopping_) {
          note("rank " + std::to_string(r.rank) + " " + describe_end(status) +
               (count_running() > 0 ? "; stopping the other ranks" : ""));
          fail(shell_status(status));
        }
      }
    }
  }

  void fail(int status) {
    if (!failed_) {
      failed_ = true;
      outcome_.exit_status = status;
    }
    begin_stopping(SIGTERM);
  }

  void begin_stopping(int sig) {
    if (!stopping_) {
      stopping_ = true;
      kill_at_ =
          Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opt_.kill_timeout));
    }
    signal_running(sig);
    if (!failed_) outcome_.die_by = received_signal_;
  }

  void kill_remaining() {
    killed_ = true;
    std::string which;
    for (const Rank& r : ranks_) {
      if (r.running) which += (which.empty() ? "" : ", ") + std::to_string(r.rank);
    }
    if (which.empty()) return;
    note("sending SIGKILL to rank(s) " + which + " still running");
    signal_running(SIGKILL);
  }

  // The whole process group of each running rank: what a terminal would do for a foreground job.
  void signal_running(int sig) {
    for (const Rank& r : ranks_) {
      if (!r.running) continue;
      if (::kill(-r.pid, sig) != 0) ::kill(r.pid, sig);
    }
  }

  int count_running() const {
    int n = 0;
    for (const Rank& r : ranks_) n += r.running;
    return n;
  }

  bool open_streams() const {
    for (const Rank& r : ranks_) {
      if (r.out.fd >= 0 || r.err.fd >= 0) return true;
    }
    return false;
  }

  const Options& opt_;
  int signal_fd_ = -1;
  std::vector<Rank> ranks_;
  Outcome outcome_;
  bool stopping_ = false;
  bool failed_ = false;
  bool killed_ = false;
  bool forwarded_once_ = false;
  int received_signal_ = 0;
  Clock::time_point kill_at_{};
  Clock::time_point all_exited_at_{};
};

}  // namespace

Outcome supervise(const Options& opt) { return Supervisor(opt).run(); }

}  // namespace kiln_run
