// kiln-train: the main job. Trains a model-zoo model with every speed-up switchable from the
// command line, evaluates it each epoch, and writes metrics, TensorBoard events, a plot, the
// final model and resumable checkpoints. The last line of stdout is a JSON summary.
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <omp.h>

#include <optional>

#include <kiln/core/debug.h>
#include <kiln/kiln.h>
#include <kiln/utils/utils.h>

#include "options.h"
#include "parallel.h"
#include "step_graph.h"
#include "tasks.h"

namespace {

using kiln::Tensor;
using kiln_train::Options;
namespace optim = kiln::optim;
namespace dist = kiln::distributed;
namespace fs = std::filesystem;

// The signal that asked to stop (SIGINT or SIGTERM, handled alike: checkpoint and exit 128 + signal).
std::atomic<int> g_interrupted{0};
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

std::unique_ptr<optim::Optimizer> make_optimizer(const Options& o, const std::vector<Tensor>& params) {
  const double lr = default_lr(o);
  auto wd = [&](double d) { return o.weight_decay >= 0 ? o.weight_decay : d; };
  if (o.optimizer == "adamw") return std::make_unique<optim::AdamW>(params, optim::AdamWOptions(lr).weight_decay(wd(5e-4)));
  if (o.optimizer == "adam") return std::make_unique<optim::Adam>(params, optim::AdamOptions(lr).weight_decay(wd(0)));
  if (o.optimizer == "sgd")
    return std::make_unique<optim::SGD>(params, optim::SGDOptions(lr).momentum(0.9).nesterov(true).weight_decay(wd(5e-4)));
  if (o.optimizer == "lamb") return std::make_unique<optim::LAMB>(params, optim::LAMBOptions(lr).weight_decay(wd(0.01)));
  return std::make_unique<optim::LARS>(params, optim::LARSOptions(lr).weight_decay(wd(5e-4)));
}

std::unique_ptr<optim::LRScheduler> make_schedule(const Options& o, optim::Optimizer& opt, int64_t total_steps) {
  const double lr = default_lr(o);
  // A CUDA graph replays the optimizer kernels with the hyper-parameters of the capture; only the
  // lr lives in device memory, so under --cuda-graphs the momentum/beta1 cycling stays off.
  if (o.schedule == "onecycle")
    return std::make_unique<optim::OneCycleLR>(opt, lr, total_steps,
                                               optim::OneCycleLROptions().cycle_momentum(!o.cuda_graphs));
  if (o.schedule == "cyclic")
    return std::make_unique<optim::CyclicLR>(opt, lr / 10, lr, optim::CyclicLROptions().step_size_up(std::max<int64_t>(1, total_steps / 4)));
  if (o.schedule == "cosine") return std::make_unique<optim::WarmupCosineLR>(opt, std::max<int64_t>(1, total_steps / 20), total_steps);
  return nullptr;  // constant
}

// ---------------------------------------------------------------- checkpoints

struct Position {
  int64_t epoch = 0;           // the epoch to run next (or in progress)
  int64_t batch_in_epoch = 0;  // batches of it already trained
  int64_t step = 0;            // optimizer steps so far
  double train_seconds = 0;
  int64_t samples = 0;
};

nlohmann::json identity(const Options& o) {
  // batch_size is this rank's share: with the world size it names the global batch.
  return {{"model", o.model}, {"optimizer", o.optimizer}, {"batch_size", o.batch_size}, {"schedule", o.schedule},
          {"epochs", o.epochs}, {"grad_accum", o.grad_accum}, {"ema", o.ema}, {"channels_last", o.channels_last},
          {"world_size", o.world_size}, {"zero", o.zero}};
}

void save_checkpoint(const std::string& path, const Options& o, kiln::nn::Module& model, optim::Optimizer& opt,
                     optim::LRScheduler* sched, optim::EMA* ema, const Position& pos) {
  kiln::nn::StateDict d;
  for (auto& [k, v] : model.state_dict()) d.insert("model." + k, v);
  for (auto& [k, v] : opt.state_dict().flatten()) d.insert("optim." + k, v);
  if (ema)
    for (auto& [k, v] : ema->state_dict()) d.insert(k, v);
  auto& gen = kiln::default_generator(kiln::Device::cpu());
  nlohmann::json meta = {{"epoch", pos.epoch}, {"batch_in_epoch", pos.batch_in_epoch}, {"step", pos.step},
                         {"train_seconds", pos.train_seconds}, {"samples", pos.samples},
                         {"rng_seed", std::to_string(gen.seed())}, {"rng_offset", std::to_string(gen.offset())},
                         {"identity", identity(o)}};
  if (sched) {
    auto s = sched->state_dict();
    meta["scheduler"] = {{"last_step", s.last_step}, {"base_lrs", s.base_lrs}, {"last_lrs", s.last_lrs}};
  }
  kiln::save(d, path, {{"kiln-train", meta.dump()}});
}

Position load_checkpoint(const std::string& path, const Options& o, kiln::nn::Module& model, optim::Optimizer& opt,
                         optim::LRScheduler* sched, optim::EMA* ema) {
  kiln::Metadata meta_raw;
  kiln::nn::StateDict d = kiln::load(path, &meta_raw);
  KILN_CHECK(meta_raw.count("kiln-train"), "--resume: '", path, "' is a safetensors file but not a kiln-train ",
             "checkpoint (no kiln-train metadata)");
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(meta_raw.at("kiln-train"));
  } catch (const std::exception& e) {
    KILN_FAIL("--resume: '", path, "': the checkpoint's metadata is corrupt: ", e.what());
  }
  auto want = identity(o), have = meta.value("identity", nlohmann::json::object());
  std::string diffs;
  for (auto& [k, v] : want.items()) {
    if (have.contains(k) && have[k] == v) continue;
    diffs += (diffs.empty() ? "" : ", ") + k + "=" + have.value(k, nlohmann::json("?")).dump() + " (this run: " +
             v.dump() + ")";
  }
  KILN_CHECK(diffs.empty(), "--resume: '", path, "' was written with other settings: ", diffs,
             "; resume with the same settings");
  kiln::nn::StateDict model_sd, ema_sd;
  std::vector<std::pair<std::string, Tensor>> optim_items;
  for (auto& [k, v] : d) {
    if (k.rfind("model.", 0) == 0) model_sd.insert(k.substr(6), v);
    else if (k.rfind("optim.", 0) == 0) optim_items.emplace_back(k.substr(6), v);
    else if (k.rfind("ema.", 0) == 0) ema_sd.insert(k, v);
  }
  try {
    model.load_state_dict(model_sd, true);
    opt.load_state_dict(optim::OptimizerStateDict::unflatten(opt.state_dict().optimizer, optim_items));
    if (ema) ema->load_state_dict(ema_sd);
  } catch (const kiln::Error& e) {
    KILN_FAIL("--resume: '", path, "' does not match this model: ", e.what());
  }
  if (sched) {
    KILN_CHECK(meta.contains("scheduler"), "--resume: '", path, "' has no scheduler state");
    optim::SchedulerStateDict s;
    s.last_step = meta["scheduler"]["last_step"].get<int64_t>();
    s.base_lrs = meta["scheduler"]["base_lrs"].get<std::vector<double>>();
    s.last_lrs = meta["scheduler"]["last_lrs"].get<std::vector<double>>();
    sched->load_state_dict(s);
  }
  kiln::default_generator(kiln::Device::cpu())
      .set_state(std::stoull(meta["rng_seed"].get<std::string>()), std::stoull(meta["rng_offset"].get<std::string>()));
  Position p;
  p.epoch = meta["epoch"].get<int64_t>();
  p.batch_in_epoch = meta["batch_in_epoch"].get<int64_t>();
  p.step = meta["step"].get<int64_t>();
  p.train_seconds = meta.value("train_seconds", 0.0);
  p.samples = meta.value("samples", int64_t{0});
  return p;
}

