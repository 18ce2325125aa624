#pragma once
// Progress: the per-epoch progress display of a training loop.
//
//   kiln::utils::Progress bar(loader.size(), "epoch 1/2");     // std::cout, TTY detected
//   for (...) { ...; bar.update(step + 1, {{"loss", loss}, {"lr", lr}}, samples_per_second); }
//   bar.finish();
//
// On a terminal one line is redrawn in place with '\r' (at most every `redraw_seconds`, and
// always at the last step):
//   epoch 1/2 [##########..............] 188/469  loss 0.4213  lr 0.003  1523 samples/s  ETA 0:18
// When the output is not a terminal (a log file, CI) plain lines are written instead: one each
// time another `percent_interval` % of the steps is done, or `seconds_interval` seconds after the
// previous line, never more than `max_lines` lines per epoch counting the final one:
//   epoch 1/2  188/469 (40%)  loss 0.4213  lr 0.003  1523 samples/s  ETA 0:18
// finish() writes the final state with the elapsed time instead of the ETA (the destructor
// calls it when the caller did not, except during exception unwinding).
// `step` counts completed steps (1..total). total_steps <= 0 means unknown: no bar, no ETA.
#include <cstdint>
#include <functional>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/arg.h"

namespace kiln::utils {

// isatty(stdout)
bool stdout_is_tty();
// Columns of the terminal on stdout (ioctl, then $COLUMNS); 0 when unknown.
int terminal_columns();
// "m:ss" below an hour, "h:mm:ss" above; "?" for negative or non-finite input.
std::string format_duration(double seconds);

using Metrics = std::vector<std::pair<std::string, double>>;

struct ProgressOptions {
  KILN_ARG(int, bar_width) = 24;
  // not a TTY: a line every this many percent of the steps ...
  KILN_ARG(double, percent_interval) = 10.0;
  // ... or this many seconds after the previous line ...
  KILN_ARG(double, seconds_interval) = 10.0;
  // ... and at most this many lines per epoch, final included
  KILN_ARG(int, max_lines) = 20;
  // TTY: the shortest time between two redraws
  KILN_ARG(double, redraw_seconds) = 0.1;
  // TTY: cut lines to this width; -1: the terminal's, 0: never
  KILN_ARG(int, max_width) = -1;
  // seconds, monotonic; unset: steady_clock (tests inject one)
  KILN_ARG(std::function<double()>, clock);
};

class Progress {
 public:
  Progress(int64_t total_steps, std::string label = "", std::ostream& os = std::cout, bool is_tty = stdout_is_tty(),
           ProgressOptions options = ProgressOptions());
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Reports that `step` steps are done. Metrics are shown in the given order ("%.4g");
  // samples_per_second < 0 leaves the throughput out.
  void update(int64_t step, const Metrics& metrics = {}, double samples_per_second = -1);
  // Writes the final line (with the last update's step and, when these are empty / negative,
  // its metrics and throughput) and ends it with '\n'. Later calls do nothing.
  void finish(const Metrics& metrics = {}, double samples_per_second = -1);

  double elapsed_seconds() const;
  int64_t lines_written() const { return lines_; }  // lines ended with '\n' so far
  bool is_tty() const { return tty_; }

 private:
  double now() const;
  std::string render(bool final) const;
  void draw_tty(bool final);
  void write_line(bool final);
  int remaining_thresholds() const;

  int64_t total_;
  std::string label_;
  std::ostream& os_;
  bool tty_;
  ProgressOptions opt_;
  int width_ = 0;  // TTY line width limit, 0: none

  double start_;
  double last_draw_ = -1e300;  // TTY redraw / non-TTY line times
  double next_percent_;        // the next non-TTY threshold, in percent
  int64_t step_ = 0;
  Metrics metrics_;
  double sps_ = -1;
  size_t drawn_len_ = 0;    // TTY: length of the line on screen
  bool line_open_ = false;  // TTY: a line is drawn and not yet ended
  bool finished_ = false;
  int64_t lines_ = 0;
};

}  // namespace kiln::utils
