// kiln-train's training run (trainer.h).
#include "trainer.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include <kiln/core/debug.h>

#include "parallel.h"

namespace kiln_train {

std::atomic<int> g_interrupted{0};

namespace {

using kiln::Tensor;
namespace optim = kiln::optim;
namespace dist = kiln::distributed;
namespace fs = std::filesystem;

void on_stop_signal(int sig) { g_interrupted = sig; }

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;
}

double default_lr(const Options& o) {
  if (o.lr > 0) return o.lr;
  if (o.optimizer == "sgd" || o.optimizer == "lars") return o.model == "gpt" ? 0.05 : 0.1;
  return o.model == "gpt" ? 2e-3 : 5e-3;  // the CNN: 91.1% after 2 epochs at 5e-3 vs 91.0% at 3e-3
}

std::unique_ptr<optim::LRScheduler> make_schedule(const Options& o, optim::Optimizer& opt, int64_t total_steps) {
  const double lr = default_lr(o);
  // A CUDA graph replays the optimizer kernels with the hyper-parameters of the capture; only the
  // lr lives in device memory, so under --cuda-graphs the momentum/beta1 cycling stays off.
  if (o.schedule == "onecycle")
    return std::make_unique<optim::OneCycleLR>(opt, lr, total_steps,
                                               optim::OneCycleLROptions().cycle_momentum(!o.cuda_graphs));
  if (o.schedule == "cyclic")
    return std::make_unique<optim::CyclicLR>(
        opt, lr / 10, lr, optim::CyclicLROptions().step_size_up(std::max<int64_t>(1, total_steps / 4)));
  if (o.schedule == "cosine")
    return std::make_unique<optim::WarmupCosineLR>(opt, std::max<int64_t>(1, total_steps / 20), total_steps);
  return nullptr;  // constant
}

// The steps left out of the steady-state rate (--warmup-steps): kSteadyWarmup, but never more than a
// fifth of the steps this run takes, and at least 1 (the first step's allocations and autotuning);
// with --cuda-graphs at least the eager steps and the capture.
int64_t steady_warmup(const Options& o, int64_t run_steps, int64_t steps_to_capture) {
  int64_t w = o.warmup_steps >= 0 ? o.warmup_steps : std::max<int64_t>(1, std::min(kSteadyWarmup, run_steps / 5));
  if (o.cuda_graphs) w = std::max(w, steps_to_capture);
  return w;
}

}  // namespace

std::unique_ptr<optim::Optimizer> make_optimizer(const Options& o, const std::vector<Tensor>& params) {
  const double lr = default_lr(o);
  auto wd = [&](double d) { return o.weight_decay >= 0 ? o.weight_decay : d; };
  std::unique_ptr<optim::Optimizer> opt;
  if (o.optimizer == "adamw") {
    opt = std::make_unique<optim::AdamW>(params, optim::AdamWOptions(lr).weight_decay(wd(5e-4)));
  } else if (o.optimizer == "adam") {
    opt = std::make_unique<optim::Adam>(params, optim::AdamOptions(lr).weight_decay(wd(0)));
  } else if (o.optimizer == "sgd") {
    opt =
        std::make_unique<optim::SGD>(params, optim::SGDOptions(lr).momentum(0.9).nesterov(true).weight_decay(wd(5e-4)));
  } else if (o.optimizer == "lamb") {
    opt = std::make_unique<optim::LAMB>(params, optim::LAMBOptions(lr).weight_decay(wd(0.01)));
  } else {
    opt = std::make_unique<optim::LARS>(params, optim::LARSOptions(lr).weight_decay(wd(5e-4)));
  }
  opt->set_fused(o.fused_optimizer);  // docs/guide.md, speed-up 5
  return opt;
}

