// kiln-guide end to end: the built kiln-guide runs the built kiln-train on a tiny generated
// Fashion-MNIST-shaped dataset (a few steps a run) and its report is read back. Also: a failing
// run is a "failed" row with kiln-train's message and exit status 1, and setup errors exit 2.
#include <sys/wait.h>

#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <kiln/kiln.h>
#include <nlohmann/json.hpp>

#include "tests/test_util.h"

#if defined(KILN_GUIDE_BIN) && defined(KILN_TRAIN_BIN)

namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

// 512 training and 256 test images, 28x28, with labels: enough for four batches of 128.
void write_tiny_fashion_mnist(const fs::path& dir) {
  fs::create_directories(dir);
  for (auto [prefix, n] : {std::pair<const char*, int64_t>{"train", 512}, {"t10k", 256}}) {
    auto img = kiln::empty({n, 28, 28}, kiln::DType::U8);
    auto* p = img.data_ptr<uint8_t>();
    for (int64_t k = 0; k < img.numel(); ++k) p[k] = static_cast<uint8_t>((k * 37 + k / 784) % 251);
    auto lab = kiln::empty({n}, kiln::DType::U8);
    for (int64_t k = 0; k < n; ++k) lab.data_ptr<uint8_t>()[k] = static_cast<uint8_t>(k % 10);
    kiln::data::write_idx((dir / (std::string(prefix) + "-images-idx3-ubyte")).string(), img);
    kiln::data::write_idx((dir / (std::string(prefix) + "-labels-idx1-ubyte")).string(), lab);
  }
}