// ---------------------------------------------------------------- the LR range test

int find_lr(const Options& o, kiln_train::Task& task) {
  auto& model = task.model();
  auto opt = make_optimizer(o, model.parameters());
  auto& loader = task.train_loader();
  auto it = loader.begin();
  auto step = [&]() {
    if (it == loader.end()) it = loader.begin();
    Tensor loss = task.loss(*it);
    loss.backward();
    opt->step();
    opt->zero_grad();
    ++it;
    return loss.item<double>();
  };
  auto r = optim::lr_range_test(*opt, step);
  fs::create_directories(o.out);
  kiln::utils::CsvWriter csv(o.out + "/lr_find.csv", {"lr", "loss", "smoothed_loss"});
  for (size_t i = 0; i < r.lrs.size(); ++i) csv.write_row({r.lrs[i], r.losses[i], r.smoothed[i]});
  kiln::utils::Series s{"smoothed loss", r.lrs, r.smoothed};
  s.log_x = true;
  kiln::utils::write_line_plot_png(o.out + "/lr_find.png", "LR range test", {s},
                                   kiln::utils::PlotOptions().x_label("learning rate"));
  std::printf("LR range test: %zu steps from %.1e%s; steepest descent at lr = %.3g (try it as --lr, or up to ~10x "
              "it as the max LR of --schedule onecycle)\n",
              r.lrs.size(), r.lrs.front(), r.diverged ? ", stopped at divergence" : "", r.suggested_lr);
  std::printf("wrote %s/lr_find.csv and %s/lr_find.png\n", o.out.c_str(), o.out.c_str());
  std::printf("%s\n", nlohmann::json{{"model", o.model}, {"suggested_lr", r.suggested_lr}}.dump().c_str());
  return 0;
}

