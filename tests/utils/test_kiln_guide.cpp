// kiln-guide's parts on fixed inputs: the statistics (median, spread, ratio direction), the
// report.json schema, the plan on a machine without a GPU, and the parsing of kiln-train's
// output (its JSON summary and metrics.csv).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "tests/test_util.h"
#include "tools/kiln-guide/report.h"
#include "tools/kiln-guide/runner.h"
#include "tools/kiln-guide/session.h"
#include "tools/kiln-guide/tips.h"

using namespace kiln_guide;
using Catch::Matchers::Contains;

namespace {

const Tip& tip_by_key(const std::string& key) {
  for (const Tip& t : tips())
    if (t.key == key) return t;
  FAIL("no tip " << key);
  throw std::logic_error("unreachable");
}

Row measured_row() {
  Row r;
  r.tip = 2, r.key = "workers", r.name = "loader workers", r.model = "cnn", r.metric = "throughput, images/s";
  r.direction = Direction::HigherIsBetter, r.sample_word = "images";
  r.baseline_values = {100, 120, 110}, r.with_values = {200, 180, 240};
  r.claim = "~2x", r.claimed_ratio = 2, r.source = "a guide", r.explanation = "why", r.status = kMeasured;
  return r;
}

}  // namespace

TEST_CASE("kiln-guide statistics: median, spread, ratio direction", "[utils][kiln-guide]") {
  CHECK(median({3, 1, 2}) == 2);
  CHECK(median({4, 1, 3, 2}) == 2.5);  // even count: the mean of the middle two
  CHECK(median({7}) == 7);
  CHECK(std::isnan(median({})));
  CHECK(spread({5, -1, 3}) == std::make_pair(-1.0, 5.0));
  CHECK(std::isnan(spread({}).first));
  // > 1 means the speed-up helps, whichever way the metric points
  CHECK(ratio(100, 250, Direction::HigherIsBetter) == 2.5);  // throughput: with / baseline
  CHECK(ratio(300, 150, Direction::LowerIsBetter) == 2.0);   // memory, time: baseline / with
  CHECK(ratio(100, 50, Direction::HigherIsBetter) == 0.5);
  // the ratio's range over the spreads: worst against best and best against worst
  const auto hi = ratio_range({100, 120}, {200, 240}, Direction::HigherIsBetter);
  CHECK(hi.first == Approx(200.0 / 120));
  CHECK(hi.second == Approx(2.4));
  const auto lo = ratio_range({300, 360}, {100, 150}, Direction::LowerIsBetter);
  CHECK(lo.first == Approx(2.0));
  CHECK(lo.second == Approx(3.6));
}

TEST_CASE("kiln-guide formats values in their units", "[utils][kiln-guide]") {
  CHECK(format_value(12345.6, Unit::SamplesPerSecond, "images") == "12,346 images/s");
  CHECK(format_value(999, Unit::SamplesPerSecond, "tokens") == "999 tokens/s");
  CHECK(format_value(3 * 1024.0 * 1024.0, Unit::Bytes) == "3.0 MiB");
  CHECK(format_value(14.25, Unit::Seconds) == "14.2 s");
  CHECK(format_value(0.91234, Unit::Accuracy) == "91.23%");
  CHECK(format_value(NAN, Unit::Seconds) == "-");
  CHECK(format_value(0.02, Unit::PerStep) == "0.02 per step");
  CHECK(format_value(1, Unit::PerStep) == "1.00 per step");
  CHECK(format_value(1234, Unit::Samples) == "1,234 samples");
  CHECK(format_duration(278.4) == "4m 38s");
  CHECK(format_duration(48.4) == "48s");
}