std::string speedups_summary(const Options& o) {
  std::string s;
  auto add = [&](bool on, const std::string& what) { s += std::string(on ? "  [on]  " : "  [off] ") + what + "\n"; };
  add(o.schedule == "onecycle" || o.schedule == "cyclic", "1cycle / cyclic LR (--schedule " + o.schedule + ")");
  add(o.auto_lr, "LR picked by the LR range test (--auto-lr)");
  add(o.workers > 0, "loader workers (--workers " + std::to_string(o.workers) + ")");
  add(o.pin_memory && kiln::cuda::is_available(), "pinned memory (--pin-memory; page-locked only with a GPU)");
  add(o.amp != "off", "mixed precision (--amp " + o.amp + ")");
  add(o.optimizer == "adamw" || o.optimizer == "lamb" || o.optimizer == "lars",
      "AdamW/LAMB/LARS (--optimizer " + o.optimizer + ")");
  add(o.fused_optimizer, "fused multi-tensor optimizer step (--fused-optimizer)");
  add(o.grad_accum > 1, "gradient accumulation (--grad-accum " + std::to_string(o.grad_accum) + ")");
  add(o.clip_grad > 0, "gradient clipping (--clip-grad)");
  add(o.checkpoint_activations, "activation checkpointing (--checkpoint-activations)");
  add(o.ema > 0, "EMA of weights (--ema)");
  add(o.channels_last, "channels_last (--channels-last)");
  const bool cuda = o.device == "cuda";
  add(cuda && o.cudnn_benchmark, "cuDNN autotuning (--cudnn-benchmark; CUDA only)");
  add(cuda, "TF32 tensor-core math for f32 matmuls and convolutions (CUDA only)");
  add(o.cuda_graphs, "CUDA graphs: the whole step replayed with one launch (--cuda-graphs)");
  if (o.model != "gpt") add(o.normalize_inputs, "input normalisation (--normalize-inputs)");
  add(!o.sync_every_step, "no host sync per step: the loss is read every --log-every steps (--sync-every-step)");
  add(o.grad_to_none, "gradients set to none after each step (--zero-grad none)");
  add(o.eval_no_grad, "evaluation under no_grad (--eval-no-grad)");
  if (o.model == "cnn") add(!o.conv_bias, "no bias before BatchNorm (--conv-bias adds one)");
  add(!kiln::debug::current().any(), "debug APIs off (anomaly detection, sync-debug, deterministic algorithms)");
  add(o.flush_denormal && kiln::flush_denormal(), "denormals flushed to zero on the CPU (--flush-denormal)");
  add(kiln::cpu_isa() != kiln::CpuIsa::baseline,
      std::string("CPU kernels for this processor: ") + kiln::cpu_isa_summary() + " (KILN_CPU_ISA)");
  add(o.distributed, "data parallel over " + std::to_string(o.world_size) +
                         (o.world_size == 1 ? " rank: " : " ranks: ") +
                         (o.zero ? "ZeRO-1 (--zero)" : "DDP, bucketed all-reduce overlapping backward"));
  return s;
}

// ---------------------------------------------------------------- --profile

void StepProfile::before_step(int64_t step, bool first_micro) {
  if (o_.profile > 0 && first_micro && !prof_ && !done_ && step == kProfileWarmup) prof_.emplace();
}

void StepProfile::after_step(int64_t step, bool main_rank) {
  if (!prof_ || step < kProfileWarmup + o_.profile) return;
  if (o_.device == "cuda") kiln::cuda::synchronize();
  prof_->stop();
  done_ = true;
  if (main_rank) {
    prof_->write_chrome_trace(o_.out + "/trace.json");
    const std::string table = prof_->table(30);
    std::ofstream(o_.out + "/profile.txt") << table;
    std::printf("\nprofile of steps %lld-%lld:\n%s(wrote %s/trace.json and %s/profile.txt)\n",
                static_cast<long long>(kProfileWarmup + 1), static_cast<long long>(step), table.c_str(), o_.out.c_str(),
                o_.out.c_str());
  }
  prof_.reset();
}

// ---------------------------------------------------------------- StepTally

void StepTally::start() {
  mark_ = kiln::cuda::sync_count();
  if (cuda_) {
    reserved_peak_ = reserved_peak();  // the reset below clears the allocator's own
    kiln::cuda::reset_peak_memory_stats(device_);
    base_ = static_cast<int64_t>(kiln::cuda::memory_stats(device_).allocated_bytes);
  } else {
    kiln::reset_cpu_peak_memory();
    base_ = static_cast<int64_t>(kiln::cpu_memory_stats().allocated_bytes);
  }
}

void StepTally::stop() {
  syncs_ += kiln::cuda::sync_count() - mark_;
  const auto peak = static_cast<int64_t>(cuda_ ? kiln::cuda::memory_stats(device_).peak_allocated_bytes
                                               : kiln::cpu_memory_stats().peak_allocated_bytes);
  peak_ = std::max(peak_, peak);
  growth_ = std::max(growth_, peak - base_);
}

int64_t StepTally::reserved_peak() const {
  return std::max(reserved_peak_, static_cast<int64_t>(kiln::cuda::memory_stats(device_).peak_reserved_bytes));
}

