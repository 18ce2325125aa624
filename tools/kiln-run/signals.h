#pragma once
// kiln-run's signal handling, as a self-pipe: the handlers only write the signal's number to a
// pipe, and the supervisor's poll loop reads it like any other event. SIGCHLD is caught the same
// way so that a rank's exit wakes the loop at once.
#include <string>
#include <vector>

namespace kiln_run {

// The signals forwarded to the ranks: an interactive Ctrl-C, a scheduler's or kill's SIGTERM,
// and SIGHUP from a closing terminal (the ranks sit in their own process groups, so the
// terminal's own SIGHUP or SIGINT reaches only kiln-run).
const std::vector<int>& forwarded_signals();

// Installs the handlers and ignores SIGPIPE (a closed stdout must not end the job).
// Returns the read end of the self-pipe (non-blocking).
int install_signal_handlers();

// Every signal number that arrived since the last call (SIGCHLD included).
std::vector<int> pending_signals();

// Block / unblock the forwarded signals (around fork, so a child never runs kiln-run's handler).
void block_forwarded_signals();
void unblock_forwarded_signals();

// In a forked child before exec: default dispositions and an empty mask, as a fresh program has.
void reset_signals_in_child();

// Ends kiln-run by `sig` itself, so that its parent (a shell loop, a scheduler) sees the same
// cause as for a program that did not catch it.
[[noreturn]] void die_by_signal(int sig);

// "SIGKILL", "SIGTERM", ... or "signal N".
std::string signal_name(int sig);

}  // namespace kiln_run