TEST_CASE("kiln-guide report.json has exactly the documented schema", "[utils][kiln-guide]") {
  Row gpu;
  gpu.tip = 6, gpu.key = "cudnn", gpu.name = "cuDNN autotuner", gpu.model = "resnet18", gpu.metric = "throughput";
  gpu.claim = "+27%", gpu.claimed_ratio = 1.27, gpu.status = kNeedsGpu, gpu.explanation = "one conv";
  Row failed = measured_row();
  failed.status = kFailed, failed.failure = "kiln-train exited with status 2\nFashion-MNIST not found";
  Row skipped;
  skipped.tip = 11, skipped.name = "gradients to none", skipped.status = kNotMeasured,
  skipped.explanation = "always on";
  Row fit = measured_row();
  fit.tip = 8, fit.name = "activation checkpointing: the batch it allows", fit.unit = Unit::Samples;
  fit.baseline_values = {32}, fit.with_values = {87};
  MemoryFit mf;
  mf.baseline_batches[0] = 32, mf.baseline_batches[1] = 8, mf.with_batches[0] = 32, mf.with_batches[1] = 8;
  mf.baseline = {30e6, 4.5e6}, mf.with = {31e6, 1.6e6};
  fit.fit = mf;
  Machine m;
  m.cpu = "Test CPU", m.cores = 2, m.cpu_isa = "avx2", m.device = "cpu", m.date = "2026-01-01T00:00:00+0000";
  m.mode = "quick", m.rounds = 3, m.total_seconds = 12.5, m.kiln_train = "/bin/kiln-train";
  m.kiln_commit = "0123456789ab";

  const nlohmann::json j = nlohmann::json::parse(report_json(m, {measured_row(), gpu, failed, skipped, fit}).dump());
  REQUIRE(j.size() == 2);
  CHECK(j["machine"]["cpu"] == "Test CPU");
  CHECK(j["machine"]["cores"] == 2);
  CHECK(j["machine"]["cpu_isa"] == "avx2");
  CHECK(j["machine"]["gpu"].is_null());
  CHECK(j["machine"]["total_seconds"] == 12.5);
  CHECK(j["machine"]["kiln_commit"] == "0123456789ab");  // which kiln was measured
  CHECK(j["machine"]["label"].is_null());                // no --label
  REQUIRE(j["rows"].size() == 5);
  const std::set<std::string> keys = {"tip",   "name",   "model", "metric", "direction",   "baseline", "with",
                                      "ratio", "spread", "claim", "source", "explanation", "fit",      "status"};
  for (const auto& r : j["rows"]) {
    std::set<std::string> got;
    for (const auto& kv : r.items()) got.insert(kv.key());
    CHECK(got == keys);
  }
  const auto& r0 = j["rows"][0];
  CHECK(r0["tip"] == 2);
  CHECK(r0["status"] == "measured");
  CHECK(r0["direction"] == "higher is better");
  CHECK(r0["baseline"] == 110.0);
  CHECK(r0["with"] == 200.0);
  CHECK(r0["ratio"].get<double>() == Approx(200.0 / 110));
  CHECK(r0["spread"]["baseline"] == nlohmann::json::array({100.0, 120.0}));
  CHECK(r0["spread"]["with"] == nlohmann::json::array({180.0, 240.0}));
  // rows without a measurement carry no number at all
  for (int i : {1, 2, 3}) {
    const auto& r = j["rows"][i];
    CHECK(r["baseline"].is_null());
    CHECK(r["with"].is_null());
    CHECK(r["ratio"].is_null());
    CHECK(r["spread"]["baseline"].is_null());
    CHECK(r["spread"]["with"].is_null());
    CHECK(r["fit"].is_null());
  }
  CHECK(r0["fit"].is_null());  // only batch-fit rows have a fit
  const auto& f = j["rows"][4]["fit"];
  CHECK(f["baseline"]["batches"] == nlohmann::json::array({32, 8}));
  CHECK(f["baseline"]["fixed_bytes"] == 30e6);
  CHECK(f["baseline"]["bytes_per_sample"] == 4.5e6);
  CHECK(f["with"]["bytes_per_sample"] == 1.6e6);
  CHECK(j["rows"][4]["ratio"].get<double>() == Approx(87.0 / 32));
  CHECK(j["rows"][1]["status"] == "needs a GPU");
  CHECK(j["rows"][2]["status"] == "failed");
  CHECK_THAT(j["rows"][2]["explanation"].get<std::string>(), Contains("Fashion-MNIST not found"));
  CHECK(j["rows"][3]["status"] == "not measured");
  CHECK(j["rows"][3]["model"].is_null());
  CHECK(j["rows"][3]["direction"].is_null());

  const std::string md = report_markdown(m, {measured_row(), gpu, failed, skipped});
  CHECK_THAT(md, Contains("| 2 | loader workers | cnn |"));
  CHECK_THAT(md, Contains("| 110 images/s | 200 images/s | 1.82x | 100-120; 180-240 |"));
  CHECK_THAT(md, Contains("Test CPU, 2 cores, CPU kernels avx2; GPU: none"));
  CHECK_THAT(md, Contains("kiln-train: `/bin/kiln-train`, kiln 0123456789ab."));
  m.label = "Zen 5 VM";  // --label names the machine beside its CPU model
  CHECK_THAT(report_markdown(m, {measured_row()}), Contains("Test CPU (Zen 5 VM), 2 cores"));
  CHECK(nlohmann::json::parse(report_json(m, {measured_row()}).dump())["machine"]["label"] == "Zen 5 VM");
  CHECK_THAT(md, Contains("## Failed runs"));
}