// ---------------------------------------------------------------- setup

Trainer::Trainer(Options o, std::unique_ptr<Task> task)
    : o_(std::move(o)),
      main_rank_(o_.rank == 0),
      tty_(kiln::utils::stdout_is_tty()),
      cuda_(o_.device == "cuda"),
      task_(std::move(task)),
      profile_(o_),
      steps_(cuda_, o_.cuda_device),
      evals_(cuda_, o_.cuda_device) {
  // --sync-debug (docs/guide.md, speed-up 7): on from here, so the setup's uploads are not reported
  if (o_.sync_debug != "off")
    kiln::cuda::set_sync_debug_mode(o_.sync_debug == "error" ? kiln::cuda::SyncDebugMode::Error
                                                             : kiln::cuda::SyncDebugMode::Warn);
  if (o_.detect_anomaly) kiln::autograd::set_detect_anomaly(true);  // docs/guide.md, speed-up 13
  params_ = task_->model().parameters();
  make_optimizers();
  batches_ = task_->train_loader().size();
  const int64_t steps_per_epoch = batches_ / o_.grad_accum;
  KILN_CHECK(steps_per_epoch > 0, "--grad-accum ", o_.grad_accum, " exceeds the ", batches_, " batches of an epoch");
  total_steps_ = steps_per_epoch * o_.epochs;
  if (o_.max_steps > 0) total_steps_ = std::min(total_steps_, o_.max_steps);
  sched_ = make_schedule(o_, *opt_ref_, total_steps_);
  if (o_.ema > 0) ema_ = std::make_unique<optim::EMA>(task_->model(), o_.ema);
  // Loss scaling for f16 only (bf16 has f32's range); a no-op otherwise and on the CPU.
  scaler_ = std::make_unique<kiln::amp::GradScaler>(
      kiln::amp::GradScalerOptions().enabled(o_.amp == "fp16" && kiln::cuda::is_available()));
  if (main_rank_)
    for (const auto& w : kiln::nn::lint(task_->model(), false)) std::printf("%s\n", w.c_str());
  if (!o_.resume.empty()) {
    pos_ = load_checkpoint(rank_path(o_, o_.resume), o_, task_->model(), *opt_ref_, sched_.get(), ema_.get());
    if (main_rank_)
      std::printf("resumed from %s at epoch %lld, batch %lld, step %lld\n", o_.resume.c_str(),
                  static_cast<long long>(pos_.epoch), static_cast<long long>(pos_.batch_in_epoch),
                  static_cast<long long>(pos_.step));
  }
  first_step_ = pos_.step;
  open_logs();
  print_header();
  ckpt_path_ = rank_path(o_, o_.out + "/checkpoint.safetensors");
  writes_checkpoints_ = main_rank_ || zero_;
  graph_ = std::make_unique<StepGraph>(o_.cuda_graphs, *opt_ref_);
  warmup_steps_ = steady_warmup(o_, total_steps_ - pos_.step, graph_->steps_to_capture());
  if (warmup_steps_ == 0) steady_start_ = SteadyStart{pos_.train_seconds, pos_.samples};
}

// Data parallel: DDP averages the gradients during backward (rank 0's parameters and buffers are
// copied to every rank first); --zero instead shards the optimizer, whose step reduce-scatters the
// gradients and all-gathers the parameters.
void Trainer::make_optimizers() {
  auto& model = task_->model();
  if (o_.distributed && !o_.zero) {
    std::shared_ptr<kiln::nn::Module> shared(&model, [](kiln::nn::Module*) {});  // the task owns it
    ddp_ = std::make_unique<dist::DistributedDataParallel>(
        shared, dist::DistributedDataParallelOptions().bucket_cap_mb(o_.ddp_bucket_mb));
  }
  if (o_.zero && o_.distributed) {
    for (auto& t : model.parameters()) dist::broadcast(t, 0);
    for (auto& t : model.buffers()) dist::broadcast(t, 0);
    const Options& o = o_;
    zero_ = std::make_unique<dist::ZeroRedundancyOptimizer>(
        params_, [&o](std::vector<Tensor> shard) { return make_optimizer(o, shard); });
    opt_ref_ = &zero_->local_optimizer();  // schedules, checkpoints and logs see this rank's slices
  } else {
    opt_ = make_optimizer(o_, params_);
    opt_ref_ = opt_.get();
  }
}

