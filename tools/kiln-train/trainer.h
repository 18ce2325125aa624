#pragma once
// kiln-train's training run: a Trainer sets the run up (parallel job, model, optimizer, schedule,
// logs, resume), trains epoch by epoch (one step: forward under autocast, scaled backward,
// clipping, the optimizer; a log point every --log-every steps), writes a checkpoint at each
// epoch's end and on SIGINT/SIGTERM, evaluates (after each epoch, and every --eval-every steps,
// outside the training time), and finishes with the model, the plot and the JSON summary.
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <kiln/kiln.h>
#include <nlohmann/json.hpp>
#include <kiln/utils/utils.h>

#include "checkpoint.h"
#include "options.h"
#include "step_graph.h"
#include "tasks.h"

namespace kiln_train {

// The signal that asked to stop (SIGINT or SIGTERM, handled alike: checkpoint and exit 128 + signal).
extern std::atomic<int> g_interrupted;

std::unique_ptr<kiln::optim::Optimizer> make_optimizer(const Options& o, const std::vector<kiln::Tensor>& params);

// What kiln-train prints as its list of speed-ups, each on or off for this run.
std::string speedups_summary(const Options& o);

// --profile N: a Profiler over N optimizer steps after the warm-up; writes OUT/trace.json and
// OUT/profile.txt and prints the table (rank 0).
class StepProfile {
 public:
  explicit StepProfile(const Options& o) : o_(o) {}
  bool active() const { return prof_.has_value(); }
  void before_step(int64_t step, bool first_micro);
  void after_step(int64_t step, bool main_rank);

 private:
  const Options& o_;
  std::optional<kiln::profiler::Profiler> prof_;
  bool done_ = false;
};

// What a stretch of work did (the training steps, or the evaluations), each tallied apart: the
// implicit host-device syncs that sync-debug reported (kiln::cuda::sync_count()), and the peak
// bytes of live tensors on the training device (the allocator's statistics, whose peaks start()
// resets). Started and stopped around the work.
class StepTally {
 public:
  explicit StepTally(bool cuda, int device) : cuda_(cuda), device_(device) {}
  void start();
  void stop();
  int64_t syncs() const { return syncs_; }
  int64_t peak_bytes() const { return peak_; }
  // The most the live bytes rose above what was live at a start(): the work's own tensors.
  int64_t peak_growth_bytes() const { return growth_; }
  // CUDA: the device's peak reserved bytes over the whole run, the resets notwithstanding.
  int64_t reserved_peak() const;

 private:
  bool cuda_;
  int device_;
  int64_t syncs_ = 0, mark_ = 0, peak_ = 0, reserved_peak_ = 0, base_ = 0, growth_ = 0;
};

// How fast evaluation runs: test samples (tokens for the gpt) per second over the evaluations
// after the first, whose first-call allocations are set-up (the only one when there is one).
class EvalPace {
 public:
  void add(int64_t samples, double seconds) {
    if (count_++ == 1) samples_ = 0, seconds_ = 0;  // the second evaluation drops the first
    samples_ += samples;
    seconds_ += seconds;
  }
  double samples_per_second() const { return seconds_ > 0 ? static_cast<double>(samples_) / seconds_ : 0; }

 private:
  int64_t count_ = 0, samples_ = 0;
  double seconds_ = 0;
};

class Trainer {
 public:
  // o is validated and the parallel job joined (validate, init_parallel) before the task is made.
  Trainer(Options o, std::unique_ptr<Task> task);
  // Trains to the end (or to --max-steps, or to a stop signal); returns the exit code.
  int run();

