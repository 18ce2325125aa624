#include "session.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace kiln_guide {
namespace fs = std::filesystem;

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string job_device(const Tip& t, const SessionOptions& o) {
  if (t.cpu_only) return "cpu";
  // data parallelism over GPUs needs one per rank; otherwise the ranks are CPU cores
  if (t.launcher) return o.device == "cuda" && o.gpu_count >= 2 ? "cuda" : "cpu";
  return o.device;
}

Budget job_budget(const Tip& t, const SessionOptions& o, const std::string& device) {
  if (o.steps > 0) return {1, o.steps};
  Budget b = o.full ? t.full : t.quick;
  if (device == "cuda" && t.metric == MetricKind::Throughput && b.steps > 0) b.steps *= 2;  // GPU steps are short
  return b;
}

int64_t log_every(const Tip& t, const Budget& b) {
  switch (t.metric) {
    case MetricKind::Throughput:
    case MetricKind::LateThroughput:  // about 8 windows: the first (warm-up) is left out
      return b.steps > 0 ? std::max<int64_t>(1, b.steps / 8) : 50;
    case MetricKind::PeakMemory:
    case MetricKind::BatchFit:
    case MetricKind::EvalThroughput: return std::max<int64_t>(1, b.steps);
    case MetricKind::Convergence: return 100;
    case MetricKind::HostSyncs: return 50;  // kiln-train's default: the loss read of a plain run
  }
  return 50;
}

// The value after `name` in a side's flags, or "" when the flag is absent.
std::string flag_value(const std::vector<std::string>& flags, const std::string& name) {
  for (size_t i = 0; i + 1 < flags.size(); ++i)
    if (flags[i] == name) return flags[i + 1];
  return "";
}

// The (micro-)batch and the accumulation a side's flags train with (kiln-train's defaults if unset).
int64_t side_batch(const Tip& t, const std::vector<std::string>& flags) {
  const std::string v = flag_value(flags, "--batch-size");
  return v.empty() ? (t.model == "gpt" ? 32 : 128) : std::stoll(v);
}
int64_t side_accum(const std::vector<std::string>& flags) {
  const std::string v = flag_value(flags, "--grad-accum");
  return v.empty() ? 1 : std::stoll(v);
}

// A side's flags, at another (micro-)batch for a BatchFit probe run.
std::vector<std::string> side_flags(const Tip& t, bool with, bool probe) {
  std::vector<std::string> f = with ? t.with : t.baseline;
  if (!probe) return f;
  const std::string b = std::to_string(with ? t.with_probe_batch : t.baseline_probe_batch);
  for (size_t i = 0; i + 1 < f.size(); ++i)
    if (f[i] == "--batch-size") {
      f[i + 1] = b;
      return f;
    }
  f.insert(f.end(), {"--batch-size", b});
  return f;
}

// A free TCP port for a kiln-run job's store, so that a job never meets another one (a test
// suite, a second kiln-guide) on kiln-run's default port.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 29500;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 29500;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