// Rank 0 alone logs, plots and writes the model (every rank writes checkpoints with --zero).
void Trainer::open_logs() {
  fs::create_directories(o_.out);
  if (!main_rank_) return;
  const bool appending = !o_.resume.empty();
  csv_.emplace(
      o_.out + "/metrics.csv",
      std::vector<std::string>{"step", "epoch", "loss", "lr", "grad_norm", "samples_per_second", "test_accuracy"},
      appending);
  tb_.emplace(o_.out);
}

void Trainer::print_header() {
  if (!main_rank_) return;
  std::printf("kiln-train: %s on %s, %lld parameters, %lld batches/epoch of %lld%s, %lld epochs, %s + %s\n",
              o_.model.c_str(), o_.device.c_str(), static_cast<long long>(task_->model().parameter_count()),
              static_cast<long long>(batches_), static_cast<long long>(o_.batch_size),
              o_.world_size > 1 ? (" per rank x " + std::to_string(o_.world_size) + " ranks").c_str() : "",
              static_cast<long long>(o_.epochs), o_.optimizer.c_str(), o_.schedule.c_str());
  std::printf("speed-ups:\n%s", speedups_summary(o_).c_str());
  if (!kiln::debug::summary().empty()) std::printf("%s\n", kiln::debug::summary().c_str());
}

// ---------------------------------------------------------------- training

int Trainer::run() {
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);  // what job schedulers send before killing a job
  for (int64_t epoch = pos_.epoch; epoch < o_.epochs; ++epoch) {
    if (auto code = train_epoch(epoch)) return *code;
    end_epoch(epoch);
    if (o_.max_steps > 0 && pos_.step >= o_.max_steps) break;
  }
  return finish();
}

std::optional<int> Trainer::train_epoch(int64_t epoch) {
  auto& loader = task_->train_loader();
  loader.set_epoch(epoch);
  kiln::utils::Progress progress(batches_, "epoch " + std::to_string(epoch + 1) + "/" + std::to_string(o_.epochs),
                                 main_rank_ ? std::cout : no_output_, tty_ && main_rank_);
  int64_t b = 0;
  micro_ = window_samples_ = 0;
  window_start_ = epoch_start_ = now_seconds();
  last_loss_ = sps_ = eval_seconds_ = 0;
  measured_ = false;
  steps_.start();
  for (auto& batch : loader) {
    if (b < pos_.batch_in_epoch) {  // resuming mid-epoch: these batches were trained already
      ++b;
      continue;
    }
    if (micro_ % o_.grad_accum == 0) {  // a new optimizer step begins
      auto& gen = kiln::default_generator(kiln::Device::cpu());
      step_first_batch_ = b;
      step_samples_ = pos_.samples;
      step_rng_seed_ = gen.seed();
      step_rng_offset_ = gen.offset();
      if (!memory_capped_ && o_.memory_fraction < 1 && pos_.step >= o_.memory_fraction_from_step)
        apply_memory_cap(true);
    }
    profile_.before_step(pos_.step, micro_ % o_.grad_accum == 0);
    std::optional<kiln::profiler::Range> step_range;
    if (profile_.active()) step_range.emplace("step");
    ++micro_;
    const bool last_micro = micro_ % o_.grad_accum == 0;
    Tensor loss;
    try {
      if (graph_->active()) {
        // CUDA graphs (docs/guide.md, speed-up 22): after a few eager warm-up steps (optimizer state, cuDNN
        // autotuning), the whole step is captured once and replayed with one launch per step.
        loss = graph_->step(batch, [&](const kiln::data::Batch& bt) { return train_micro(bt, true); });
      } else {
        loss = train_micro(batch, last_micro);
        if (last_micro) graph_->count_eager_step();
      }
      if (last_micro) finish_step();
    } catch (const kiln::OutOfMemoryError& e) {
      return stop_out_of_memory(e, epoch, progress);
    }
    ++b;
    pos_.samples += task_->samples_per_batch(batch);
    window_samples_ += task_->samples_per_batch(batch);
    if (last_micro) {
      step_range.reset();
      profile_.after_step(pos_.step, main_rank_);
      if (auto code = after_step(loss, epoch, b + o_.grad_accum > batches_, progress)) return code;
    }
    if (measured_) {
      progress.update(b, {{"loss", last_loss_}}, sps_);
    } else {
      progress.update(b);  // no loss read yet (it is read every --log-every steps): none shown
    }
    if (auto code = stop_if_signalled(epoch, b, last_micro, progress)) return code;
    if (o_.max_steps > 0 && pos_.step >= o_.max_steps) break;
  }
  if (cuda_) kiln::cuda::synchronize();  // the epoch's time includes its queued GPU work
  steps_.stop();
  pos_.train_seconds = train_clock();
  if (measured_) {
    progress.finish({{"loss", last_loss_}});
  } else {
    progress.finish();
  }
  return std::nullopt;
}