TEST_CASE("kiln-guide on a CPU-only machine: GPU tips need a GPU and never run", "[utils][kiln-guide]") {
  SessionOptions o;
  o.device = "cpu", o.kiln_train = "/bin/kiln-train", o.kiln_run = "/bin/kiln-run", o.out = "/tmp/x";
  const std::vector<const Tip*> all = select_tips("");
  REQUIRE(all.size() == tips().size());
  int gpu_rows = 0;
  std::vector<Row> rows;
  for (const Tip* t : all) {
    std::optional<std::string> skip;
    rows.push_back(planned_row(*t, o, &skip));
    if (t->needs_gpu) {
      ++gpu_rows;
      CHECK(skip == std::optional<std::string>(kNeedsGpu));
      CHECK_THAT(rows.back().with_command, Contains("--device cuda"));  // what it would run on a GPU
    }
  }
  CHECK(gpu_rows == 5);  // pinned memory, fp16, cuDNN autotuning, the syncs' cost, CUDA graphs
  for (const Job& j : plan_jobs(all, o)) {
    CHECK_FALSE(j.tip->needs_gpu);
    CHECK(j.device == "cpu");
    for (const auto& a : j.argv) CHECK(a != "cuda");
  }
  const nlohmann::json j = nlohmann::json::parse(report_json(Machine(), rows).dump());
  for (const auto& r : j["rows"])
    if (r["status"] == "needs a GPU") {
      CHECK(r["baseline"].is_null());
      CHECK(r["with"].is_null());
      CHECK(r["ratio"].is_null());
    }
}

TEST_CASE("kiln-guide plan: alternating rounds, paired seeds, device per tip", "[utils][kiln-guide]") {
  SessionOptions o;
  o.device = "cuda", o.gpu_count = 1, o.rounds = 3, o.kiln_train = "/bin/kiln-train", o.kiln_run = "/bin/kiln-run";
  o.out = "/tmp/x";
  const auto jobs = plan_jobs(select_tips("fuse,denormals,ddp"), o);
  REQUIRE(jobs.size() == 3 * 6);
  for (size_t i = 0; i < jobs.size(); ++i) {
    CHECK(jobs[i].with == (i % 2 == 1));  // baseline, with, baseline, with, ...
    CHECK(jobs[i].round == static_cast<int>(i % 6) / 2);
  }
  auto arg_after = [](const Job& j, const std::string& flag) {
    for (size_t i = 0; i + 1 < j.argv.size(); ++i)
      if (j.argv[i] == flag) return j.argv[i + 1];
    return std::string();
  };
  for (const Job& j : jobs) {
    CHECK(arg_after(j, "--seed") == std::to_string(j.round));  // both sides of a round share a seed
    if (j.tip->key == "fuse") CHECK(j.device == "cuda");
    if (j.tip->key == "denormals") CHECK(j.device == "cpu");  // a CPU switch, whatever --device says
    if (j.tip->key == "ddp") {
      CHECK(j.device == "cpu");  // one GPU: the ranks are CPU cores
      CHECK((j.argv[0] == "/bin/kiln-run") == j.with);
    }
  }
  o.steps = 7;  // --steps: every run one epoch of 7 steps
  for (const Job& j : plan_jobs(select_tips("1cycle"), o)) {
    CHECK(arg_after(j, "--max-steps") == "7");
    CHECK(arg_after(j, "--epochs") == "1");
  }
  CHECK_THROWS_AS(select_tips("fuse,nope"), UsageError);
  const auto two = select_tips(" 4 , fuse,2");
  REQUIRE(two.size() == 5);  // both rows of 2 and of 4, and 18, in the guide's order
  CHECK(two[0]->number == 2);
  CHECK(two[4]->key == "fuse");
}