// A run's command line; `out_dir` empty: the command as the report shows it (OUT, PORT).
std::vector<std::string> job_argv(const Tip& t, bool with, int round, const std::string& device,
                                  const std::string& out_dir, const SessionOptions& o, bool probe = false) {
  const Budget b = job_budget(t, o, device);
  std::vector<std::string> a;
  if (with && t.launcher)
    a = {o.kiln_run.empty() ? "kiln-run" : o.kiln_run,           "--nproc-per-node", "2", "--master-port",
         out_dir.empty() ? "PORT" : std::to_string(free_port()), "--no-prefix"};
  a.insert(a.end(), {o.kiln_train, "--device", device, "--model", t.model, "--epochs", std::to_string(b.epochs)});
  if (b.steps > 0) a.insert(a.end(), {"--max-steps", std::to_string(b.steps)});
  // the same seed for both sides of a round, another one per round: paired runs, real spread
  a.insert(a.end(), {"--log-every", std::to_string(log_every(t, b)), "--seed", std::to_string(round)});
  const auto& side = side_flags(t, with, probe);
  if (t.metric == MetricKind::Convergence) {  // sub-epoch time to target: evaluate every kEvalSamples
    const int64_t per_step = side_batch(t, side) * side_accum(side);
    a.insert(a.end(), {"--eval-every",
                       std::to_string(std::max<int64_t>(
                           1, std::llround(static_cast<double>(kEvalSamples) / static_cast<double>(per_step))))});
  }
  if (t.metric == MetricKind::EvalThroughput)  // kEvalRuns evaluations during the steps, one after them
    a.insert(a.end(), {"--eval-every", std::to_string(std::max<int64_t>(1, b.steps / (kEvalRuns + 1)))});
  const std::string& data = t.model == "gpt" ? o.gpt_data : o.data;
  if (!data.empty()) a.insert(a.end(), {"--data", data});
  if (device == "cuda") a.insert(a.end(), t.cuda_both.begin(), t.cuda_both.end());
  a.insert(a.end(), side.begin(), side.end());
  a.insert(a.end(), {"--out", out_dir.empty() ? "OUT" : out_dir});
  return a;
}

std::string metric_name(const Tip& t, const std::string& device) {
  const std::string per = t.model == "gpt" ? "tokens/s" : "images/s";
  const std::string note = t.metric_note.empty() ? "" : "; " + t.metric_note;
  switch (t.metric) {
    case MetricKind::Throughput: return "throughput, " + per + " after the first log window";
    case MetricKind::LateThroughput: return "throughput over the second half of the steps, " + per;
    case MetricKind::PeakMemory:
      return device == "cuda" ? "peak GPU memory reserved, bytes" : "peak resident memory of the process, bytes";
    case MetricKind::Convergence: return "time to target accuracy";  // settled by fill_row
    case MetricKind::HostSyncs:
      return (device == "cuda" ? std::string("implicit host-device syncs per optimizer step, as sync-debug counts them "
                                             "(kiln-train --sync-debug warn)")
                               : std::string("host reads of device values per optimizer step, counted by kiln-train "
                                             "(each one a device-to-host sync on a GPU; on the CPU sync-debug has "
                                             "none to count)")) +
             note;
    case MetricKind::BatchFit: {  // the words "bytes" and "seconds" stay out: scripts/guide_table.py reads units
      const std::string b = std::to_string(side_batch(t, t.baseline));
      return "largest batch whose predicted peak memory stays within the baseline's at batch " + b +
             " (the peak of live tensors during the training steps, from kiln's allocator, evaluation left out; "
             "each side's peak a straight line in the batch, through its runs at two batches: baseline " +
             b + " and " + std::to_string(t.baseline_probe_batch) + ", with " + std::to_string(side_batch(t, t.with)) +
             " and " + std::to_string(t.with_probe_batch) + "; a sample is a " +
             (t.model == "gpt" ? "128-token sequence" : "image") + note + ")";
    }
    case MetricKind::EvalThroughput:
      return "evaluation throughput, test " + per + " over the evaluations after the first (" +
             std::to_string(kEvalRuns + 1) +
             " evaluations of the whole test set, spread evenly over the training "
             "steps)" +
             note;
  }
  return "";
}

std::string failure_text(const Job& j, const ProcessResult& p, const std::string& stderr_path, const std::string& why) {
  std::string s =
      "round " + std::to_string(j.round + 1) + ", " + (j.with ? "with" : "baseline") + ": " + shell_join(j.argv) + "\n";
  if (!p.started) s += "could not be started\n";
  else if (p.timed_out) s += "timed out after " + format_duration(p.wall_seconds) + "\n";
  else if (g_stop_signal != 0)
    s += "stopped: kiln-guide was interrupted (status " + std::to_string(p.exit_code) + ")\n";
  else if (!why.empty()) s += why + "\n";
  else s += "exited with status " + std::to_string(p.exit_code) + "\n";
  return s + tail_of_file(stderr_path);
}