// One micro-batch: forward (under autocast), scaled backward; on the last micro-batch of a step
// also clipping and the (possibly skipped) optimizer step. Everything here stays on the device,
// which is what lets --cuda-graphs capture it.
Tensor Trainer::train_micro(const kiln::data::Batch& batch, bool last_micro) {
  Tensor l;
  {
    // Mixed precision (docs/guide.md, speed-up 4): matmuls/convs in bf16/f16, losses and norms in f32.
    std::optional<kiln::amp::Autocast> autocast;
    if (o_.amp != "off") autocast.emplace(o_.amp == "bf16" ? kiln::DType::BF16 : kiln::DType::F16);
    if (ddp_) ddp_->before_forward();  // rank 0's buffers (BatchNorm statistics) to every rank
    l = task_->loss(batch);
  }
  {
    // Accumulating micro-batches issue no collective; the last one reduces their sum.
    std::optional<dist::DistributedDataParallel::NoSyncGuard> no_sync;
    if (ddp_ && !last_micro) no_sync.emplace(ddp_->no_sync());
    scaler_->scale(o_.grad_accum > 1 ? l / static_cast<double>(o_.grad_accum) : l).backward();
  }
  if (last_micro) {
    if (o_.clip_grad > 0) {
      scaler_->unscale(*opt_);  // clip the true gradients
      grad_norm_ = optim::clip_grad_norm(params_, o_.clip_grad);
    }
    if (zero_) {
      zero_->step();
    } else {
      scaler_->step(*opt_);  // skipped on the device when a gradient overflowed (f16)
    }
  }
  return l;
}

void Trainer::finish_step() {
  scaler_->update();
  if (zero_) {
    zero_->zero_grad(o_.grad_to_none);
  } else if (!graph_->captured()) {
    opt_->zero_grad(o_.grad_to_none);  // a captured step owns its gradients (docs/guide.md, speed-up 11)
  }
  if (sched_) sched_->step();
  if (ema_) ema_->update();
  ++pos_.step;
}

// After an optimizer step: --sync-every-step's read, the log point, and --eval-every's evaluation
// (not at the epoch's last step, where end_epoch evaluates).
std::optional<int> Trainer::after_step(const Tensor& loss, int64_t epoch, bool last_of_epoch,
                                       kiln::utils::Progress& progress) {
  if (!steady_start_ && pos_.step - first_step_ == warmup_steps_) {
    if (cuda_) kiln::cuda::synchronize();  // the warm-up's queued GPU work is warm-up time
    steady_start_ = SteadyStart{train_clock(), pos_.samples};
  }
  // A naive loop's `running_loss += loss.item()`: on a GPU the host waits for the step to finish
  // before it can queue the next one (docs/guide.md, speed-up 7).
  if (o_.sync_every_step) last_loss_ = read_host(loss);
  if (pos_.step % o_.log_every == 0 || pos_.step == total_steps_)
    if (auto code = log_point(loss, epoch, progress)) return code;
  const bool ends = last_of_epoch || pos_.step == total_steps_;
  if (o_.eval_every > 0 && pos_.step % o_.eval_every == 0 && !ends) {
    steps_.stop();
    const double spent = evaluate_and_log(epoch);
    eval_seconds_ += spent;
    window_start_ += spent;  // nor does it slow the throughput window
    steps_.start();
  }
  return std::nullopt;
}

// A device value read on the host, counted: one device-to-host sync on a GPU.
double Trainer::read_host(const Tensor& t) {
  ++host_reads_;
  return t.item<double>();
}