TEST_CASE("kiln-guide convergence rows: time to target, or final accuracy when a run misses it",
          "[utils][kiln-guide]") {
  const Tip& t = tip_by_key("1cycle");
  SessionOptions o;
  o.rounds = 2;
  auto run = [](double acc, std::optional<double> seconds) {
    RunOutcome r;
    r.ok = true, r.final_accuracy = acc, r.value = acc;
    if (seconds) r.hit = TargetHit{100, *seconds};
    return r;
  };
  Row row;
  fill_row(row, t, {run(0.91, 30), run(0.92, 34)}, {run(0.93, 10), run(0.92, 12)}, o);
  CHECK(row.status == kMeasured);
  CHECK_THAT(row.metric, Contains("seconds to 90% test accuracy"));
  CHECK(row.direction == Direction::LowerIsBetter);
  CHECK(row.baseline_values == std::vector<double>{30, 34});
  CHECK(ratio(median(row.baseline_values), median(row.with_values), row.direction) == Approx(32.0 / 11));

  Row miss;
  fill_row(miss, t, {run(0.88, std::nullopt), run(0.91, 34)}, {run(0.93, 10), run(0.92, 12)}, o);
  CHECK_THAT(miss.metric, Contains("final test accuracy after 3 epochs"));
  CHECK_THAT(miss.metric, Contains("not reached in every run"));
  CHECK(miss.direction == Direction::HigherIsBetter);
  CHECK(miss.baseline_values == std::vector<double>{0.88, 0.91});
  CHECK(miss.with_values == std::vector<double>{0.93, 0.92});
}

