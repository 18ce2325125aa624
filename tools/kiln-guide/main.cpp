// kiln-guide: reproduces the training speed-ups of the PyTorch performance guides on the machine
// it runs on. For each tip it runs kiln-train with the speed-up off and on, in alternating
// rounds, and writes a report of the medians, ratios and spreads beside what the guides claim
// (docs/guide.md, "Measuring it yourself").
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "machine.h"
#include "options.h"
#include "report.h"
#include "runner.h"
#include "session.h"
#include "tips.h"
#include "traces.h"

namespace {

namespace fs = std::filesystem;
using namespace kiln_guide;

void on_stop_signal(int sig) { g_stop_signal = sig; }

bool executable(const fs::path& p) { return fs::is_regular_file(p) && ::access(p.c_str(), X_OK) == 0; }

std::string resolve_kiln_train(const Options& o) {
  const fs::path p = o.kiln_train.empty() ? fs::path(own_dir()) / "kiln-train" : fs::absolute(o.kiln_train);
  if (!executable(p))
    throw UsageError("kiln-train not found (or not executable) at " + p.string() +
                     (o.kiln_train.empty() ? ", next to kiln-guide; build it (cmake --build build --target kiln-train) "
                                             "or pass --kiln-train PATH"
                                           : ""));
  return p.string();
}

// kiln-run beside kiln-train, else beside kiln-guide; empty when neither has one.
std::string find_kiln_run(const std::string& kiln_train) {
  for (const fs::path& dir : {fs::path(kiln_train).parent_path(), fs::path(own_dir())})
    if (executable(dir / "kiln-run")) return (dir / "kiln-run").string();
  return "";
}

std::string checked_path(const std::string& p, const char* flag, bool must_be_dir) {
  if (p.empty()) return p;
  if (!fs::exists(p) || (must_be_dir && !fs::is_directory(p)))
    throw UsageError(std::string(flag) + ": " + p + (must_be_dir ? " is not a folder" : " does not exist"));
  return fs::absolute(p).string();
}

// Creates OUT and OUT/runs and proves they are writable before anything runs.
void prepare_out(const std::string& out) {
  std::error_code ec;
  fs::create_directories(fs::path(out) / "runs", ec);
  const fs::path probe = fs::path(out) / ".kiln-guide-write-test";
  if (!ec) {
    std::ofstream f(probe);
    f << "ok";
    if (!f) ec = std::make_error_code(std::errc::permission_denied);
  }
  if (ec) throw UsageError("cannot write to --out " + out + ": " + ec.message());
  fs::remove(probe, ec);
}

// --device auto picks the GPU only when nvidia-smi lists one and kiln-train trains a step on it
// (kiln may be built without CUDA); --device cuda makes either failure an error.
std::string resolve_device(const Options& o, const std::vector<std::string>& gpus, const SessionOptions& s) {
  if (o.device == "cpu") return "cpu";
  if (gpus.empty()) {
    if (o.device == "cuda") throw UsageError("--device cuda: nvidia-smi lists no GPU on this machine");
    return "cpu";
  }
  const std::string dir = (fs::path(s.out) / "runs" / "cuda-probe").string();
  std::vector<std::string> argv = {s.kiln_train, "--device",    "cuda", "--epochs", "1", "--max-steps",
                                   "1",          "--log-every", "1",    "--out",    dir};
  if (!s.data.empty()) argv.insert(argv.end() - 2, {"--data", s.data});
  const ProcessResult p = run_process(argv, dir + ".stdout", dir + ".stderr", 600);
  if (p.started && !p.timed_out && p.exit_code == 0) return "cuda";
  const std::string why = "kiln-train cannot train on the GPU (" + gpus[0] + "):\n" + tail_of_file(dir + ".stderr");
  if (o.device == "cuda") throw UsageError("--device cuda: " + why);
  std::cerr << "kiln-guide: " << why << "measuring on the CPU instead\n";
  return "cpu";
}

void print_plan(const std::vector<const Tip*>& selected, const SessionOptions& s, const std::string& mode) {
  const std::vector<Job> jobs = plan_jobs(selected, s);
  double est = 0;
  for (const Job& j : jobs) est += j.estimate_s;
  std::cerr << "kiln-guide: mode " << mode << "; " << s.rounds << (s.rounds == 1 ? " round" : " rounds")
            << " per side: " << jobs.size() << " kiln-train runs for " << selected.size() << " rows, training on the "
            << (s.device == "cuda" ? "GPU" : "CPU") << "; estimated " << format_duration(est)
            << " on a quiet machine like kiln's 2-core reference VM (longer when the cores are busy)\n";
}

void print_summary(const std::vector<Row>& rows, const std::string& out, double seconds) {
  for (const Row& r : rows) {
    std::printf("%3d %-15s ", r.tip, r.key.c_str());
    if (r.status == kMeasured) {
      std::printf("%.2fx  (%s: %s -> %s)\n", ratio(median(r.baseline_values), median(r.with_values), r.direction),
                  r.model.c_str(), format_value(median(r.baseline_values), r.unit, r.sample_word).c_str(),
                  format_value(median(r.with_values), r.unit, r.sample_word).c_str());
    } else {
      std::printf("%s\n", r.status.c_str());
    }
  }
  std::printf("wrote %s/report.md, report.json, report.png and runs/ in %s\n", out.c_str(),
              format_duration(seconds).c_str());
}

int run(const Options& o) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<const Tip*> selected = select_tips(o.only);
  if (o.out.empty())
    throw UsageError("--out DIR is required: the folder for report.md, report.json, report.png, runs/");
  SessionOptions s;
  s.kiln_train = resolve_kiln_train(o);
  s.kiln_run = find_kiln_run(s.kiln_train);
  s.data = checked_path(o.data, "--data", true);
  s.gpt_data = checked_path(o.gpt_data, "--gpt-data", false);
  s.out = fs::absolute(o.out).string();
  prepare_out(s.out);
  const std::vector<std::string> gpus = gpu_names();
  s.gpu_count = static_cast<int>(gpus.size());
  s.device = resolve_device(o, gpus, s);
  s.full = o.full;
  s.rounds = o.repeats > 0 ? o.repeats : (o.full ? 3 : 1);
  s.steps = o.steps;
  const std::string mode =
      std::string(o.full ? "full" : "quick") + (o.steps > 0 ? ", " + std::to_string(o.steps) + " steps a run" : "");
  print_plan(selected, s, mode);

  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  SessionResult res = run_session(selected, s, std::cerr);