// Runs a shell command; returns its exit status, with stdout and stderr in `log`.
int run(const std::string& cmd, const fs::path& log) {
  const int st = std::system((cmd + " > " + log.string() + " 2>&1").c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

nlohmann::json row_of(const nlohmann::json& report, const std::string& name_start) {
  for (const auto& r : report["rows"])
    if (r["name"].get<std::string>().rfind(name_start, 0) == 0) return r;
  FAIL("no row " << name_start);
  return nullptr;
}

}  // namespace

TEST_CASE("kiln-guide --quick --only runs kiln-train and writes its report", "[utils][kiln-guide][slow]") {
  const fs::path dir = kiln_test::fresh_dir("kiln-guide-e2e");
  write_tiny_fashion_mnist(dir / "data");
  const fs::path out = dir / "report";
  // no --kiln-train: the kiln-train next to kiln-guide (both in the build's bin/)
  const int rc = run(std::string(KILN_GUIDE_BIN) + " --quick --device cpu --only fuse,cudnn --steps 6 --data " +
                         (dir / "data").string() + " --out " + out.string(),
                     dir / "log");
  INFO(kiln_test::slurp(dir / "log"));
  REQUIRE(rc == 0);
  CHECK_THAT(kiln_test::slurp(dir / "log"), Contains("[kiln-guide 2/2] tip 18 fuse, round 1/1, with"));

  const auto report = nlohmann::json::parse(kiln_test::slurp(out / "report.json"));
  REQUIRE(report["rows"].size() == 2);
  CHECK(report["machine"]["device"] == "cpu");
  CHECK(report["machine"]["cores"].get<int>() >= 1);
  CHECK_FALSE(report["machine"]["cpu_isa"].get<std::string>().empty());  // from kiln-train's summary
  // the kiln kiln-train was built from, from its summary: this build's
  CHECK(report["machine"]["kiln_commit"] == kiln::build_commit());

  const auto fuse = row_of(report, "fused pointwise ops");
  CHECK(fuse["tip"] == 18);
  CHECK(fuse["status"] == "measured");
  CHECK(fuse["model"] == "cnn");
  CHECK(fuse["direction"] == "higher is better");
  const double b = fuse["baseline"].get<double>(), w = fuse["with"].get<double>();
  CHECK(b > 0);
  CHECK(w > 0);
  CHECK(fuse["ratio"].get<double>() == Approx(w / b));
  CHECK(fuse["spread"]["baseline"][0].get<double>() == Approx(b));  // one round: min = max = median
  CHECK(fuse["spread"]["with"][1].get<double>() == Approx(w));

  const auto cudnn = row_of(report, "cuDNN autotuner");
  CHECK(cudnn["status"] == "needs a GPU");
  CHECK(cudnn["baseline"].is_null());
  CHECK(cudnn["ratio"].is_null());

  // each run: its command and kiln-train's JSON summary line
  const auto run_json = nlohmann::json::parse(kiln_test::slurp(out / "runs" / "fuse-baseline-r1.json"));
  CHECK_THAT(run_json["command"].get<std::string>(), Contains("--no-fuse"));
  CHECK(run_json["exit_code"] == 0);
  CHECK(run_json["summary"]["model"] == "cnn");
  CHECK(run_json["value"].get<double>() == Approx(b));
  CHECK(fs::exists(out / "runs" / "fuse-with-r1" / "metrics.csv"));
  CHECK_FALSE(fs::exists(out / "runs" / "fuse-with-r1" / "model.safetensors"));  // dropped: not needed
  CHECK(kiln_test::slurp(out / "report.png").substr(1, 3) == "PNG");
  CHECK_THAT(kiln_test::slurp(out / "report.md"), Contains("| 18 | fused pointwise ops (nn::fuse) | cnn |"));
  // the CNN's profile, linked from the report with its top ops (the GPT's needs its corpus)
  CHECK(nlohmann::json::parse(kiln_test::slurp(out / "traces" / "cnn" / "trace.json")).contains("traceEvents"));
  CHECK_THAT(kiln_test::slurp(out / "report.md"), Contains("[traces/cnn/trace.json](traces/cnn/trace.json)"));
  CHECK_THAT(kiln_test::slurp(out / "traces" / "cnn" / "profile.txt"), Contains("conv"));
  CHECK_FALSE(fs::exists(out / "traces" / "cnn" / "model.safetensors"));
  fs::remove_all(dir);
}

TEST_CASE("kiln-guide's switches change what kiln-train runs", "[utils][kiln-guide][slow]") {
  const fs::path dir = kiln_test::fresh_dir("kiln-guide-switches");
  write_tiny_fashion_mnist(dir / "data");
  const fs::path out = dir / "report";
  const int rc = run(std::string(KILN_GUIDE_BIN) +
                         " --device cpu --only syncs,syncs-speed,normalisation,lr-pick --steps 6 --data " +
                         (dir / "data").string() + " --out " + out.string(),
                     dir / "log");
  INFO(kiln_test::slurp(dir / "log"));
  REQUIRE(rc == 0);
  const auto report = nlohmann::json::parse(kiln_test::slurp(out / "report.json"));
  auto summary = [&](const std::string& id) {
    return nlohmann::json::parse(kiln_test::slurp(out / "runs" / (id + ".json")))["summary"];
  };

  // one loss read a step against one at the last step (the tiny epoch ends before --log-every 50)
  const auto syncs = row_of(report, "fewer host-device syncs: the loss read");
  CHECK(syncs["status"] == "measured");
  CHECK(syncs["direction"] == "lower is better");
  CHECK_THAT(syncs["metric"].get<std::string>(), Contains("host reads of device values per optimizer step"));
  CHECK(syncs["baseline"] == 1.0);
  const double steps = summary("syncs-with-r1")["steps"].get<double>();
  CHECK(syncs["with"].get<double>() == Approx(1 / steps));
  CHECK(row_of(report, "fewer host-device syncs: throughput")["status"] == "needs a GPU");

  // normalised inputs are the raw [0, 1] pixels standardised with Fashion-MNIST's mean and std
  const auto raw = summary("normalisation-baseline-r1"), norm = summary("normalisation-with-r1");
  CHECK(norm["input_mean"].get<double>() == Approx((raw["input_mean"].get<double>() - 0.2860) / 0.3530));
  CHECK(norm["input_std"].get<double>() == Approx(raw["input_std"].get<double>() / 0.3530));

  // the LR range test's pick is what the with side trains at; convergence runs evaluate mid-epoch
  const auto picked = summary("lr-pick-with-r1");
  CHECK(picked["max_lr"].get<double>() != summary("lr-pick-baseline-r1")["max_lr"].get<double>());
  CHECK(picked["lr_find_seconds"].get<double>() > 0);
  const auto cmd = nlohmann::json::parse(kiln_test::slurp(out / "runs" / "lr-pick-with-r1.json"))["command"];
  CHECK_THAT(cmd.get<std::string>(), Contains("--auto-lr"));
  CHECK_THAT(cmd.get<std::string>(), Contains("--eval-every 156"));
  fs::remove_all(dir);
}

TEST_CASE("kiln-guide: a failing run is a failed row, setup errors exit 2", "[utils][kiln-guide][slow]") {
  const fs::path dir = kiln_test::fresh_dir("kiln-guide-errors");
  fs::create_directories(dir / "empty");
  const std::string guide = std::string(KILN_GUIDE_BIN) + " --kiln-train " + KILN_TRAIN_BIN;

  // no Fashion-MNIST in the folder: kiln-train exits 2, the row says why and kiln-guide exits 1
  int rc = run(guide + " --device cpu --only channels-last --steps 2 --data " + (dir / "empty").string() + " --out " +
                   (dir / "out").string(),
               dir / "log");
  INFO(kiln_test::slurp(dir / "log"));
  CHECK(rc == 1);
  const auto report = nlohmann::json::parse(kiln_test::slurp(dir / "out" / "report.json"));
  REQUIRE(report["rows"].size() == 1);
  CHECK(report["rows"][0]["status"] == "failed");
  CHECK(report["rows"][0]["with"].is_null());
  CHECK_THAT(report["rows"][0]["explanation"].get<std::string>(), Contains("exited with status 2"));
  CHECK_THAT(report["rows"][0]["explanation"].get<std::string>(), Contains("train-images-idx3-ubyte[.gz] not found"));
  CHECK_FALSE(fs::exists(dir / "out" / "runs" / "channels-last-with-r1.json"));  // the tip stopped at its failure

  rc = run(std::string(KILN_GUIDE_BIN) + " --kiln-train " + (dir / "nope").string() + " --out " + (dir / "o2").string(),
           dir / "log2");
  CHECK(rc == 2);
  CHECK_THAT(kiln_test::slurp(dir / "log2"), Contains("kiln-train not found"));
  rc = run(guide + " --only 99 --out " + (dir / "o3").string(), dir / "log3");
  CHECK(rc == 2);
  CHECK_THAT(kiln_test::slurp(dir / "log3"), Contains("no tip '99'"));
  std::ofstream(dir / "file") << "x";
  rc = run(guide + " --out " + (dir / "file" / "sub").string(), dir / "log4");
  CHECK(rc == 2);
  CHECK_THAT(kiln_test::slurp(dir / "log4"), Contains("cannot write to --out"));
  rc = run(guide + " --list", dir / "log5");
  CHECK(rc == 0);
  CHECK_THAT(kiln_test::slurp(dir / "log5"), Contains("27  denormals"));
  fs::remove_all(dir);
}

#endif
