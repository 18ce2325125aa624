#pragma once
// kiln-guide's results: the statistics of each row (median, spread, ratio), and the report in
// three forms: report.md (a table for people), report.json (the same, for programs) and
// report.png (the ratios as a bar chart, with their spread and the guides' claims).
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace kiln_guide {

enum class Direction { HigherIsBetter, LowerIsBetter };
enum class Unit { SamplesPerSecond, Bytes, Seconds, Accuracy, PerStep, Samples };

// Status words, exactly as report.json writes them.
inline const char* const kMeasured = "measured";
inline const char* const kNeedsGpu = "needs a GPU";
inline const char* const kFailed = "failed";
inline const char* const kNotMeasured = "not measured";

// The median (the mean of the middle two for an even count); NaN for no values.
double median(std::vector<double> v);
// {min, max}; {NaN, NaN} for no values.
std::pair<double, double> spread(const std::vector<double>& v);
// The speed-up as a ratio that is > 1 when the "with" side is better: with / baseline when
// higher is better (throughput, accuracy, batch), baseline / with when lower is (memory, time,
// host syncs).
double ratio(double baseline, double with, Direction d);
// The range the ratio spans over the two sides' spreads (lowest and highest possible ratio).
std::pair<double, double> ratio_range(const std::pair<double, double>& baseline, const std::pair<double, double>& with,
                                      Direction d);

// Peak memory as a straight line in the batch: fixed + per_sample x batch.
struct LinearFit {
  double fixed = std::nan(""), per_sample = std::nan("");
};
// The line through the peaks of two runs at different batches; NaN when the batches are equal.
LinearFit fit_peak(double batch_a, double peak_a, double batch_b, double peak_b);
// The largest whole batch whose predicted peak stays within `budget` bytes: 0 when not even one
// sample fits, NaN when the fit does not grow with the batch (no such largest batch).
double largest_batch_within(const LinearFit& f, double budget);

// A batch-fit row's lines (each side's medians over the rounds) and the batches they came from.
struct MemoryFit {
  int64_t baseline_batches[2] = {0, 0}, with_batches[2] = {0, 0};
  LinearFit baseline, with;
};

struct Row {
  int tip = 0;
  std::string key;  // the tip's short name (the chart's labels)
  std::string name, model, metric;
  Direction direction = Direction::HigherIsBetter;
  Unit unit = Unit::SamplesPerSecond;
  std::string sample_word = "samples";               // images, tokens: what samples/s counts
  std::vector<double> baseline_values, with_values;  // one per round
  std::string baseline_command, with_command;        // for the report's flag table
  std::string claim, source, explanation;
  double claimed_ratio = std::nan("");
  std::optional<MemoryFit> fit;  // batch-fit rows: how their numbers were made
  std::string status = kNotMeasured;
  std::string failure;  // failed rows: the command and the tail of its stderr
};

// What the report says about where it ran.
struct Machine {
  std::string cpu;    // /proc/cpuinfo's model name
  std::string label;  // --label: what the user calls the machine; empty when not given
  int cores = 0;
  std::string cpu_isa;  // from kiln-train's JSON summary
  std::string gpu;      // nvidia-smi's name, empty without one
  std::string device;   // cpu | cuda: where the runs trained
  std::string date;     // ISO 8601, local time
  std::string mode;     // quick | full (and the rounds)
  int rounds = 0;
  double total_seconds = 0;
  std::string kiln_train;   // the binary's path
  std::string kiln_commit;  // the kiln kiln-train was built from (its JSON summary), "?" when unknown
};

nlohmann::ordered_json report_json(const Machine& m, const std::vector<Row>& rows);
std::string report_markdown(const Machine& m, const std::vector<Row>& rows);
void write_report_png(const std::string& path, const Machine& m, const std::vector<Row>& rows);
// Writes DIR/report.md, report.json and report.png (each atomically: a temporary renamed).
void write_report(const std::string& dir, const Machine& m, const std::vector<Row>& rows);

// A duration for people: "48s", "4m 38s".
std::string format_duration(double seconds);

// A value in its unit, for people: "12,345 images/s", "312.5 MiB", "14.2 s", "91.23%".
std::string format_value(double v, Unit u, const std::string& sample_word = "samples");

}  // namespace kiln_guide