std::string speedups_summary(const Options& o) {
  std::string s;
  auto add = [&](bool on, const std::string& what) { s += std::string(on ? "  [on]  " : "  [off] ") + what + "\n"; };
  add(o.schedule == "onecycle" || o.schedule == "cyclic", "1cycle / cyclic LR (--schedule " + o.schedule + ")");
  add(o.workers > 0, "loader workers (--workers " + std::to_string(o.workers) + ")");
  add(o.pin_memory && kiln::cuda::is_available(), "pinned memory (--pin-memory; page-locked only with a GPU)");
  add(o.amp != "off", "mixed precision (--amp " + o.amp + ")");
  add(o.optimizer == "adamw" || o.optimizer == "lamb" || o.optimizer == "lars", "AdamW/LAMB/LARS, fused multi-tensor step (--optimizer " + o.optimizer + ")");
  add(o.grad_accum > 1, "gradient accumulation (--grad-accum " + std::to_string(o.grad_accum) + ")");
  add(o.clip_grad > 0, "gradient clipping (--clip-grad)");
  add(o.checkpoint_activations, "activation checkpointing (--checkpoint-activations)");
  add(o.ema > 0, "EMA of weights (--ema)");
  add(o.channels_last, "channels_last (--channels-last)");
  const bool cuda = o.device == "cuda";
  add(cuda && o.cudnn_benchmark, "cuDNN autotuning (--cudnn-benchmark; CUDA only)");
  add(cuda, "TF32 tensor-core math for f32 matmuls and convolutions (CUDA only)");
  add(o.cuda_graphs, "CUDA graphs: the whole step replayed with one launch (--cuda-graphs)");
  add(true, "gradients set to none, no_grad validation, no bias before BatchNorm, input normalisation, fused ops");
  add(!kiln::debug::current().any(), "debug APIs off (anomaly detection, sync-debug, deterministic algorithms)");
  add(o.flush_denormal && kiln::flush_denormal(), "denormals flushed to zero on the CPU (--flush-denormal)");
  add(kiln::cpu_isa() != kiln::CpuIsa::baseline,
      std::string("CPU kernels for this processor: ") + kiln::cpu_isa_summary() + " (KILN_CPU_ISA)");
  add(o.distributed, "data parallel over " + std::to_string(o.world_size) + (o.world_size == 1 ? " rank: " : " ranks: ") +
                            (o.zero ? "ZeRO-1 (--zero)" : "DDP, bucketed all-reduce overlapping backward"));
  return s;
}

// With --zero each rank's checkpoint holds its own share of the optimizer state: rank r > 0
// reads and writes "<name>.rank<r>.safetensors" next to rank 0's file.
std::string rank_path(const Options& o, const std::string& path) {
  if (!o.zero || o.rank == 0) return path;
  const std::string ext = ".safetensors";
  const bool has_ext = path.size() > ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0;
  return (has_ext ? path.substr(0, path.size() - ext.size()) : path) + ".rank" + std::to_string(o.rank) + ext;
}

