// kiln-run: starts the ranks of a distributed kiln program on this node, as torchrun does
// (docs/distributed.md, "kiln-run").
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <iostream>

#include "options.h"
#include "signals.h"
#include "supervisor.h"

namespace {

// A launcher started with stdin, stdout or stderr closed would get that number for one of its
// pipes, and a rank's dup2 onto 0..2 would then mix them up; /dev/null fills the gap instead.
void ensure_standard_fds() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) == -1) {
      int null = ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
      if (null >= 0 && null != fd) {
        ::dup2(null, fd);
        ::close(null);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  ensure_standard_fds();
  kiln_run::Options opt;
  try {
    opt = kiln_run::parse_options(argc, argv);
  } catch (const kiln_run::UsageError& e) {
    std::cerr << "kiln-run: " << e.what() << "\n(kiln-run --help shows the usage)\n";
    return 2;
  }
  if (opt.help) {
    std::cout << kiln_run::usage_text();
    return 0;
  }
  kiln_run::Outcome outcome;
  try {
    outcome = kiln_run::supervise(opt);
  } catch (const std::exception& e) {
    std::cerr << "kiln-run: " << e.what() << "\n";
    return 1;
  }
  if (outcome.exit_status == 0 && outcome.die_by != 0) kiln_run::die_by_signal(outcome.die_by);
  return outcome.exit_status;
}
