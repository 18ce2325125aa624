// Rank programs for the kiln-run tests (tests/distributed/test_kiln_run.cpp): they report what
// the launcher gave them (environment, signals) and misbehave on request (fail, ignore SIGTERM,
// print a lot). Waits are bounded, so a rank the launcher fails to stop still ends by itself.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>

#include "tests/distributed/worker/scenario.h"

namespace {

volatile sig_atomic_t g_signal = 0;
void remember_signal(int sig) { g_signal = sig; }

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

int my_rank() { return std::stoi(env_or("RANK", "-1")); }

const char* name_of(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    default: return "another signal";
  }
}

// Prints "rank R ready pid=P", then waits (at most 60 s) for SIGINT, SIGTERM or SIGHUP and prints
// "rank R got SIGTERM". With `ignore_term`, SIGTERM is ignored, so only SIGKILL ends it early.
void wait_for_signal(bool ignore_term) {
  g_signal = 0;
  for (int s : {SIGINT, SIGTERM, SIGHUP}) ::signal(s, remember_signal);
  if (ignore_term) ::signal(SIGTERM, SIG_IGN);
  std::cout << "rank " << my_rank() << " ready pid=" << ::getpid() << std::endl;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (g_signal == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (g_signal == 0) throw std::runtime_error("no signal came within 60 s");
  std::cout << "rank " << my_rank() << " got " << name_of(g_signal) << std::endl;
}

}  // namespace

// One "NAME=value" (or "NAME unset") line per launcher variable, and whether the rank leads a
// process group of its own.
KILN_SCENARIO("launcher_env") {
  (void)args;
  for (const char* name :
       {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
        "OMP_NUM_THREADS", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "KILN_TEST_KEPT"}) {
    const char* v = std::getenv(name);
    std::cout << name << (v ? std::string("=") + v : std::string(" unset")) << "\n";
  }
  std::cout << "OWN_PROCESS_GROUP=" << (::getpgrp() == ::getpid()) << std::endl;
}

// launcher_lines COUNT: COUNT lines "out I of rank R" on stdout, each written in two pieces,
// COUNT/10 lines "err I of rank R" on stderr, then "tail of rank R" without a newline.
KILN_SCENARIO("launcher_lines") {
  const int count = std::stoi(args.at(0));
  const std::string rank = std::to_string(my_rank());
  for (int i = 0; i < count; ++i) {
    std::fprintf(stdout, "out %d", i);
    std::fflush(stdout);
    std::fprintf(stdout, " of rank %s\n", rank.c_str());
    if (i % 10 == 0) std::fprintf(stderr, "err %d of rank %s\n", i / 10, rank.c_str());
  }
  std::fprintf(stdout, "tail of rank %s", rank.c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(0);  // no "ok" line from the worker's main after the partial one
}

// Every rank waits for a signal and reports it.
KILN_SCENARIO("launcher_wait_signal") {
  (void)args;
  wait_for_signal(false);
}

// launcher_fail RANK CODE DELAY_MS [ignore_term]: rank RANK waits DELAY_MS, then exits with CODE,
// or raises signal -CODE when CODE is negative. The other ranks wait for a signal (or, with
// ignore_term, ignore SIGTERM while they wait).
KILN_SCENARIO("launcher_fail") {
  const int failing = std::stoi(args.at(0));
  const int code = std::stoi(args.at(1));
  const int delay_ms = std::stoi(args.at(2));
  const bool ignore_term = args.size() > 3 && args[3] == "ignore_term";
  if (my_rank() != failing) {
    wait_for_signal(ignore_term);
    return;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
  std::cout << "rank " << failing << " failing with " << code << std::endl;
  if (code < 0) ::raise(-code);
  std::exit(code);
}