// --profile N: a Profiler over N optimizer steps after the warm-up; writes OUT/trace.json and
// OUT/profile.txt and prints the table (rank 0).
class StepProfile {
 public:
  explicit StepProfile(const Options& o) : o_(o) {}
  bool active() const { return prof_.has_value(); }
  void before_step(int64_t step, bool first_micro) {
    if (o_.profile > 0 && first_micro && !prof_ && !done_ && step == kiln_train::kProfileWarmup) prof_.emplace();
  }
  void after_step(int64_t step, bool main_rank) {
    if (!prof_ || step < kiln_train::kProfileWarmup + o_.profile) return;
    if (o_.device == "cuda") kiln::cuda::synchronize();
    prof_->stop();
    done_ = true;
    if (main_rank) {
      prof_->write_chrome_trace(o_.out + "/trace.json");
      const std::string table = prof_->table(30);
      std::ofstream(o_.out + "/profile.txt") << table;
      std::printf("\nprofile of steps %lld-%lld:\n%s(wrote %s/trace.json and %s/profile.txt)\n",
                  static_cast<long long>(kiln_train::kProfileWarmup + 1), static_cast<long long>(step), table.c_str(),
                  o_.out.c_str(), o_.out.c_str());
    }
    prof_.reset();
  }

 private:
  const Options& o_;
  std::optional<kiln::profiler::Profiler> prof_;
  bool done_ = false;
};