TEST_CASE("kiln-guide reads kiln-train's output", "[utils][kiln-guide]") {
  const auto dir = kiln_test::fresh_dir("kiln-guide-parse");
  std::ofstream(dir / "metrics.csv") << "step,epoch,loss,lr,grad_norm,samples_per_second,test_accuracy\n"
                                        "50,1,0.9,0.01,,1000,\n"  // the warm-up window: left out
                                        "100,1,0.5,0.01,,4000,\n"
                                        "150,1,0.4,0.01,,2000,\n"
                                        "150,1,0.4,0.01,,,0.85\n"
                                        "200,2,0.3,0.01,,2000,\n"
                                        "300,2,0.3,0.01,,4000,\n"
                                        "300,2,0.3,0.01,,,0.905\n";
  const auto rows = read_metrics_csv((dir / "metrics.csv").string());
  REQUIRE(rows.size() == 7);
  CHECK(rows[3].test_accuracy == Approx(0.85));
  CHECK_FALSE(rows[3].samples_per_second.has_value());
  // steps over time: (50 + 50 + 50 + 100) / (50/4000 + 50/2000 + 50/2000 + 100/4000)
  CHECK(steady_throughput(rows) == Approx(250 / (0.0125 + 0.025 + 0.025 + 0.025)));
  // the second half (after step 150): (50 + 100) / (50/2000 + 100/4000)
  CHECK(steady_throughput(rows, 150) == Approx(150 / (0.025 + 0.025)));
  const auto hit = time_to_accuracy(rows, 0.9, 60);
  REQUIRE(hit.has_value());
  CHECK(hit->step == 300);
  CHECK(hit->seconds == Approx(60));
  const auto early = time_to_accuracy(rows, 0.8, 60);
  REQUIRE(early.has_value());
  CHECK(early->seconds == Approx(30));  // step 150 of 300
  CHECK_FALSE(time_to_accuracy(rows, 0.95, 60).has_value());
  CHECK(read_metrics_csv((dir / "missing.csv").string()).empty());
  std::ofstream(dir / "bad.csv") << "step,epoch,loss,lr,grad_norm,samples_per_second,test_accuracy\nx,1,,,,,\n";
  CHECK_THROWS_WITH(read_metrics_csv((dir / "bad.csv").string()), Contains("bad.csv"));

  std::string raw;
  const auto j = last_json_line("epoch 1: ...\n[rank 0] {\"samples_per_second\": 5.5}\nnot json {\n", &raw);
  REQUIRE(j.is_object());
  CHECK(j["samples_per_second"] == 5.5);
  CHECK(raw == "{\"samples_per_second\": 5.5}");
  CHECK(last_json_line("no json here\n").is_null());
  CHECK(shell_join({"kiln-train", "--data", "a b", "--x=1"}) == "kiln-train --data 'a b' --x=1");
  std::filesystem::remove_all(dir);
}

TEST_CASE("kiln-guide's tip table is complete and well formed", "[utils][kiln-guide]") {
  std::set<int> numbers;
  std::set<std::string> keys;
  for (const Tip& t : tips()) {
    numbers.insert(t.number);
    CHECK(keys.insert(t.key).second);  // --only needs unique keys
    CHECK_FALSE(t.name.empty());
    CHECK_FALSE(t.claim.empty());
    CHECK_FALSE(t.source.empty());
    CHECK_FALSE(t.explanation.empty());
    CHECK(t.gpu_explanation != t.explanation);  // a GPU reason only where it differs
    if (t.not_measured.empty()) {
      CHECK((t.model == "cnn" || t.model == "resnet18" || t.model == "gpt"));
      CHECK(t.baseline != t.with);
      if (t.metric == MetricKind::Convergence) CHECK(t.target_accuracy > 0.5);
      if (t.metric == MetricKind::BatchFit) {  // each side's second batch differs from its first
        CHECK(t.baseline_probe_batch > 0);
        CHECK(t.with_probe_batch > 0);
      }
    }
  }
  for (int n = 1; n <= 27; ++n) CHECK(numbers.count(n) == 1);  // every speed-up of docs/guide.md
}

