#pragma once
// Running kiln-train (or kiln-run) as a child process and reading what one run left behind: the
// JSON summary on the last line of its stdout and the rows of OUT/metrics.csv.
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kiln_guide {

// Set by SIGINT/SIGTERM in kiln-guide: the running child is asked to stop and no run starts.
extern std::atomic<int> g_stop_signal;

struct ProcessResult {
  int exit_code = -1;      // the child's exit status; 128 + N when killed by signal N
  bool timed_out = false;  // killed after the time limit
  bool started = false;    // false: the program could not be executed at all
  double wall_seconds = 0;
};

// Runs argv[0] (a path) with stdout and stderr written to the two files, stdin from /dev/null.
// A child still running after `timeout_s` seconds, or when g_stop_signal is set, gets SIGTERM
// (then SIGKILL 10 s later).
ProcessResult run_process(const std::vector<std::string>& argv, const std::string& stdout_path,
                          const std::string& stderr_path, double timeout_s);

// The last line of `text` that parses as a JSON object (from its first '{': kiln-run may prefix
// "[rank 0] "); null when there is none. `raw`, when given, gets that object's text.
nlohmann::json last_json_line(const std::string& text, std::string* raw = nullptr);

// The last `max_lines` lines of a file (at most `max_bytes` of them), for error messages.
std::string tail_of_file(const std::string& path, int max_lines = 12, size_t max_bytes = 2000);

// One row of kiln-train's metrics.csv: a training row (every --log-every steps, with the window's
// samples per second) or an evaluation row (after each epoch and every --eval-every steps, with
// the test accuracy).
struct MetricsRow {
  int64_t step = 0;
  int64_t epoch = 0;
  std::optional<double> samples_per_second;
  std::optional<double> test_accuracy;
};
// Reads OUT/metrics.csv; a missing file is an empty list, a malformed one throws with the path.
std::vector<MetricsRow> read_metrics_csv(const std::string& path);

// Throughput of a run from its training rows after the first one (the first window holds the
// warm-up), weighted by the steps each row covers; `from_step` > 0 keeps only rows after it.
// NaN when fewer than one such row exists.
double steady_throughput(const std::vector<MetricsRow>& rows, int64_t from_step = 0);

// When a run reached `target` test accuracy: the first evaluation row at or above it.
struct TargetHit {
  int64_t step = 0;
  double seconds = 0;  // train_seconds * step / final step: training time, evaluation left out
};
std::optional<TargetHit> time_to_accuracy(const std::vector<MetricsRow>& rows, double target, double train_seconds);

// The command line as one shell-quoted string, for the report and runs/.
std::string shell_join(const std::vector<std::string>& argv);

}  // namespace kiln_guide
