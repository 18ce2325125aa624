#include "kiln/utils/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>

namespace kiln::utils {

bool stdout_is_tty() { return isatty(STDOUT_FILENO) == 1; }

int terminal_columns() {
  struct winsize ws {};
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  if (const char* c = std::getenv("COLUMNS")) {
    const int v = std::atoi(c);
    if (v > 0) return v;
  }
  return 0;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(std::llround(seconds));
  char buf[48];
  if (s < 3600) {
    std::snprintf(buf, sizeof buf, "%d:%02d", static_cast<int>(s / 60), static_cast<int>(s % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%lld:%02d:%02d", static_cast<long long>(s / 3600), static_cast<int>(s / 60 % 60),
                  static_cast<int>(s % 60));
  }
  return buf;
}

namespace {
std::string fmt_metric(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}
std::string fmt_rate(double v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, v >= 100 ? "%.0f" : "%.1f", v);
  return buf;
}
}  // namespace

Progress::Progress(int64_t total_steps, std::string label, std::ostream& os, bool is_tty, ProgressOptions options)
    : total_(total_steps), label_(std::move(label)), os_(os), tty_(is_tty), opt_(std::move(options)) {
  if (opt_.percent_interval() <= 0) opt_.percent_interval(100);
  if (opt_.max_lines() < 1) opt_.max_lines(1);
  next_percent_ = opt_.percent_interval();
  width_ = opt_.max_width() >= 0 ? opt_.max_width() : (tty_ ? terminal_columns() : 0);
  start_ = now();
}

Progress::~Progress() {
  try {
    if (!finished_ && std::uncaught_exceptions() == 0 && step_ > 0) {
      finish();
    } else if (line_open_) {
      os_ << '\n' << std::flush;
    }
  } catch (...) {
  }
}

double Progress::now() const {
  if (opt_.clock()) return opt_.clock()();
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

double Progress::elapsed_seconds() const { return now() - start_; }

std::string Progress::render(bool final) const {
  std::string s = label_;
  auto sep = [&s](const char* gap) {
    if (!s.empty()) s += gap;
  };
  if (total_ > 0) {
    const double frac = std::clamp(static_cast<double>(step_) / total_, 0.0, 1.0);
    if (tty_ && opt_.bar_width() > 0) {
      const int filled = static_cast<int>(frac * opt_.bar_width());
      sep(" ");
      s += '[' + std::string(filled, '#') + std::string(opt_.bar_width() - filled, '.') + ']';
    }
    sep(tty_ ? " " : "  ");
    s += std::to_string(step_) + '/' + std::to_string(total_);
    if (!tty_) s += " (" + std::to_string(std::clamp<int64_t>(step_, 0, total_) * 100 / total_) + "%)";
  } else {
    sep("  ");
    s += "step " + std::to_string(step_);
  }
  for (const auto& [name, v] : metrics_) s += "  " + name + ' ' + fmt_metric(v);
  if (sps_ >= 0) s += "  " + fmt_rate(sps_) + " samples/s";
  const double el = elapsed_seconds();
  if (final) {
    s += "  done in " + format_duration(el);
  } else if (total_ > 0) {
    const double eta = step_ > 0 ? el / step_ * std::max<int64_t>(total_ - step_, 0) : NAN;
    s += "  ETA " + format_duration(eta);
  }
  return s;
}

void Progress::draw_tty(bool final) {
  std::string s = render(final);
  if (width_ > 1 && s.size() > static_cast<size_t>(width_ - 1)) s.resize(width_ - 1);
  const size_t len = s.size();
  if (len < drawn_len_) s += std::string(drawn_len_ - len, ' ');  // wipe the longer old line
  os_ << '\r' << s;
  drawn_len_ = len;
  line_open_ = true;
  if (final) {
    os_ << '\n';
    line_open_ = false;
    drawn_len_ = 0;
    ++lines_;
  }
  os_.flush();
}

void Progress::write_line(bool final) {
  os_ << render(final) << '\n' << std::flush;
  ++lines_;
}

int Progress::remaining_thresholds() const {
  if (total_ <= 0) return 0;
  int n = 0;
  for (double p = next_percent_; p < 100.0 - 1e-9; p += opt_.percent_interval()) ++n;
  return n;
}

void Progress::update(int64_t step, const Metrics& metrics, double samples_per_second) {
  if (finished_) return;
  step_ = step;
  if (!metrics.empty()) metrics_ = metrics;
  sps_ = samples_per_second;
  const double t = now();
  if (tty_) {
    if (t - last_draw_ >= opt_.redraw_seconds() || (total_ > 0 && step >= total_)) {
      last_draw_ = t;
      draw_tty(false);
    }
    return;
  }
  // Plain lines: percentage thresholds below 100% (the final line is finish()'s), plus
  // time-based lines while they leave room for the remaining thresholds and the final line.
  bool due = false;
  if (total_ > 0 && next_percent_ < 100.0 - 1e-9 &&
      static_cast<double>(step) * 100.0 >= next_percent_ * static_cast<double>(total_)) {
    due = true;
    while (next_percent_ < 100.0 - 1e-9 &&
           static_cast<double>(step) * 100.0 >= next_percent_ * static_cast<double>(total_))
      next_percent_ += opt_.percent_interval();
  } else if (t - std::max(last_draw_, start_) >= opt_.seconds_interval() &&
             lines_ + 1 + remaining_thresholds() + 1 <= opt_.max_lines() && (total_ <= 0 || step < total_)) {
    due = true;
  }
  if (due && lines_ + 1 < opt_.max_lines()) {
    last_draw_ = t;
    write_line(false);
  }
}

void Progress::finish(const Metrics& metrics, double samples_per_second) {
  if (finished_) return;
  finished_ = true;
  if (!metrics.empty()) metrics_ = metrics;
  if (samples_per_second >= 0) sps_ = samples_per_second;
  if (tty_) {
    draw_tty(true);
  } else {
    write_line(true);
  }
}

}  // namespace kiln::utils