// The tip's metric from one successful run; NaN when the run's output lacks it.
void measure(RunOutcome& r, const Tip& t, const std::string& device, const nlohmann::json& summary,
             const std::vector<MetricsRow>& rows) {
  auto number = [&](const char* k) {
    return summary.contains(k) && summary[k].is_number() ? summary[k].get<double>() : std::nan("");
  };
  int64_t last_step = 0;
  for (const auto& m : rows) last_step = std::max(last_step, m.step);
  switch (t.metric) {
    case MetricKind::Throughput:
      r.value = steady_throughput(rows);
      if (!std::isfinite(r.value)) r.value = number("samples_per_second");  // too few windows: the run's own
      break;
    case MetricKind::LateThroughput:
      r.value = steady_throughput(rows, last_step / 2);
      if (!std::isfinite(r.value)) r.value = number("samples_per_second");
      break;
    case MetricKind::PeakMemory: r.value = number("peak_memory_bytes"); break;
    // the live tensors' peak over the steps alone: a line in the batch, which the process's peak
    // is not (start-up and evaluation set a floor under it)
    case MetricKind::BatchFit: r.value = number("train_peak_allocated_bytes"); break;
    case MetricKind::Convergence:
      r.final_accuracy = number("test_accuracy");
      r.value = r.final_accuracy;
      r.hit = time_to_accuracy(rows, t.target_accuracy, number("train_seconds"));
      // --auto-lr: the LR range test ran before training and is part of the time to target
      if (r.hit && std::isfinite(number("lr_find_seconds"))) r.hit->seconds += number("lr_find_seconds");
      break;
    case MetricKind::HostSyncs:  // on a GPU the runtime's count, which sees the syncs kiln-train does not make itself
      r.value = number(device == "cuda" ? "implicit_syncs_per_step" : "host_reads_per_step");
      break;
    case MetricKind::EvalThroughput: r.value = number("eval_samples_per_second"); break;
  }
}

void write_run_json(const Job& j, const RunOutcome& r, const ProcessResult& p, const std::string& summary_line,
                    const std::string& path) {
  // the summary exactly as kiln-train printed it (its keys in its order), or null
  const auto summary = nlohmann::ordered_json::parse(summary_line, nullptr, /*allow_exceptions=*/false);
  nlohmann::ordered_json d = {{"id", j.id},
                              {"tip", j.tip->number},
                              {"key", j.tip->key},
                              {"side", j.with ? "with" : "baseline"},
                              {"round", j.round + 1},
                              {"batch", j.batch},
                              {"grad_accum", j.accum},
                              {"command", shell_join(j.argv)},
                              {"exit_code", p.exit_code},
                              {"wall_seconds", p.wall_seconds},
                              {"summary", summary.is_discarded() ? nlohmann::ordered_json(nullptr) : summary},
                              {"value", std::isfinite(r.value) ? nlohmann::ordered_json(r.value) : nullptr}};
  if (j.tip->metric == MetricKind::Convergence) {
    d["target_accuracy"] = j.tip->target_accuracy;
    d["target_step"] = r.hit ? nlohmann::ordered_json(r.hit->step) : nullptr;
    d["target_seconds"] = r.hit ? nlohmann::ordered_json(r.hit->seconds) : nullptr;
  }
  if (!r.ok) d["failure"] = r.failure;
  std::ofstream(path) << d.dump(2) << "\n";
}

}  // namespace