// Reads the loss (the only host read in the loop, once per log interval, unless --sync-every-step
// read it already) and logs it.
std::optional<int> Trainer::log_point(const Tensor& loss, int64_t epoch, kiln::utils::Progress& progress) {
  if (!o_.sync_every_step) last_loss_ = read_host(loss);
  const double t = now_seconds();
  sps_ = static_cast<double>(window_samples_) / (t - window_start_);
  measured_ = true;
  window_start_ = t;
  window_samples_ = 0;
  const double lr = opt_ref_->param_groups()[0].lr();
  const double gn = grad_norm_.defined() ? read_host(grad_norm_) : -1;
  // A non-finite loss or gradient norm only gets worse: stop with the step that showed it. Checked
  // where the loss is read anyway (every --log-every steps), so no step pays a host sync for it.
  // With loss scaling (fp16) a non-finite gradient is the GradScaler's to skip (the summary counts
  // those steps), but a non-finite loss is not: scaling does not change the forward pass. Under a
  // launcher the rank that sees it exits and the launcher stops the others.
  const bool loss_bad = !std::isfinite(last_loss_);
  if (loss_bad || (!scaler_->is_enabled() && grad_norm_.defined() && !std::isfinite(gn))) {
    progress.finish();
    const double bad = loss_bad ? last_loss_ : gn;
    std::fprintf(stderr,
                 "kiln-train: the %s is %s at step %lld (epoch %lld; checked every --log-every %lld steps); "
                 "stopping before the optimizer turns the weights into NaN. Lower --lr, or check the data\n",
                 loss_bad ? "loss" : "gradient norm",
                 std::isnan(bad) ? "nan"
                 : bad > 0       ? "inf"
                                 : "-inf",
                 static_cast<long long>(pos_.step), static_cast<long long>(epoch + 1),
                 static_cast<long long>(o_.log_every));
    return 3;
  }
  if (csv_)
    csv_->write_row({pos_.step, epoch + 1, last_loss_, lr, gn >= 0 ? kiln::utils::CsvCell(gn) : kiln::utils::CsvCell(),
                     sps_ * o_.world_size, kiln::utils::CsvCell()});
  std::vector<std::pair<std::string, double>> scalars = {
      {"train/loss", last_loss_}, {"train/lr", lr}, {"train/samples_per_second", sps_ * o_.world_size}};
  if (gn >= 0) scalars.push_back({"train/grad_norm", gn});
  if (scaler_->is_enabled()) scalars.push_back({"train/loss_scale", scaler_->get_scale()});
  if (tb_) tb_->add_scalars(scalars, pos_.step);
  plot_steps_.push_back(static_cast<double>(pos_.step));
  plot_loss_.push_back(last_loss_);
  plot_lr_.push_back(lr);
  return std::nullopt;
}

double Trainer::train_clock() const { return pos_.train_seconds + now_seconds() - epoch_start_ - eval_seconds_; }

// SIGINT/SIGTERM: a checkpoint, then exit 128 + signal. Several ranks stop together: the signal
// may reach them at different steps, so they agree at the log points (where the loss is read
// anyway), all at the same step.
std::optional<int> Trainer::stop_if_signalled(int64_t epoch, int64_t batch, bool last_micro,
                                              kiln::utils::Progress& progress) {
  int stop_signal = g_interrupted;
  if (o_.world_size > 1) {
    const bool agree = last_micro && pos_.step % o_.log_every == 0;
    if (agree) ++host_reads_;  // max_over_ranks reads the all-reduced value back on the host
    stop_signal = agree ? max_over_ranks(o_, g_interrupted, device_of(o_)) : 0;
  }
  if (stop_signal == 0) return std::nullopt;
  pos_.epoch = epoch;
  pos_.batch_in_epoch = batch;
  pos_.train_seconds = train_clock();
  if (writes_checkpoints_) save_checkpoint(ckpt_path_, o_, task_->model(), *opt_ref_, sched_.get(), ema_.get(), pos_);
  progress.finish();
  if (main_rank_)
    std::printf("interrupted (%s): wrote %s; continue with --resume %s\n",
                stop_signal == SIGTERM ? "SIGTERM" : "SIGINT", ckpt_path_.c_str(), ckpt_path_.c_str());
  finish_parallel(o_);
  return 128 + stop_signal;
}

// --memory-fraction: the cap on what this run may hold, as a fraction of the device's memory (the
// GPU's, or the machine's RAM for the CPU allocator).
void Trainer::apply_memory_cap(bool on) {
  memory_capped_ = on;
  const double f = on ? o_.memory_fraction : 1.0;
  if (cuda_) {
    kiln::cuda::set_per_process_memory_fraction(f, o_.cuda_device);
  } else {
    const double ram = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGESIZE));
    kiln::set_cpu_memory_limit(f >= 1 ? 0 : std::max<size_t>(1, static_cast<size_t>(f * ram)));
  }
}

