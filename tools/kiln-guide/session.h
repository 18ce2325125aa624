#pragma once
// One kiln-guide session: the plan (which rows run, on which device, with which commands, in
// alternating rounds), the runs themselves with a progress line, and the rows of the report.
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "report.h"
#include "runner.h"
#include "tips.h"

namespace kiln_guide {

struct SessionOptions {
  std::string device = "cpu";  // where the runs train: cpu or cuda (already resolved)
  bool full = false;           // --full: longer runs
  int rounds = 1;              // rounds per side
  int64_t steps = 0;           // > 0: every run trains this many steps (--steps)
  std::string out;             // the report folder; runs go to OUT/runs
  std::string kiln_train;      // the binary
  std::string kiln_run;        // the launcher; empty: rows that need it are not measured
  std::string data, gpt_data;  // passed to kiln-train as --data when set
  int gpu_count = 0;
};

// One kiln-train run of the plan.
struct Job {
  const Tip* tip = nullptr;
  bool with = false;  // the "with" side, else the baseline
  int round = 0;
  bool probe = false;  // BatchFit: the side's second run, at its probe batch
  int64_t batch = 0;   // the (micro-)batch this run trains with
  int64_t accum = 1;   // its micro-batches per optimizer step
  std::string id;      // runs/<id>.{json,stdout,stderr} and kiln-train's --out runs/<id>/
  std::string out_dir;
  std::string device;
  std::vector<std::string> argv;
  double estimate_s = 0;
};

// The row a tip gets before anything runs: its claim, metric and commands, and its status when
// it will not run here (not measured, needs a GPU); std::nullopt for the status means it runs.
Row planned_row(const Tip& t, const SessionOptions& o, std::optional<std::string>* skip_status);

// Every run of the tips that run here, tip by tip, each tip's rounds alternating baseline and
// with, so slow drifts of the machine hit both sides alike.
std::vector<Job> plan_jobs(const std::vector<const Tip*>& tips, const SessionOptions& o);

// Seconds a run should take on a quiet 2-core x86-64 machine (CPU) or a data-centre GPU:
// rough, for the up-front estimate and the progress line.
double estimate_seconds(const Job& j);

// What one run measured: the value of the tip's metric, and for convergence runs the final
// accuracy and when the target was reached.
struct RunOutcome {
  bool ok = false;
  int round = 0;
  bool probe = false;
  int64_t batch = 0, accum = 1;  // the job's (micro-)batch and accumulation
  std::string failure;           // !ok: the command, the exit status and the tail of stderr
  double value = std::nan("");
  double final_accuracy = std::nan("");
  std::optional<TargetHit> hit;
  std::string cpu_isa;
  std::string kiln_commit;  // kiln-train's kiln (kiln::build_commit)
};

// Runs one job: spawns it, parses its JSON summary and metrics.csv, writes runs/<id>.json and
// drops the run's checkpoints and model (they are large and not needed for the report).
RunOutcome run_job(const Job& j, const SessionOptions& o);

// Turns a measured tip's outcomes into its row: median, spread, and for convergence the metric
// that every run has (seconds to the target, else the final accuracy); for a batch fit each
// round's largest batch (a row that cannot be fitted is failed, saying why).
void fill_row(Row& row, const Tip& t, const std::vector<RunOutcome>& baseline, const std::vector<RunOutcome>& with,
              const SessionOptions& o);

struct SessionResult {
  std::vector<Row> rows;
  std::string cpu_isa;
  std::string kiln_commit;
  bool interrupted = false;
};

// Runs the whole plan, printing a progress line per run on `progress`.
SessionResult run_session(const std::vector<const Tip*>& tips, const SessionOptions& o, std::ostream& progress);

}  // namespace kiln_guide