Row planned_row(const Tip& t, const SessionOptions& o, std::optional<std::string>* skip_status) {
  Row row;
  row.tip = t.number, row.key = t.key, row.name = t.name, row.model = t.model;
  row.claim = t.claim, row.source = t.source, row.explanation = t.explanation, row.claimed_ratio = t.claimed_ratio;
  row.sample_word = t.model == "gpt" ? "tokens" : "images";
  *skip_status = std::nullopt;
  if (!t.not_measured.empty()) {
    row.model.clear();
    row.status = kNotMeasured;
    *skip_status = kNotMeasured;
    return row;
  }
  const std::string device = job_device(t, o);
  const std::string shown = t.needs_gpu ? "cuda" : device;  // a GPU row shows the command it would run
  if (device == "cuda" && !t.gpu_explanation.empty()) row.explanation = t.gpu_explanation;
  row.metric = metric_name(t, shown);
  const bool lower = t.metric == MetricKind::PeakMemory || t.metric == MetricKind::HostSyncs;
  row.direction = lower ? Direction::LowerIsBetter : Direction::HigherIsBetter;
  row.unit = t.metric == MetricKind::PeakMemory  ? Unit::Bytes
             : t.metric == MetricKind::HostSyncs ? Unit::PerStep
             : t.metric == MetricKind::BatchFit  ? Unit::Samples
                                                 : Unit::SamplesPerSecond;
  row.baseline_command = shell_join(job_argv(t, false, 0, shown, "", o));
  row.with_command = shell_join(job_argv(t, true, 0, shown, "", o));
  if (t.needs_gpu && device != "cuda") {
    row.status = kNeedsGpu;
    *skip_status = kNeedsGpu;
  } else if (t.launcher && o.kiln_run.empty()) {
    row.status = kNotMeasured;
    row.explanation = "kiln-run was not found next to kiln-train; " + t.explanation;
    *skip_status = kNotMeasured;
  }
  return row;
}

std::vector<Job> plan_jobs(const std::vector<const Tip*>& tips, const SessionOptions& o) {
  std::vector<Job> jobs;
  for (const Tip* t : tips) {
    std::optional<std::string> skip;
    planned_row(*t, o, &skip);
    if (skip) continue;
    const bool fit = t->metric == MetricKind::BatchFit;
    for (int r = 0; r < o.rounds; ++r)
      for (bool probe : fit ? std::vector<bool>{false, true} : std::vector<bool>{false})
        for (bool with : {false, true}) {
          Job j;
          j.tip = t, j.with = with, j.round = r, j.probe = probe, j.device = job_device(*t, o);
          const auto flags = side_flags(*t, with, probe);
          j.batch = side_batch(*t, flags), j.accum = side_accum(flags);
          j.id = t->key + "-" + (with ? "with" : "baseline") + (probe ? "-b" + std::to_string(j.batch) : "") + "-r" +
                 std::to_string(r + 1);
          j.out_dir = (fs::path(o.out) / "runs" / j.id).string();
          j.argv = job_argv(*t, with, r, j.device, j.out_dir, o, probe);
          j.estimate_s = estimate_seconds(j);
          jobs.push_back(std::move(j));
        }
  }
  return jobs;
}