TEST_CASE("kiln-guide batch fit: a line through two peaks, the largest batch within a budget", "[utils][kiln-guide]") {
  const LinearFit f = fit_peak(32, 170e6, 8, 62e6);  // 4.5 MB a sample over 32e6 fixed
  CHECK(f.per_sample == Approx(4.5e6));
  CHECK(f.fixed == Approx(26e6));
  CHECK(largest_batch_within(f, 170e6) == 32);  // its own peak: its own batch, despite rounding
  CHECK(largest_batch_within(f, 170e6 - 1) == 31);
  CHECK(largest_batch_within(f, 20e6) == 0);                                      // not even one sample fits
  CHECK(std::isnan(largest_batch_within(fit_peak(32, 100e6, 8, 100e6), 200e6)));  // flat: no largest
  CHECK(std::isnan(fit_peak(8, 1, 8, 2).per_sample));

  const Tip& t = tip_by_key("checkpointing-batch");
  auto run = [](int round, bool probe, int64_t batch, double peak) {
    RunOutcome r;
    r.ok = true, r.round = round, r.probe = probe, r.batch = batch, r.value = peak;
    return r;
  };
  SessionOptions o;
  o.rounds = 2;
  Row row;
  row.metric = "largest batch";
  // baseline 4.5 MB a sample; with checkpointing 1.5 MB a sample over 30 MB fixed
  fill_row(row, t, {run(0, false, 32, 170e6), run(0, true, 8, 62e6), run(1, true, 8, 63e6), run(1, false, 32, 171e6)},
           {run(1, false, 32, 78e6), run(0, false, 32, 78e6), run(0, true, 8, 42e6), run(1, true, 8, 42e6)}, o);
  CHECK(row.status == kMeasured);
  CHECK(row.baseline_values == std::vector<double>{32, 32});
  // round 1: (170e6 - 30e6) / 1.5e6 = 93.3; round 2 the same line under a 171e6 budget: 94
  CHECK(row.with_values == std::vector<double>{93, 94});
  REQUIRE(row.fit.has_value());
  CHECK(row.fit->with.per_sample == Approx(1.5e6));
  CHECK(row.fit->baseline_batches[1] == 8);
  CHECK_THAT(row.metric, Contains("per sample: baseline"));

  // accumulation: the with side's micro-batch times its 4 micro-batches a step
  RunOutcome w = run(0, false, 8, 66e6), wp = run(0, true, 16, 102e6);
  w.accum = wp.accum = 4;
  Row acc;
  fill_row(acc, tip_by_key("grad-accum-batch"), {run(0, false, 32, 170e6), run(0, true, 8, 62e6)}, {w, wp}, o);
  CHECK(acc.with_values == std::vector<double>{4 * 31});  // micro-batches: (170e6 - 30e6) / 4.5e6 = 31.1

  Row flat;
  fill_row(flat, t, {run(0, false, 32, 170e6), run(0, true, 8, 62e6)}, {run(0, false, 32, 60e6), run(0, true, 8, 61e6)},
           o);
  CHECK(flat.status == kFailed);
  CHECK_THAT(flat.failure, Contains("did not grow with the batch"));
  CHECK(flat.with_values.empty());
}

