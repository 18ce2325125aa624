// Per-model traces for the report (traces.h).
#include "traces.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "runner.h"

namespace kiln_guide {

namespace fs = std::filesystem;

namespace {

// kiln-train profiles after 5 warm-up steps (its --profile); a few steps are enough to see the
// kernels, and tests (--steps) keep them tiny.
constexpr int64_t kWarmup = 5;

ModelTrace profile_one(const SessionOptions& s, const std::string& model) {
  ModelTrace t;
  t.model = model;
  const int64_t profiled = s.steps > 0 ? 2 : 5;
  const std::string dir = (fs::path(s.out) / "traces" / model).string();
  // --max-steps ends the run; epochs enough that a small dataset (tests) still has the steps
  std::vector<std::string> argv = {s.kiln_train,
                                   "--model",
                                   model,
                                   "--device",
                                   s.device,
                                   "--epochs",
                                   "8",
                                   "--max-steps",
                                   std::to_string(kWarmup + profiled),
                                   "--profile",
                                   std::to_string(profiled),
                                   "--out",
                                   dir};
  if (model == "gpt" && !s.gpt_data.empty()) argv.insert(argv.end() - 2, {"--data", s.gpt_data});
  if (model != "gpt" && !s.data.empty()) argv.insert(argv.end() - 2, {"--data", s.data});
  fs::create_directories(dir);
  const ProcessResult p = run_process(argv, dir + ".stdout", dir + ".stderr", 900);
  std::error_code ec;  // the run's model and checkpoints are no part of a report (tens of MB)
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".safetensors") fs::remove(e.path(), ec);
  if (!p.started || p.timed_out || p.exit_code != 0 || !fs::exists(dir + "/trace.json")) {
    t.trace = "kiln-train --profile failed: " + tail_of_file(dir + ".stderr", 3, 400);
    return t;
  }
  t.ok = true;
  t.trace = "traces/" + model + "/trace.json";
  t.table = "traces/" + model + "/profile.txt";
  std::ifstream table(dir + "/profile.txt");
  std::string line;
  for (int i = 0; std::getline(table, line) && i < 8; ++i) t.top.push_back(line);
  return t;
}

}  // namespace

std::vector<ModelTrace> profile_models(const SessionOptions& s) {
  std::vector<std::string> models = {"cnn", "gpt"};
  if (s.full) models.insert(models.begin() + 1, "resnet18");
  std::vector<ModelTrace> traces;
  for (const auto& m : models) {
    if (g_stop_signal != 0) break;
    traces.push_back(profile_one(s, m));
  }
  return traces;
}

void append_traces(const std::string& out, const std::vector<ModelTrace>& traces) {
  if (traces.empty()) return;
  std::ofstream f(fs::path(out) / "report.md", std::ios::app);
  f << "\n## Where a step's time goes\n\n"
    << "kiln-train --profile on each model (docs/profiling.md): open the trace in Perfetto or "
       "chrome://tracing; the table is the top ops by self time.\n";
  for (const ModelTrace& t : traces) {
    f << "\n### " << t.model << "\n\n";
    if (!t.ok) {
      f << t.trace << "\n";
      continue;
    }
    f << "[" << t.trace << "](" << t.trace << "), [" << t.table << "](" << t.table << ")\n\n```\n";
    for (const auto& line : t.top) f << line << "\n";
    f << "```\n";
  }
}

}  // namespace kiln_guide