double estimate_seconds(const Job& j) {
  // Per model: start-up (data, model), seconds per sample unit (image or token) at kiln-train's
  // defaults, an evaluation, units per sample, samples per step and per epoch. Measured on a quiet
  // 2-core AVX-512 VM; GPU figures are rough.
  struct Cost {
    double startup, per_unit, eval, units, batch, epoch;
  };
  static const std::map<std::string, Cost> cpu = {{"cnn", {1.0, 1 / 12000.0, 0.6, 1, 128, 60000}},
                                                  {"resnet18", {1.0, 1 / 180.0, 15, 1, 128, 60000}},
                                                  {"gpt", {3.0, 1 / 10000.0, 4, 128, 32, 1e12}}};
  static const std::map<std::string, Cost> gpu = {{"cnn", {5.0, 1 / 70000.0, 1, 1, 128, 60000}},
                                                  {"resnet18", {5.0, 1 / 8000.0, 2, 1, 128, 60000}},
                                                  {"gpt", {5.0, 1 / 200000.0, 1, 128, 32, 1e12}}};
  const Tip& t = *j.tip;
  const auto& table = j.device == "cuda" ? gpu : cpu;
  const auto it = table.find(t.model);
  if (it == table.end()) return 10;
  const Cost& c = it->second;
  int64_t epochs = 1, steps = 0, eval_every = 0;
  bool auto_lr = false;
  for (size_t i = 0; i < j.argv.size(); ++i) {
    const bool has_value = i + 1 < j.argv.size();
    if (has_value && j.argv[i] == "--epochs") epochs = std::stoll(j.argv[i + 1]);
    if (has_value && j.argv[i] == "--max-steps") steps = std::stoll(j.argv[i + 1]);
    if (has_value && j.argv[i] == "--eval-every") eval_every = std::stoll(j.argv[i + 1]);
    auto_lr = auto_lr || j.argv[i] == "--auto-lr";
  }
  const double batch = static_cast<double>(j.batch > 0 ? j.batch * j.accum : static_cast<int64_t>(c.batch));
  const double samples = steps > 0 ? std::min(steps * batch, epochs * c.epoch) : epochs * c.epoch;
  double evals = steps > 0 ? std::max(1.0, std::ceil(steps * batch / c.epoch)) : epochs;
  if (eval_every > 0) evals += std::floor(samples / batch / static_cast<double>(eval_every));
  double seconds = c.startup + evals * c.eval + samples * c.units * c.per_unit * (j.with ? t.cost : 1.0);
  if (auto_lr) seconds += c.startup + 90 * c.batch * c.units * c.per_unit;  // the LR range test's ~90 steps
  return seconds;
}

RunOutcome run_job(const Job& j, const SessionOptions& o) {
  const fs::path runs = fs::path(o.out) / "runs";
  const std::string out_path = (runs / (j.id + ".stdout")).string(), err_path = (runs / (j.id + ".stderr")).string();
  std::error_code ec;
  fs::remove_all(j.out_dir, ec);  // a previous session's run must not leave its metrics.csv behind
  // generous: a loaded machine may be 10x slower than the estimate, but a hang must end
  const ProcessResult p = run_process(j.argv, out_path, err_path, std::max(600.0, 20 * j.estimate_s));
  RunOutcome r;
  r.round = j.round, r.probe = j.probe, r.batch = j.batch, r.accum = j.accum;
  nlohmann::json summary;
  std::string why, summary_line;
  if (p.started && !p.timed_out && p.exit_code == 0) {
    std::ifstream f(out_path);
    summary = last_json_line(std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>()),
                             &summary_line);
    try {
      if (summary.is_object()) measure(r, *j.tip, j.device, summary, read_metrics_csv(j.out_dir + "/metrics.csv"));
    } catch (const std::exception& e) {
      why = e.what();
    }
    if (!summary.is_object()) why = "no JSON summary on the last line of its output";
    else if (why.empty() && !std::isfinite(r.value)) why = "its output lacks the value this row measures";
    r.ok = why.empty();
    if (summary.is_object() && summary.contains("cpu_isa") && summary["cpu_isa"].is_string())
      r.cpu_isa = summary["cpu_isa"].get<std::string>();
    if (summary.is_object() && summary.contains("kiln_commit") && summary["kiln_commit"].is_string())
      r.kiln_commit = summary["kiln_commit"].get<std::string>();
  }
  if (!r.ok) r.failure = failure_text(j, p, err_path, why);
  write_run_json(j, r, p, summary_line, (runs / (j.id + ".json")).string());
  for (const auto& e : fs::directory_iterator(j.out_dir, ec))
    if (e.path().extension() == ".safetensors") fs::remove(e.path(), ec);
  return r;
}