// Out of memory inside a step: the run is checkpointed as it was when that optimizer step began
// (its first batch, the RNG), which the step had not changed yet, so --resume continues exactly.
int Trainer::stop_out_of_memory(const kiln::OutOfMemoryError& e, int64_t epoch, kiln::utils::Progress& progress) {
  const std::string why = e.what();
  if (memory_capped_) apply_memory_cap(false);  // writing the checkpoint needs memory too
  opt_ref_->zero_grad(true);
  kiln::default_generator(kiln::Device::cpu()).set_state(step_rng_seed_, step_rng_offset_);
  const int64_t first = step_first_batch_;
  pos_.epoch = epoch;
  pos_.batch_in_epoch = first;
  pos_.samples = step_samples_;
  pos_.train_seconds = train_clock();
  progress.finish();
  if (writes_checkpoints_) save_checkpoint(ckpt_path_, o_, task_->model(), *opt_ref_, sched_.get(), ema_.get(), pos_);
  std::fprintf(stderr,
               "kiln-train: out of memory at step %lld (epoch %lld, batch %lld): %s\n"
               "kiln-train: wrote %s as of the start of that step; continue with --resume %s, with more memory "
               "(a larger --memory-fraction) or with less need (a smaller --batch-size, --amp bf16, "
               "--checkpoint-activations)\n",
               static_cast<long long>(pos_.step), static_cast<long long>(epoch + 1), static_cast<long long>(first),
               why.substr(0, why.find('\n')).c_str(), ckpt_path_.c_str(), ckpt_path_.c_str());
  finish_parallel(o_);
  return 5;
}

// The epoch's checkpoints (the latest, and one per epoch to go back to); rank 0 evaluates (the
// replicas are identical) and logs.
void Trainer::end_epoch(int64_t epoch) {
  pos_.epoch = epoch + 1;
  pos_.batch_in_epoch = 0;
  if (writes_checkpoints_) {
    save_checkpoint(ckpt_path_, o_, task_->model(), *opt_ref_, sched_.get(), ema_.get(), pos_);
    fs::copy_file(ckpt_path_, rank_path(o_, o_.out + "/checkpoint-epoch" + std::to_string(epoch + 1) + ".safetensors"),
                  fs::copy_options::overwrite_existing);
  }
  if (!main_rank_) return;
  evaluate_and_log(epoch);
  const auto& st = task_->train_loader().stats();
  std::printf("epoch %lld: test accuracy %.2f%%%s, loader wait %.1f%% of the epoch\n",
              static_cast<long long>(epoch + 1), 100 * test_acc_, ema_ ? " (EMA weights)" : "",
              100 * st.wait_fraction());
  tb_->flush();
}

// Rank 0 evaluates (the replicas are identical) and logs the test accuracy at this step: after
// each epoch, and every --eval-every steps. Returns the seconds it took (0 on other ranks).
double Trainer::evaluate_and_log(int64_t epoch) {
  if (!main_rank_) return 0;
  if (cuda_) kiln::cuda::synchronize();  // the queued training work is training time, not evaluation
  const double start = now_seconds();
  {
    std::optional<optim::EMA::Swap> swap;
    if (ema_) swap.emplace(*ema_);
    evals_.start();
    const Evaluation e = task_->evaluate();
    evals_.stop();
    test_acc_ = e.accuracy;
    eval_pace_.add(e.samples, now_seconds() - start);
  }
  csv_->write_row({pos_.step, epoch + 1, last_loss_, opt_ref_->param_groups()[0].lr(), kiln::utils::CsvCell(),
                   kiln::utils::CsvCell(), test_acc_});
  tb_->add_scalar("test/accuracy", test_acc_, pos_.step);
  plot_epochs_.push_back(static_cast<double>(pos_.step));
  plot_acc_.push_back(test_acc_);
  return now_seconds() - start;
}

