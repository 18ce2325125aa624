// kiln::debug reads every speed-costing debug switch in one place; all are off by default.
#include <catch2/catch.hpp>

#include <kiln/core/debug.h>
#include <kiln/kiln.h>

TEST_CASE("debug switches are off by default and summarised when on", "[core][debug]") {
  kiln::debug::all_off();
  REQUIRE(!kiln::debug::current().any());
  REQUIRE(kiln::debug::summary().empty());

  kiln::autograd::set_detect_anomaly(true);
  kiln::cuda::set_sync_debug_mode(kiln::cuda::SyncDebugMode::Warn);
  auto s = kiln::debug::current();
  CHECK(s.anomaly_detection);
  CHECK(s.sync_debug);
  CHECK(!s.deterministic_algorithms);
  CHECK(kiln::debug::summary() == "debug switches on (slower training): anomaly detection, sync-debug (warn)");

  kiln::set_deterministic_algorithms(true);
  kiln::cudnn::set_deterministic(true);
  CHECK(kiln::debug::summary().find("deterministic algorithms, cuDNN deterministic") != std::string::npos);

  kiln::debug::all_off();
  CHECK(!kiln::debug::current().any());
  CHECK(!kiln::autograd::is_anomaly_enabled());
  CHECK(kiln::cuda::sync_debug_mode() == kiln::cuda::SyncDebugMode::Off);
}