namespace {

// A batch-fit row: per round, each side's peak memory as a line through its two runs, and the
// largest batch whose predicted peak stays within the baseline's peak at its own batch. The
// baseline's batch fits there by definition; the with side's is read off its line. Empty, or
// why the row cannot be fitted.
std::string fill_batch_fit(Row& row, const std::vector<RunOutcome>& baseline, const std::vector<RunOutcome>& with) {
  auto find = [](const std::vector<RunOutcome>& runs, int round, bool probe) -> const RunOutcome* {
    for (const RunOutcome& r : runs)
      if (r.round == round && r.probe == probe) return &r;
    return nullptr;
  };
  std::vector<double> fixed[2], per_sample[2];
  MemoryFit mf;
  for (int round = 0;; ++round) {
    const RunOutcome *b = find(baseline, round, false), *bp = find(baseline, round, true);
    const RunOutcome *w = find(with, round, false), *wp = find(with, round, true);
    if (!b || !bp || !w || !wp) break;
    const LinearFit fb = fit_peak(b->batch, b->value, bp->batch, bp->value);
    const LinearFit fw = fit_peak(w->batch, w->value, wp->batch, wp->value);
    const double largest = largest_batch_within(fw, b->value);
    if (!std::isfinite(largest))
      return "round " + std::to_string(round + 1) + ": the with side's peak memory did not grow with the batch (" +
             format_value(wp->value, Unit::Bytes) + " at batch " + std::to_string(wp->batch) + ", " +
             format_value(w->value, Unit::Bytes) + " at batch " + std::to_string(w->batch) +
             "), so no largest batch can be read off a line through them";
    row.baseline_values.push_back(static_cast<double>(b->batch * b->accum));
    row.with_values.push_back(largest * static_cast<double>(w->accum));
    fixed[0].push_back(fb.fixed), per_sample[0].push_back(fb.per_sample);
    fixed[1].push_back(fw.fixed), per_sample[1].push_back(fw.per_sample);
    mf.baseline_batches[0] = b->batch, mf.baseline_batches[1] = bp->batch;
    mf.with_batches[0] = w->batch, mf.with_batches[1] = wp->batch;
  }
  if (row.with_values.empty()) return "no round has all four runs of the fit";
  mf.baseline = {median(fixed[0]), median(per_sample[0])};
  mf.with = {median(fixed[1]), median(per_sample[1])};
  row.fit = mf;
  row.metric += "; per sample: baseline " + format_value(mf.baseline.per_sample, Unit::Bytes) + ", with " +
                format_value(mf.with.per_sample, Unit::Bytes) + " (medians)";
  return "";
}

}  // namespace

void fill_row(Row& row, const Tip& t, const std::vector<RunOutcome>& baseline, const std::vector<RunOutcome>& with,
              const SessionOptions& o) {
  row.status = kMeasured;
  auto collect = [](const std::vector<RunOutcome>& runs, auto get) {
    std::vector<double> v;
    for (const RunOutcome& r : runs) v.push_back(get(r));
    return v;
  };
  if (t.metric == MetricKind::BatchFit) {
    const std::string why = fill_batch_fit(row, baseline, with);
    if (!why.empty()) row.status = kFailed, row.failure = why, row.baseline_values.clear(), row.with_values.clear();
    return;
  }
  if (t.metric != MetricKind::Convergence) {
    row.baseline_values = collect(baseline, [](const RunOutcome& r) { return r.value; });
    row.with_values = collect(with, [](const RunOutcome& r) { return r.value; });
    return;
  }
  bool every_run_hit = true;
  for (const auto* side : {&baseline, &with})
    for (const RunOutcome& r : *side) every_run_hit = every_run_hit && r.hit.has_value();
  char target[32];
  std::snprintf(target, sizeof target, "%g%%", 100 * t.target_accuracy);
  const std::string note = t.metric_note.empty() ? "" : "; " + t.metric_note;
  if (every_run_hit) {
    row.metric = std::string("seconds to ") + target + " test accuracy (training time to the first evaluation " +
                 "that reaches it; test accuracy is evaluated every " +
                 format_value(static_cast<double>(kEvalSamples), Unit::Samples) + " of training, a third of an epoch" +
                 note + ")";
    row.direction = Direction::LowerIsBetter;
    row.unit = Unit::Seconds;
    row.baseline_values = collect(baseline, [](const RunOutcome& r) { return r.hit->seconds; });
    row.with_values = collect(with, [](const RunOutcome& r) { return r.hit->seconds; });
    return;
  }
  const Budget b = job_budget(t, o, job_device(t, o));
  const std::string budget = b.steps > 0 ? std::to_string(b.steps) + " steps"
                                         : std::to_string(b.epochs) + (b.epochs == 1 ? " epoch" : " epochs");
  row.metric = "final test accuracy after " + budget + " (the " + target + " target was not reached in every run)";
  row.direction = Direction::HigherIsBetter;
  row.unit = Unit::Accuracy;
  row.baseline_values = collect(baseline, [](const RunOutcome& r) { return r.final_accuracy; });
  row.with_values = collect(with, [](const RunOutcome& r) { return r.final_accuracy; });
}

