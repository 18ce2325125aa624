#include "spawn_rank.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "signals.h"

extern char** environ;

namespace kiln_run {
namespace {

// A pipe whose both ends close on exec: a rank must not hold the pipes of the other ranks open
// (their EOF would never come while it lives). dup2 onto 1 and 2 clears the flag there.
void make_pipe(int fds[2]) {
  if (::pipe(fds) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  for (int i = 0; i < 2; ++i) ::fcntl(fds[i], F_SETFD, FD_CLOEXEC);
  ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
}

void write_str(int fd, const char* s) { [[maybe_unused]] ssize_t n = ::write(fd, s, std::strlen(s)); }

}  // namespace

RankProcess spawn_rank(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
  // Everything the child needs is built before the fork; after it the child only makes calls.
  std::vector<std::string> argv_copy = argv, env_copy = env;
  std::vector<char*> args, envp;
  for (auto& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);
  for (auto& s : env_copy) envp.push_back(s.data());
  envp.push_back(nullptr);

  int out[2], err[2];
  make_pipe(out);
  try {
    make_pipe(err);
  } catch (...) {
    ::close(out[0]);
    ::close(out[1]);
    throw;
  }

  block_forwarded_signals();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    reset_signals_in_child();
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) {
      ::dup2(devnull, 0);
      if (devnull != 0) ::close(devnull);
    }
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    environ = envp.data();  // execvp searches the PATH of the rank's environment
    ::execvp(args[0], args.data());
    const int e = errno;
    write_str(2, "kiln-run: cannot run '");
    write_str(2, args[0]);
    write_str(2, "': ");
    write_str(2, std::strerror(e));
    write_str(2, "\n");
    ::_exit(kExecFailedStatus);
  }
  const int fork_errno = errno;
  if (pid > 0) ::setpgid(pid, pid);  // also here, so the group exists before we signal it
  unblock_forwarded_signals();
  ::close(out[1]);
  ::close(err[1]);
  if (pid < 0) {
    ::close(out[0]);
    ::close(err[0]);
    throw std::runtime_error(std::string("fork: ") + std::strerror(fork_errno));
  }
  return RankProcess{pid, out[0], err[0]};
}

}  // namespace kiln_run
