#include "signals.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

namespace kiln_run {
namespace {

int g_pipe[2] = {-1, -1};

void on_signal(int sig) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(sig);
  // a full pipe loses the byte, which is harmless: the loop also polls on a timer
  [[maybe_unused]] ssize_t n = ::write(g_pipe[1], &byte, 1);
  errno = saved;
}

sigset_t forwarded_set() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : forwarded_signals()) sigaddset(&set, s);
  return set;
}

}  // namespace

const std::vector<int>& forwarded_signals() {
  static const std::vector<int> signals = {SIGINT, SIGTERM, SIGHUP};
  return signals;
}

int install_signal_handlers() {
  if (::pipe(g_pipe) != 0) return -1;
  for (int fd : g_pipe) {
    ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int s : forwarded_signals()) ::sigaction(s, &sa, nullptr);
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  ::sigaction(SIGCHLD, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  return g_pipe[0];
}

std::vector<int> pending_signals() {
  std::vector<int> out;
  unsigned char buf[64];
  for (;;) {
    ssize_t n = ::read(g_pipe[0], buf, sizeof buf);
    if (n > 0) {
      out.insert(out.end(), buf, buf + n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      break;
    }
  }
  return out;
}

void block_forwarded_signals() {
  sigset_t set = forwarded_set();
  ::sigprocmask(SIG_BLOCK, &set, nullptr);
}

void unblock_forwarded_signals() {
  sigset_t set = forwarded_set();
  ::sigprocmask(SIG_UNBLOCK, &set, nullptr);
}

void reset_signals_in_child() {
  for (int s : forwarded_signals()) ::signal(s, SIG_DFL);
  ::signal(SIGCHLD, SIG_DFL);
  ::signal(SIGPIPE, SIG_DFL);  // an ignored signal would stay ignored across exec
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
}

void die_by_signal(int sig) {
  ::signal(sig, SIG_DFL);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, sig);
  ::sigprocmask(SIG_UNBLOCK, &set, nullptr);
  ::raise(sig);
  std::_Exit(128 + sig);  // only reached for a signal whose default is not to terminate
}

std::string signal_name(int sig) {
  switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    default: return "signal " + std::to_string(sig);
  }
}

}  // namespace kiln_run