SessionResult run_session(const std::vector<const Tip*>& tips, const SessionOptions& o, std::ostream& progress) {
  SessionResult res;
  const std::vector<Job> jobs = plan_jobs(tips, o);
  std::map<const Tip*, std::pair<std::vector<RunOutcome>, std::vector<RunOutcome>>> outcomes;
  std::map<const Tip*, std::string> failures;
  const double start = now_seconds();
  double estimated_done = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Job& j = jobs[i];
    if (failures.count(j.tip)) continue;  // one failed run fails its row: its other runs are skipped
    if (g_stop_signal != 0) {
      res.interrupted = true;
      break;
    }
    double left = 0;
    for (size_t k = i; k < jobs.size(); ++k) left += failures.count(jobs[k].tip) ? 0 : jobs[k].estimate_s;
    // the estimates are for a quiet machine: scale them by how this machine has done so far
    const double pace = estimated_done > 0 ? std::clamp((now_seconds() - start) / estimated_done, 0.2, 20.0) : 1.0;
    progress << "[kiln-guide " << i + 1 << "/" << jobs.size() << "] tip " << j.tip->number << " " << j.tip->key
             << ", round " << j.round + 1 << "/" << o.rounds << ", " << (j.with ? "with" : "baseline")
             << (j.probe ? " at batch " + std::to_string(j.batch) : "") << " on " << j.device << "; about "
             << format_duration(left * pace) << " left" << std::endl;
    RunOutcome r = run_job(j, o);
    estimated_done += j.estimate_s;
    if (res.cpu_isa.empty()) res.cpu_isa = r.cpu_isa;
    if (res.kiln_commit.empty()) res.kiln_commit = r.kiln_commit;
    if (!r.ok) {
      failures[j.tip] = r.failure;
      progress << "[kiln-guide] tip " << j.tip->number << " " << j.tip->key << " failed:\n" << r.failure << std::flush;
      continue;
    }
    (j.with ? outcomes[j.tip].second : outcomes[j.tip].first).push_back(std::move(r));
  }
  for (const Tip* t : tips) {
    std::optional<std::string> skip;
    Row row = planned_row(*t, o, &skip);
    if (!skip) {
      const auto& oc = outcomes[t];
      if (failures.count(t)) {
        row.status = kFailed, row.failure = failures[t];
      } else if (const int runs = o.rounds * (t->metric == MetricKind::BatchFit ? 2 : 1);
                 static_cast<int>(oc.first.size()) == runs && static_cast<int>(oc.second.size()) == runs) {
        fill_row(row, *t, oc.first, oc.second, o);
      } else {
        row.status = kFailed, row.failure = "kiln-guide was interrupted before this row's runs finished";
      }
    }
    res.rows.push_back(std::move(row));
  }
  return res;
}

}  // namespace kiln_guide