int run(Options o) {
  kiln_train::validate(o, kiln::cuda::is_available());
  kiln_train::init_parallel(o);  // under a launcher: joins the job, o.batch_size becomes this rank's share
  const bool main_rank = o.rank == 0;
  if (o.threads > 0) omp_set_num_threads(o.threads);
  // After the thread count: the setting is applied to the OpenMP pool as it is now.
  if (o.flush_denormal) kiln::set_flush_denormal(true);
  kiln::manual_seed(o.seed);
  const bool tty = kiln::utils::stdout_is_tty();
  const bool cuda = o.device == "cuda";
  if (cuda) {
    kiln::cudnn::set_benchmark(o.cudnn_benchmark);
    kiln::cuda::set_allow_tf32(true);
  }
  auto task = kiln_train::make_task(o);
  if (o.find_lr) return find_lr(o, *task);

  auto& model = task->model();
  auto& loader = task->train_loader();
  auto params = model.parameters();
  // Data parallel: DDP averages the gradients during backward (rank 0's parameters and buffers
  // are copied to every rank first); --zero instead shards the optimizer, whose step
  // reduce-scatters the gradients and all-gathers the parameters.
  std::unique_ptr<dist::DistributedDataParallel> ddp;
  std::unique_ptr<dist::ZeroRedundancyOptimizer> zero;
  std::unique_ptr<optim::Optimizer> opt;
  if (o.distributed && !o.zero) {
    std::shared_ptr<kiln::nn::Module> shared(&model, [](kiln::nn::Module*) {});  // the task owns it
    ddp = std::make_unique<dist::DistributedDataParallel>(
        shared, dist::DistributedDataParallelOptions().bucket_cap_mb(o.ddp_bucket_mb));
  }
  if (o.zero && o.distributed) {
    for (auto& t : model.parameters()) dist::broadcast(t, 0);
    for (auto& t : model.buffers()) dist::broadcast(t, 0);
    zero = std::make_unique<dist::ZeroRedundancyOptimizer>(
        params, [&o](std::vector<Tensor> shard) { return make_optimizer(o, shard); });
  } else {
    opt = make_optimizer(o, params);
  }
  // What schedules, checkpoints and logs see: the optimizer, or ZeRO's over this rank's slices.
  optim::Optimizer& opt_ref = zero ? zero->local_optimizer() : *opt;
  const int64_t batches = loader.size();
  const int64_t steps_per_epoch = batches / o.grad_accum;
  KILN_CHECK(steps_per_epoch > 0, "--grad-accum ", o.grad_accum, " exceeds the ", batches, " batches of an epoch");
  int64_t total_steps = steps_per_epoch * o.epochs;
  if (o.max_steps > 0) total_steps = std::min(total_steps, o.max_steps);
  auto sched = make_schedule(o, opt_ref, total_steps);
  std::unique_ptr<optim::EMA> ema = o.ema > 0 ? std::make_unique<optim::EMA>(model, o.ema) : nullptr;
  // Loss scaling for f16 only (bf16 has f32's range); a no-op otherwise and on the CPU.
  kiln::amp::GradScaler scaler(kiln::amp::GradScalerOptions().enabled(o.amp == "fp16" && kiln::cuda::is_available()));
  if (main_rank)
    for (const auto& w : kiln::nn::lint(model, false)) std::printf("%s\n", w.c_str());

  Position pos;
  if (!o.resume.empty()) {
    pos = load_checkpoint(rank_path(o, o.resume), o, model, opt_ref, sched.get(), ema.get());
    if (main_rank) std::printf("resumed from %s at epoch %lld, batch %lld, step %lld\n", o.resume.c_str(),
                static_cast<long long>(pos.epoch), static_cast<long long>(pos.batch_in_epoch), static_cast<long long>(pos.step));
  }
  fs::create_directories(o.out);
  const bool appending = !o.resume.empty();
  // Rank 0 alone logs, plots and writes the model (every rank writes checkpoints with --zero).
  std::optional<kiln::utils::CsvWriter> csv;
  std::optional<kiln::utils::SummaryWriter> tb;
  if (main_rank) {
    csv.emplace(o.out + "/metrics.csv",
                std::vector<std::string>{"step", "epoch", "loss", "lr", "grad_norm", "samples_per_second", "test_accuracy"},
                appending);
    tb.emplace(o.out);
  }
  std::ostream no_output(nullptr);  // progress bars of ranks other than 0
  std::vector<double> plot_steps, plot_loss, plot_lr, plot_epochs, plot_acc;

  if (main_rank) {
    std::printf("kiln-train: %s on %s, %lld parameters, %lld batches/epoch of %lld%s, %lld epochs, %s + %s\n",
                o.model.c_str(), o.device.c_str(), static_cast<long long>(model.parameter_count()),
                static_cast<long long>(batches), static_cast<long long>(o.batch_size),
                o.world_size > 1 ? (" per rank x " + std::to_string(o.world_size) + " ranks").c_str() : "",
                static_cast<long long>(o.epochs), o.optimizer.c_str(), o.schedule.c_str());
    std::printf("speed-ups:\n%s", speedups_summary(o).c_str());
    if (!kiln::debug::summary().empty()) std::printf("%s\n", kiln::debug::summary().c_str());
  }
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);  // what job schedulers send before killing a job

  double test_acc = -1;
  bool stop = false;
  const std::string ckpt_path = rank_path(o, o.out + "/checkpoint.safetensors");
  const bool writes_checkpoints = main_rank || zero;
  kiln_train::StepGraph graph_state(o.cuda_graphs, opt_ref);
  StepProfile profile(o);
  Tensor grad_norm;  // a device tensor written by clip_grad_norm (inside the graph with --cuda-graphs)
  for (int64_t epoch = pos.epoch; epoch < o.epochs && !stop; ++epoch) {
    loader.set_epoch(epoch);
    kiln::utils::Progress progress(batches, "epoch " + std::to_string(epoch + 1) + "/" + std::to_string(o.epochs),
                                   main_rank ? std::cout : no_output, tty && main_rank);
    int64_t b = 0, micro = 0, window_samples = 0;
    double window_start = now_seconds(), epoch_start = now_seconds(), last_loss = 0, sps = 0;
    bool measured = false;  // a loss and a rate exist only from this epoch's first log point on
    for (auto& batch : loader) {
      if (b < pos.batch_in_epoch) {  // resuming mid-epoch: these batches were trained already
        ++b;
        continue;
      }
      profile.before_step(pos.step, micro % o.grad_accum == 0);
      std::optional<kiln::profiler::Range> step_range;
      if (profile.active()) step_range.emplace("step");
      // One micro-batch: forward (under autocast), scaled backward; on the last micro-batch of a
      // step also clipping and the (possibly skipped) optimizer step. Everything here stays on the
      // device, which is what lets --cuda-graphs capture it.
      auto train_micro = [&](const kiln::data::Batch& bt, bool last_micro) {
        Tensor l;
        {
          // Mixed precision (docs/guide.md, speed-up 4): matmuls/convs in bf16/f16, losses and norms in f32.
          std::optional<kiln::amp::Autocast> autocast;
          if (o.amp != "off") autocast.emplace(o.amp == "bf16" ? kiln::DType::BF16 : kiln::DType::F16);
          if (ddp) ddp->before_forward();  // rank 0's buffers (BatchNorm statistics) to every rank
          l = task->loss(bt);
        }
        {
          // Accumulating micro-batches issue no collective; the last one reduces their sum.
          std::optional<dist::DistributedDataParallel::NoSyncGuard> no_sync;
          if (ddp && !last_micro) no_sync.emplace(ddp->no_sync());
          scaler.scale(o.grad_accum > 1 ? l / static_cast<double>(o.grad_accum) : l).backward();
        }
        if (last_micro) {
          if (o.clip_grad > 0) {
            scaler.unscale(*opt);  // clip the true gradients
            grad_norm = optim::clip_grad_norm(params, o.clip_grad);
          }
          if (zero) {
            zero->step();
          } else {
            scaler.step(*opt);  // skipped on the device when a gradient overflowed (f16)
          }
        }
        return l;
      };
      Tensor loss;
      ++micro;
      const bool last_micro = micro % o.grad_accum == 0;
      if (graph_state.active()) {
        // CUDA graphs (docs/guide.md, speed-up 22): after a few eager warm-up steps (optimizer state, cuDNN
        // autotuning), the whole step is captured once and replayed with one launch per step.
        loss = graph_state.step(batch, [&](const kiln::data::Batch& bt) { return train_micro(bt, true); });
      } else {
        loss = train_micro(batch, last_micro);
        if (last_micro) graph_state.count_eager_step();
      }
      ++b;
      pos.samples += task->samples_per_batch(batch);
      window_samples += task->samples_per_batch(batch);
      if (last_micro) {
        scaler.update();
        if (zero) {
          zero->zero_grad();
        } else if (!graph_state.captured()) {
          opt->zero_grad();  // to none; a captured step owns its gradients
        }
        if (sched) sched->step();
        if (ema) ema->update();
        ++pos.step;
        step_range.reset();
        profile.after_step(pos.step, main_rank);
        if (pos.step % o.log_every == 0 || pos.step == total_steps) {
          last_loss = loss.item<double>();  // the only host read in the loop, once per log interval
          const double t = now_seconds();
          sps = static_cast<double>(window_samples) / (t - window_start);
          measured = true;
          window_start = t;
          window_samples = 0;
          const double lr = opt_ref.param_groups()[0].lr();
          const double gn = grad_norm.defined() ? grad_norm.item<double>() : -1;
          // Without loss scaling a non-finite loss or gradient norm only gets worse: stop with the
          // step that showed it. Checked where the loss is read anyway (every --log-every steps),
          // so no step pays a host sync for it; the GradScaler skips such steps by itself. Under
          // a launcher the rank that sees it exits and the launcher stops the others.
          if (!scaler.is_enabled() && (!std::isfinite(last_loss) || (grad_norm.defined() && !std::isfinite(gn)))) {
            progress.finish();
            const bool loss_bad = !std::isfinite(last_loss);
            const double bad = loss_bad ? last_loss : gn;
            std::fprintf(stderr,
                         "kiln-train: the %s is %s at step %lld (epoch %lld; checked every --log-every %lld steps); "
                         "stopping before the optimizer turns the weights into NaN. Lower --lr, or check the data\n",
                         loss_bad ? "loss" : "gradient norm", std::isnan(bad) ? "nan" : bad > 0 ? "inf" : "-inf",
                         static_cast<long long>(pos.step), static_cast<long long>(epoch + 1),
                         static_cast<long long>(o.log_every));
            return 3;
          }
          if (csv) csv->write_row({pos.step, epoch + 1, last_loss, lr, gn >= 0 ? kiln::utils::CsvCell(gn) : kiln::utils::CsvCell(),
                                   sps * o.world_size, kiln::utils::CsvCell()});
          std::vector<std::pair<std::string, double>> scalars = {{"train/loss", last_loss}, {"train/lr", lr},
                                                                 {"train/samples_per_second", sps * o.world_size}};
          if (gn >= 0) scalars.push_back({"train/grad_norm", gn});
          if (scaler.is_enabled()) scalars.push_back({"train/loss_scale", scaler.get_scale()});
          if (tb) tb->add_scalars(scalars, pos.step);
          plot_steps.push_back(static_cast<double>(pos.step));
          plot_loss.push_back(last_loss);
          plot_lr.push_back(lr);
        }
      }
      if (measured) {
        progress.update(b, {{"loss", last_loss}}, sps);
      } else {
        progress.update(b);  // no loss read yet (it is read every --log-every steps): none shown
      }
      // Several ranks stop together: the signal may reach them at different steps, so they agree
      // at the log points (where the loss is read anyway), all at the same step.
      int stop_signal = g_interrupted;
      if (o.world_size > 1) {
        stop_signal = last_micro && pos.step % o.log_every == 0
                     ? kiln_train::max_over_ranks(o, g_interrupted, kiln_train::device_of(o))
                     : 0;
      }
      if (stop_signal != 0) {
        pos.epoch = epoch;
        pos.batch_in_epoch = b;
        pos.train_seconds += now_seconds() - epoch_start;
        if (writes_checkpoints) save_checkpoint(ckpt_path, o, model, opt_ref, sched.get(), ema.get(), pos);
        progress.finish();
        if (main_rank)
          std::printf("interrupted (%s): wrote %s; continue with --resume %s\n", stop_signal == SIGTERM ? "SIGTERM" : "SIGINT",
                      ckpt_path.c_str(), ckpt_path.c_str());
        kiln_train::finish_parallel(o);
        return 128 + stop_signal;
      }
      if (o.max_steps > 0 && pos.step >= o.max_steps) {
        stop = true;
        break;
      }
    }
    if (cuda) kiln::cuda::synchronize();  // the epoch's time includes its queued GPU work
    pos.train_seconds += now_seconds() - epoch_start;
    if (measured) {
      progress.finish({{"loss", last_loss}});
    } else {
      progress.finish();
    }
    pos.epoch = epoch + 1;
    pos.batch_in_epoch = 0;
    if (writes_checkpoints) {
      // The latest checkpoint, and one per epoch to go back to.
      save_checkpoint(ckpt_path, o, model, opt_ref, sched.get(), ema.get(), pos);
      fs::copy_file(ckpt_path, rank_path(o, o.out + "/checkpoint-epoch" + std::to_string(epoch + 1) + ".safetensors"),
                    fs::copy_options::overwrite_existing);
    }
    if (!main_rank) continue;  // rank 0 evaluates (the replicas are identical) and logs
    {
      std::optional<optim::EMA::Swap> swap;
      if (ema) swap.emplace(*ema);
      test_acc = task->evaluate();
    }
    const auto& st = loader.stats();
    std::printf("epoch %lld: test accuracy %.2f%%%s, loader wait %.1f%% of the epoch\n", static_cast<long long>(epoch + 1),
                100 * test_acc, ema ? " (EMA weights)" : "", 100 * st.wait_fraction());
    csv->write_row({pos.step, epoch + 1, last_loss, opt_ref.param_groups()[0].lr(), kiln::utils::CsvCell(),
                    kiln::utils::CsvCell(), test_acc});
    tb->add_scalar("test/accuracy", test_acc, pos.step);
    tb->flush();
    plot_epochs.push_back(static_cast<double>(pos.step));
    plot_acc.push_back(test_acc);
  }

  kiln_train::check_replicas_identical(o, model, kiln_train::device_of(o));
  if (!main_rank) {
    kiln_train::finish_parallel(o);
    return 0;
  }
  if (ema) ema->copy_to_model();
  kiln::save(model, o.out + "/model.safetensors", {{"model", o.model}});
  std::vector<kiln::utils::Series> series = {{"train loss", plot_steps, plot_loss},
                                             {"test accuracy", plot_epochs, plot_acc},
                                             {"learning rate", plot_steps, plot_lr}};
  kiln::utils::write_line_plot_png(o.out + "/plot.png", "kiln-train " + o.model, series);
  std::string sample = task->sample();
  if (!sample.empty()) std::printf("--- sample ---\n%s\n--------------\n", sample.c_str());
  std::printf("wrote %s/{metrics.csv, plot.png, model.safetensors, checkpoint*.safetensors} and TensorBoard events\n",
              o.out.c_str());
  // Every rank trains the same number of samples (equal shards, drop_last): the job's throughput
  // is rank 0's times the world size.
  const double sps_total =
      pos.train_seconds > 0 ? static_cast<double>(pos.samples) * o.world_size / pos.train_seconds : 0;
  nlohmann::ordered_json summary = {{"model", o.model}, {"device", o.device}, {"epochs", o.epochs},
                            {"train_seconds", pos.train_seconds}, {"samples_per_second", sps_total},
                            {"cpu_isa", kiln::cpu_isa_name(kiln::cpu_isa())},
                            {"test_accuracy", test_acc}, {"world_size", o.world_size},
                            {"peak_memory_bytes", cuda ? static_cast<int64_t>(kiln::cuda::memory_stats(0).peak_reserved_bytes)
                                                       : peak_rss_bytes()}};
  if (cuda) summary["peak_host_memory_bytes"] = peak_rss_bytes();
  kiln_train::finish_parallel(o);
  std::cout << summary.dump() << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = kiln_train::parse(argc, argv);
  try {
    return run(o);
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "kiln-train: %s\n", e.what());
    return 2;
  }
}
