#pragma once
// The table of speed-ups kiln-guide measures: one entry per row of its report, numbered as in
// docs/guide.md ("The speed-ups and where they live"), each with the kiln-train flags of its
// baseline and "with" sides, the metric that shows the speed-up, what the PyTorch guides claim
// for it, and why kiln's number may differ.
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace kiln_guide {

// What a run is measured by. Convergence picks its metric after the runs: seconds to the
// target accuracy when every run reaches it, else the final accuracy after the fixed budget.
enum class MetricKind {
  Throughput,      // samples (images or tokens) per second, after the first log window
  LateThroughput,  // the same over the second half of the run's steps
  PeakMemory,      // peak memory in bytes (the process's resident set on the CPU)
  Convergence,     // seconds to a target test accuracy, or the final test accuracy
  HostSyncs,       // host reads of device values per optimizer step (on a GPU: syncs, by sync-debug)
  BatchFit,        // the largest batch whose predicted peak memory fits in the baseline's peak
  EvalThroughput,  // test samples evaluated per second, over the evaluations after the first
};

// Evaluation throughput runs evaluate this many times during their steps, plus once at the end.
inline constexpr int64_t kEvalRuns = 3;

// Test accuracy is evaluated every this many training samples in convergence runs (kiln-train
// --eval-every, in steps of the side's batch): a third of a Fashion-MNIST epoch.
inline constexpr int64_t kEvalSamples = 20000;

// How long one run trains: `epochs` passes, cut at `steps` optimizer steps when steps > 0.
struct Budget {
  int64_t epochs = 1;
  int64_t steps = 0;
};

struct Tip {
  int number = 0;     // docs/guide.md's speed-up number
  std::string key;    // short name for --only ("workers", "bf16", ...)
  std::string name;   // the speed-up, as docs/guide.md names it
  std::string model;  // cnn | resnet18 | gpt; empty when not measured
  MetricKind metric = MetricKind::Throughput;
  std::vector<std::string> baseline, with;  // kiln-train flags of each side
  std::vector<std::string> cuda_both;       // added to both sides when running on a GPU
  Budget quick, full;
  double target_accuracy = 0;  // Convergence: the test accuracy to reach
  // BatchFit: the micro-batch of each side's second run (the first runs the side's own), from
  // which each side's peak memory is fitted as fixed + per sample x batch.
  int64_t baseline_probe_batch = 0, with_probe_batch = 0;
  std::string metric_note;              // appended to the metric's text (how this row's number is made)
  double cost = 1;                      // time per sample against the model's default run (estimates)
  bool needs_gpu = false;               // meaningless without a GPU: listed, never measured on the CPU
  bool cpu_only = false;                // a CPU switch: measured on the CPU whatever --device says
  bool launcher = false;                // the "with" side runs 2 ranks under kiln-run
  std::string claim;                    // what the guides state, with their number
  double claimed_ratio = std::nan("");  // that number as a ratio (> 1: a gain); NaN: none
  std::string source;                   // which guide says it
  std::string explanation;              // why kiln's number may differ
  std::string gpu_explanation;          // the same where the row trains on a GPU; empty: `explanation`
  std::string not_measured;             // non-empty: kiln-train cannot switch it, and why
};

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Every row, in docs/guide.md's order.
const std::vector<Tip>& tips();

// The rows --only names: a comma-separated list of tip numbers (every row of that number),
// keys or names (case-insensitive). Empty: every row. Throws UsageError for an unknown entry.
std::vector<const Tip*> select_tips(const std::string& only);

// "--list": the rows (number, key, name, model, metric, flags), or why one is not measured.
std::string list_text(const std::vector<const Tip*>& rows);

// The flags as one shell-like string ("--workers 0"), "(defaults)" when there are none.
std::string flags_text(const std::vector<std::string>& flags);

}  // namespace kiln_guide