TEST_CASE("kiln-guide plan: eval cadence, fit runs, sync counting per device", "[utils][kiln-guide]") {
  SessionOptions o;
  o.device = "cpu", o.rounds = 1, o.kiln_train = "/bin/kiln-train", o.kiln_run = "/bin/kiln-run", o.out = "/tmp/x";
  auto arg_after = [](const Job& j, const std::string& flag) {
    for (size_t i = 0; i + 1 < j.argv.size(); ++i)
      if (j.argv[i] == flag) return j.argv[i + 1];
    return std::string();
  };
  auto has = [](const Job& j, const std::string& flag) {
    return std::find(j.argv.begin(), j.argv.end(), flag) != j.argv.end();
  };
  // convergence runs evaluate every kEvalSamples samples, in steps of the side's batch
  for (const Job& j : plan_jobs(select_tips("batch,1cycle,lr-pick,normalisation"), o)) {
    const int64_t batch = j.tip->key == "batch" ? (j.with ? 512 : 64) : 128;
    CHECK(j.batch == batch);
    CHECK(arg_after(j, "--eval-every") == std::to_string(std::llround(static_cast<double>(kEvalSamples) / batch)));
    if (j.tip->key == "lr-pick") CHECK(has(j, "--auto-lr") == j.with);
    if (j.tip->key == "normalisation") CHECK(arg_after(j, "--normalize-inputs") == (j.with ? "true" : "false"));
  }
  std::optional<std::string> skip_eval;
  // a batch fit runs each side twice a round: at its own batch and at its probe batch
  const auto fit = plan_jobs(select_tips("grad-accum-batch"), o);
  REQUIRE(fit.size() == 4);
  CHECK((!fit[0].with && !fit[0].probe && fit[0].batch == 32 && arg_after(fit[0], "--batch-size").empty()));
  CHECK((fit[1].with && !fit[1].probe && fit[1].batch == 8 && fit[1].accum == 4));
  CHECK((!fit[2].with && fit[2].probe && arg_after(fit[2], "--batch-size") == "8"));
  CHECK((fit[3].with && fit[3].probe && arg_after(fit[3], "--batch-size") == "16" &&
         arg_after(fit[3], "--grad-accum") == "4"));
  CHECK(fit[3].id == "grad-accum-batch-with-b16-r1");
  for (const Job& j : fit) CHECK_FALSE(has(j, "--eval-every"));
  // evaluation throughput: kEvalRuns evaluations spread over the steps, one log window, and the
  // baseline with grad mode on in evaluation
  for (const Job& j : plan_jobs(select_tips("no-grad-eval"), o)) {
    const int64_t steps = std::stoll(arg_after(j, "--max-steps"));
    CHECK(arg_after(j, "--eval-every") == std::to_string(steps / (kEvalRuns + 1)));
    CHECK(arg_after(j, "--log-every") == std::to_string(steps));
    CHECK(arg_after(j, "--eval-no-grad") == (j.with ? "" : "false"));
  }
  CHECK_THAT(planned_row(tip_by_key("no-grad-eval"), o, &skip_eval).metric, Contains("evaluation throughput"));
  // the sync count: kiln-train's host reads on the CPU, sync-debug's count on a GPU
  std::optional<std::string> skip;
  const Tip& syncs = tip_by_key("syncs");
  CHECK_THAT(planned_row(syncs, o, &skip).metric, Contains("host reads of device values per optimizer step"));
  for (const Job& j : plan_jobs({&syncs}, o)) {
    CHECK(has(j, "--sync-every-step") == !j.with);
    CHECK_FALSE(has(j, "--sync-debug"));
  }
  o.device = "cuda", o.gpu_count = 1;
  const Row gpu = planned_row(syncs, o, &skip);
  CHECK_THAT(gpu.metric, Contains("as sync-debug counts them"));
  CHECK(gpu.direction == Direction::LowerIsBetter);
  CHECK(gpu.unit == Unit::PerStep);
  for (const Job& j : plan_jobs({&syncs}, o)) CHECK(arg_after(j, "--sync-debug") == "warn");
}

TEST_CASE("kiln-guide explains a row by where it trains", "[utils][kiln-guide]") {
  SessionOptions o;
  std::optional<std::string> skip;
  const Tip& anomaly = tip_by_key("debug-off");
  REQUIRE_FALSE(anomaly.gpu_explanation.empty());
  CHECK(planned_row(anomaly, o, &skip).explanation == anomaly.explanation);  // the CPU's reason
  o.device = "cuda", o.gpu_count = 1;
  CHECK(planned_row(anomaly, o, &skip).explanation == anomaly.gpu_explanation);
  CHECK_THAT(planned_row(anomaly, o, &skip).explanation, Contains("synchronisation"));
  // rows that train on the CPU whatever the device keep the CPU's reason: DDP over one GPU, the
  // denormal switch
  for (const char* key : {"ddp", "denormals"}) {
    const Tip& t = tip_by_key(key);
    CHECK_THAT(planned_row(t, o, &skip).explanation, Contains(t.explanation));  // (ddp: after a note)
  }
  // a row without a GPU reason of its own keeps its one reason on a GPU
  const Tip& clip = tip_by_key("clip");
  CHECK(clip.gpu_explanation.empty());
  CHECK(planned_row(clip, o, &skip).explanation == clip.explanation);
}

TEST_CASE("kiln-guide convergence metric: sub-epoch evaluations, the range test's time", "[utils][kiln-guide]") {
  SessionOptions o;
  RunOutcome hit;
  hit.ok = true, hit.final_accuracy = hit.value = 0.91, hit.hit = TargetHit{300, 5.5};
  Row row;
  fill_row(row, tip_by_key("lr-pick"), {hit}, {hit}, o);
  CHECK_THAT(row.metric, Contains("the first evaluation that reaches it"));
  CHECK_THAT(row.metric, Contains("every 20,000 samples of training"));
  CHECK_THAT(row.metric, Contains("includes its LR range test"));
}