// The summary's rates beside samples_per_second (the whole run's, set-up steps included): the
// steady state's, over the steps after the warm-up, on the same training clock (evaluation and
// checkpoints left out, the device's work finished at both ends). The job's, like the whole run's.
void Trainer::add_rates(nlohmann::ordered_json& summary) {
  const int64_t steps = pos_.step - first_step_, steady_steps = steps - warmup_steps_;
  const double whole = summary["samples_per_second"].get<double>();
  summary["warmup_steps"] = warmup_steps_;
  const double seconds = steady_start_ ? pos_.train_seconds - steady_start_->train_seconds : 0;
  if (steady_steps < 1 || seconds <= 0) {
    for (const char* k : {"steady_steps", "steady_seconds", "steady_samples_per_second"}) summary[k] = nullptr;
    std::printf(
        "throughput: %.1f samples/s over the whole run; no steady-state rate: the run took %lld step%s, "
        "none after its %lld warm-up steps (--warmup-steps)\n",
        whole, static_cast<long long>(steps), steps == 1 ? "" : "s", static_cast<long long>(warmup_steps_));
    return;
  }
  const double steady = static_cast<double>(pos_.samples - steady_start_->samples) * o_.world_size / seconds;
  summary["steady_steps"] = steady_steps;
  summary["steady_seconds"] = seconds;
  summary["steady_samples_per_second"] = steady;
  std::printf(
      "throughput: %.1f samples/s steady (the last %lld steps, after %lld warm-up steps), %.1f over the "
      "whole run\n",
      steady, static_cast<long long>(steady_steps), static_cast<long long>(warmup_steps_), whole);
}

// The summary's facts about the steps: the learning rate they trained at, how often they read a
// device value on the host (and with --sync-debug how many syncs the runtime saw), and what the
// inputs look like after the loader's transforms.
void Trainer::add_step_facts(nlohmann::ordered_json& summary) {
  const int64_t steps = pos_.step - first_step_;
  summary["steps"] = pos_.step;
  summary["max_lr"] = default_lr(o_);
  if (o_.auto_lr) summary["lr_find_seconds"] = o_.lr_find_seconds;
  if (steps > 0) {
    summary["host_reads_per_step"] = static_cast<double>(host_reads_) / static_cast<double>(steps);
    if (o_.sync_debug != "off")
      summary["implicit_syncs_per_step"] = static_cast<double>(steps_.syncs()) / static_cast<double>(steps);
  }
  if (scaler_->is_enabled()) summary["skipped_steps"] = scaler_->num_skipped_steps();  // fp16: Inf/NaN gradients
  summary["train_peak_allocated_bytes"] = steps_.peak_bytes();
  summary["eval_peak_growth_bytes"] = evals_.peak_growth_bytes();
  if (const double pace = eval_pace_.samples_per_second(); pace > 0) summary["eval_samples_per_second"] = pace;
  if (const auto stats = task_->input_stats()) {
    summary["input_mean"] = stats->first;
    summary["input_std"] = stats->second;
  }
}

// The model, the plot, a sample (the GPT) and the JSON summary, kiln-train's last line.
int Trainer::finish() {
  auto& model = task_->model();
  check_replicas_identical(o_, model, device_of(o_));
  if (!main_rank_) {
    finish_parallel(o_);
    return 0;
  }
  if (ema_) ema_->copy_to_model();
  kiln::save(model, o_.out + "/model.safetensors", {{"model", o_.model}});
  std::vector<kiln::utils::Series> series = {{"train loss", plot_steps_, plot_loss_},
                                             {"test accuracy", plot_epochs_, plot_acc_},
                                             {"learning rate", plot_steps_, plot_lr_}};
  kiln::utils::write_line_plot_png(o_.out + "/plot.png", "kiln-train " + o_.model, series);
  std::string sample = task_->sample();
  if (!sample.empty()) std::printf("--- sample ---\n%s\n--------------\n", sample.c_str());
  std::printf("wrote %s/{metrics.csv, plot.png, model.safetensors, checkpoint*.safetensors} and TensorBoard events\n",
              o_.out.c_str());
  // Every rank trains the same number of samples (equal shards, drop_last): the job's throughput
  // is rank 0's times the world size.
  const double sps_total =
      pos_.train_seconds > 0 ? static_cast<double>(pos_.samples) * o_.world_size / pos_.train_seconds : 0;
  nlohmann::ordered_json summary = {
      {"model", o_.model},
      {"device", o_.device},
      {"epochs", o_.epochs},
      {"train_seconds", pos_.train_seconds},
      {"samples_per_second", sps_total},
      {"cpu_isa", kiln::cpu_isa_name(kiln::cpu_isa())},
      {"kiln_commit", kiln::build_commit()},
      {"test_accuracy", test_acc_},
      {"world_size", o_.world_size},
      {"peak_memory_bytes", cuda_ ? std::max(steps_.reserved_peak(), evals_.reserved_peak()) : peak_rss_bytes()}};
  if (cuda_) summary["peak_host_memory_bytes"] = peak_rss_bytes();
  add_rates(summary);
  add_step_facts(summary);
  finish_parallel(o_);
  std::cout << summary.dump() << std::endl;
  return 0;
}

}  // namespace kiln_train
