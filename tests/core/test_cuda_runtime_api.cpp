// The parts of the CUDA runtime API that must behave well on a machine without a GPU (CI):
// sync-debug reporting, and clear errors from streams, events and graphs when no device exists.
// The same API on a real device is tested in tests/cuda/test_cuda_runtime.cpp.
#include <catch2/catch.hpp>

#include <string>

#include <kiln/kiln.h>
#include "tests/test_util.h"

using kiln_test::error_of;

using kiln::cuda::SyncDebugMode;

namespace {
// Restores the global mode even when a check fails.
struct ModeRestore {
  SyncDebugMode saved = kiln::cuda::sync_debug_mode();
  ~ModeRestore() { kiln::cuda::set_sync_debug_mode(saved); }
};

}  // namespace

TEST_CASE("sync-debug mode is off by default and reports by mode", "[core][cuda][sync_debug]") {
  ModeRestore restore;
  REQUIRE(kiln::cuda::sync_debug_mode() == SyncDebugMode::Off);
  // Off: nothing happens.
  REQUIRE_NOTHROW(kiln::cuda::internal::report_sync("device-to-host copy of 4 bytes"));

  kiln::cuda::set_sync_debug_mode(SyncDebugMode::Error);
  REQUIRE(kiln::cuda::sync_debug_mode() == SyncDebugMode::Error);
  std::string msg = error_of([] { kiln::cuda::internal::report_sync("device-to-host copy of 4 bytes"); });
  CHECK(msg.find("implicit host-device synchronization") != std::string::npos);
  CHECK(msg.find("device-to-host copy of 4 bytes") != std::string::npos);
  // The allocator's waits are reported but never thrown.
  REQUIRE_NOTHROW(kiln::cuda::internal::report_sync("allocator wait", /*may_throw=*/false));

  kiln::cuda::set_sync_debug_mode(SyncDebugMode::Warn);
  REQUIRE_NOTHROW(kiln::cuda::internal::report_sync("blocking host-to-device copy of 8 bytes"));
}

TEST_CASE("sync-debug counts the syncs it reports, in Warn and Error, never in Off", "[core][cuda][sync_debug]") {
  ModeRestore restore;
  kiln::cuda::set_sync_debug_mode(SyncDebugMode::Off);
  const int64_t start = kiln::cuda::sync_count();
  kiln::cuda::internal::report_sync("device-to-host copy of 4 bytes");
  CHECK(kiln::cuda::sync_count() == start);  // Off: nothing looks, nothing counts

  kiln::cuda::set_sync_debug_mode(SyncDebugMode::Warn);
  for (int i = 0; i < 3; ++i) kiln::cuda::internal::report_sync("device-to-host copy of 4 bytes");
  CHECK(kiln::cuda::sync_count() == start + 3);  // every sync, though printed once per call site

  kiln::cuda::set_sync_debug_mode(SyncDebugMode::Error);
  CHECK_FALSE(error_of([] { kiln::cuda::internal::report_sync("device-to-host copy of 8 bytes"); }).empty());
  kiln::cuda::internal::report_sync("allocator wait", /*may_throw=*/false);
  CHECK(kiln::cuda::sync_count() == start + 5);  // thrown or not, each one counts

  // On the CPU there is nothing to synchronise: reading values back reports no sync.
  kiln::Tensor loss = (kiln::ones({4}) * 2.0).sum();
  CHECK(loss.item<double>() == 8.0);
  CHECK(loss.to(kiln::Device::cpu()).item<float>() == 8.0f);
  CHECK(kiln::cuda::sync_count() == start + 5);
}

TEST_CASE("sync-debug call sites name the calling functions", "[core][cuda][sync_debug]") {
  // libkiln's symbols are exported, so a frame inside the library is named (demangled).
  std::string site = kiln::cuda::internal::call_site(16);
  CHECK(!site.empty());
  CHECK(site.find("    at ") == 0);
}

TEST_CASE("streams, events and graphs fail clearly without a device", "[core][cuda]") {
  if (kiln::cuda::is_available()) {
    SUCCEED("a device is present: covered by the GPU tests");
    return;
  }
  CHECK(error_of([] { kiln::cuda::get_stream_from_pool(0); }).find("CUDA") != std::string::npos);
  kiln::cuda::Event ev;
  CHECK(!ev.recorded());
  CHECK(ev.query());  // never recorded: nothing to wait for
  kiln::cuda::Graph g;
  CHECK(!g.captured());
  std::string msg = error_of([&] { g.capture([] {}); });
  CHECK((msg.find("no CUDA device") != std::string::npos || msg.find("without CUDA") != std::string::npos));
  CHECK(!g.captured());
  CHECK(error_of([&] { g.replay(); }).find("nothing has been captured") != std::string::npos);
  CHECK(!kiln::cuda::current_stream_is_capturing());
  // CPU tensors: record_stream has nothing to do.
  kiln::Tensor t = kiln::ones({3});
  REQUIRE_NOTHROW(kiln::cuda::record_stream(t, kiln::Stream{kiln::Device::cpu(), nullptr}));
}