 private:
  // setup
  void make_optimizers();
  void open_logs();
  void print_header();
  // one epoch; an exit code when the run must end early
  std::optional<int> train_epoch(int64_t epoch);
  kiln::Tensor train_micro(const kiln::data::Batch& batch, bool last_micro);
  void finish_step();
  std::optional<int> after_step(const kiln::Tensor& loss, int64_t epoch, bool last_of_epoch,
                                kiln::utils::Progress& progress);
  std::optional<int> log_point(const kiln::Tensor& loss, int64_t epoch, kiln::utils::Progress& progress);
  double read_host(const kiln::Tensor& t);
  double evaluate_and_log(int64_t epoch);
  // The run's training seconds up to now, inside an epoch: the earlier epochs' and this one's so
  // far, evaluation time excluded (what pos_.train_seconds holds at the epoch's end).
  double train_clock() const;
  std::optional<int> stop_if_signalled(int64_t epoch, int64_t batch, bool last_micro, kiln::utils::Progress& progress);
  void apply_memory_cap(bool on);
  int stop_out_of_memory(const kiln::OutOfMemoryError& e, int64_t epoch, kiln::utils::Progress& progress);
  void end_epoch(int64_t epoch);
  int finish();
  void add_rates(nlohmann::ordered_json& summary);
  void add_step_facts(nlohmann::ordered_json& summary);

  Options o_;
  bool main_rank_, tty_, cuda_;
  std::unique_ptr<Task> task_;
  std::vector<kiln::Tensor> params_;
  std::unique_ptr<kiln::distributed::DistributedDataParallel> ddp_;
  std::unique_ptr<kiln::distributed::ZeroRedundancyOptimizer> zero_;
  std::unique_ptr<kiln::optim::Optimizer> opt_;
  kiln::optim::Optimizer* opt_ref_ = nullptr;  // what schedules, checkpoints and logs see
  int64_t batches_ = 0, total_steps_ = 0;
  std::unique_ptr<kiln::optim::LRScheduler> sched_;
  std::unique_ptr<kiln::optim::EMA> ema_;
  std::unique_ptr<kiln::amp::GradScaler> scaler_;
  std::unique_ptr<StepGraph> graph_;
  StepProfile profile_;
  Position pos_;
  std::optional<kiln::utils::CsvWriter> csv_;
  std::optional<kiln::utils::SummaryWriter> tb_;
  std::ostream no_output_{nullptr};  // progress bars of ranks other than 0
  std::vector<double> plot_steps_, plot_loss_, plot_lr_, plot_epochs_, plot_acc_;
  std::string ckpt_path_;
  bool writes_checkpoints_ = false;
  kiln::Tensor grad_norm_;  // written by clip_grad_norm (inside the graph with --cuda-graphs)
  double test_acc_ = -1;
  // Host reads of device values by the training steps (the loss, the gradient norm, the ranks'
  // stop agreement): each is a device-to-host sync on a GPU. Counted by read_host.
  int64_t host_reads_ = 0, first_step_ = 0;
  StepTally steps_;  // the syncs (--sync-debug) and the peak memory of the training steps
  StepTally evals_;  // the peak memory of the evaluations
  // the current epoch's log window
  int64_t micro_ = 0, window_samples_ = 0;
  double window_start_ = 0, last_loss_ = 0, sps_ = 0;
  EvalPace eval_pace_;
  double epoch_start_ = 0;   // when the current epoch's training began (train_clock)
  double eval_seconds_ = 0;  // --eval-every: evaluation time inside the epoch, not training time
  bool measured_ = false;    // a loss and a rate exist only from the epoch's first log point on
  // The steady-state rate (--warmup-steps): its window opens when this run's warm-up steps are
  // done, on the training clock, and closes with the run's last step.
  struct SteadyStart {
    double train_seconds;
    int64_t samples;
  };
  int64_t warmup_steps_ = 0;
  std::optional<SteadyStart> steady_start_;
  // Where the current optimizer step began (its first micro-batch, the RNG's state): an
  // out-of-memory stop checkpoints the run as it was there.
  int64_t step_first_batch_ = 0, step_samples_ = 0;
  uint64_t step_rng_seed_ = 0, step_rng_offset_ = 0;
  bool memory_capped_ = false;
};

}  // namespace kiln_train