  Machine m;
  m.cpu = cpu_model(), m.cores = cpu_cores(), m.cpu_isa = res.cpu_isa, m.gpu = gpus.empty() ? "" : gpus[0];
  m.label = o.label, m.kiln_commit = res.kiln_commit.empty() ? "?" : res.kiln_commit;
  m.device = s.device, m.date = iso_date_now(), m.mode = mode, m.rounds = s.rounds, m.kiln_train = s.kiln_train;
  m.total_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::vector<ModelTrace> traces =
      res.interrupted || g_stop_signal != 0 ? std::vector<ModelTrace>{} : profile_models(s);
  m.total_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  write_report(s.out, m, res.rows);
  append_traces(s.out, traces);
  print_summary(res.rows, s.out, m.total_seconds);
  if (res.interrupted || g_stop_signal != 0) return 128 + g_stop_signal;
  for (const Row& r : res.rows)
    if (r.status == kFailed) return 1;  // the report is written, but a run failed: say so to scripts
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_options(argc, argv);
  try {
    if (o.list) {
      std::cout << list_text(select_tips(o.only));
      return 0;
    }
    return run(o);
  } catch (const UsageError& e) {
    std::cerr << "kiln-guide: " << e.what() << "\n(kiln-guide --help shows the usage)\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "kiln-guide: " << e.what() << "\n";
    return 2;
  }
}
