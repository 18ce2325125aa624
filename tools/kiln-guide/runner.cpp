#include "runner.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <kiln/utils/csv.h>

extern char** environ;

namespace kiln_guide {

std::atomic<int> g_stop_signal{0};

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int status_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

// Waits for `pid`, asking it to stop (SIGTERM, which kiln-train and kiln-run handle: checkpoint
// and exit) on a timeout or a stop signal, and killing it if it has not gone 10 s later.
int wait_child(pid_t pid, double deadline, bool* timed_out) {
  double term_sent_at = -1;
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return status_code(status);
    if (r < 0 && errno != EINTR) return -1;
    const double now = now_seconds();
    if (term_sent_at < 0 && (now > deadline || g_stop_signal != 0)) {
      *timed_out = now > deadline;
      ::kill(pid, SIGTERM);
      term_sent_at = now;
    } else if (term_sent_at >= 0 && now - term_sent_at > 10) {
      ::kill(pid, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::optional<double> cell_number(const std::string& s, const std::string& path) {
  if (s.empty()) return std::nullopt;
  try {
    size_t used = 0;
    const double v = std::stod(s, &used);
    if (used == s.size()) return v;
  } catch (const std::exception&) {
  }
  throw std::runtime_error(path + ": '" + s + "' is not a number");
}

}  // namespace

ProcessResult run_process(const std::vector<std::string>& argv, const std::string& stdout_path,
                          const std::string& stderr_path, double timeout_s) {
  ProcessResult res;
  std::vector<std::string> args = argv;
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const double start = now_seconds();
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, cargs[0], &fa, nullptr, cargs.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    std::ofstream(stderr_path) << "kiln-guide: cannot start " << argv[0] << ": " << std::strerror(rc) << "\n";
    return res;
  }
  res.started = true;
  res.exit_code = wait_child(pid, start + timeout_s, &res.timed_out);
  res.wall_seconds = now_seconds() - start;
  return res;
}

nlohmann::json last_json_line(const std::string& text, std::string* raw) {
  std::istringstream in(text);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
    const auto b = it->find('{');
    if (b == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(it->substr(b), nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) continue;
    if (raw) *raw = it->substr(b);
    return j;
  }
  return nullptr;
}

std::string tail_of_file(const std::string& path, int max_lines, size_t max_bytes) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return "";
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  // progress bars redraw with '\r': keep what the last redraw left
  std::vector<std::string> lines;
  std::istringstream in(all);
  for (std::string l; std::getline(in, l);) {
    while (!l.empty() && l.back() == '\r') l.pop_back();
    const auto cr = l.rfind('\r');
    if (cr != std::string::npos) l = l.substr(cr + 1);
    lines.push_back(l);
  }
  std::string out;
  const size_t from = lines.size() > static_cast<size_t>(max_lines) ? lines.size() - max_lines : 0;
  for (size_t i = from; i < lines.size(); ++i) out += lines[i] + "\n";
  if (out.size() > max_bytes) out = "..." + out.substr(out.size() - max_bytes);
  return out;
}

std::vector<MetricsRow> read_metrics_csv(const std::string& path) {
  if (!std::filesystem::exists(path)) return {};
  const auto table = kiln::utils::read_csv(path);
  if (table.empty()) return {};
  const auto& head = table[0];
  auto column = [&](const char* name) {
    const auto it = std::find(head.begin(), head.end(), name);
    if (it == head.end()) throw std::runtime_error(path + ": no '" + name + "' column");
    return static_cast<size_t>(it - head.begin());
  };
  const size_t c_step = column("step"), c_epoch = column("epoch"), c_sps = column("samples_per_second"),
               c_acc = column("test_accuracy");
  std::vector<MetricsRow> rows;
  for (size_t i = 1; i < table.size(); ++i) {
    const auto& r = table[i];
    if (r.size() != head.size())
      throw std::runtime_error(path + ": row " + std::to_string(i + 1) + " has " + std::to_string(r.size()) + " cells");
    MetricsRow m;
    m.step = static_cast<int64_t>(cell_number(r[c_step], path).value_or(0));
    m.epoch = static_cast<int64_t>(cell_number(r[c_epoch], path).value_or(0));
    m.samples_per_second = cell_number(r[c_sps], path);
    m.test_accuracy = cell_number(r[c_acc], path);
    rows.push_back(m);
  }
  return rows;
}

double steady_throughput(const std::vector<MetricsRow>& rows, int64_t from_step) {
  double steps = 0, seconds = 0;  // sum of steps, and of steps / (steps per second) per window
  int64_t prev = 0;
  bool first = true;
  for (const MetricsRow& r : rows) {
    if (!r.samples_per_second) continue;  // an evaluation row
    const int64_t covered = r.step - prev;
    prev = r.step;
    if (first) {  // the first window holds the first-call costs (allocations, autotuning, packing)
      first = false;
      continue;
    }
    if (r.step <= from_step || covered <= 0 || !(*r.samples_per_second > 0)) continue;
    steps += static_cast<double>(covered);
    seconds += static_cast<double>(covered) / *r.samples_per_second;
  }
  return seconds > 0 ? steps / seconds : std::nan("");
}

std::optional<TargetHit> time_to_accuracy(const std::vector<MetricsRow>& rows, double target, double train_seconds) {
  int64_t final_step = 0;
  for (const MetricsRow& r : rows) final_step = std::max(final_step, r.step);
  if (final_step <= 0) return std::nullopt;
  for (const MetricsRow& r : rows)
    if (r.test_accuracy && *r.test_accuracy >= target)
      return TargetHit{r.step, train_seconds * static_cast<double>(r.step) / static_cast<double>(final_step)};
  return std::nullopt;
}

std::string shell_join(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) {
    const bool plain = !a.empty() && a.find_first_not_of(
                                         "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                         "0123456789-_./=:,+@%") == std::string::npos;
    std::string q = a;
    if (!plain) {
      q = "'";
      for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
      q += "'";
    }
    s += (s.empty() ? "" : " ") + q;
  }
  return s;
}

}  // namespace kiln_guide
