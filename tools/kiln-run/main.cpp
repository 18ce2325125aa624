// kiln-run: starts the ranks of a distributed kiln program on this node, as torchrun does
// (docs/distributed.md, "kiln-run").
#include <cstdio>
#include <exception>
#include <iostream>

#include "options.h"
#include "signals.h"
#include "supervisor.h"

int main(int argc, char** argv) {
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
