// What the "nccl" process group does without a GPU: a kiln::Error that says why, never a crash.
// These run on every machine; the collectives themselves are tested in tests/cuda.
#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <kiln/config.h>
#include <kiln/distributed/backends/process_group.h>
#include <kiln/distributed/store/store.h>
#include <kiln/kiln.h>

namespace dist = kiln::distributed;
using Catch::Matchers::Contains;

namespace {

// A store that must not be reached: every check in these tests fails before the rendezvous.
class UnusedStore final : public dist::Store {
 public:
  void set(const std::string& key, const dist::Bytes&) override { reached(key); }
  dist::Bytes get(const std::string& key) override { reached(key); }
  int64_t add(const std::string& key, int64_t) override { reached(key); }
  bool check(const std::vector<std::string>&) override { reached("check"); }
  void wait(const std::vector<std::string>&, std::chrono::milliseconds) override { reached("wait"); }
  bool delete_key(const std::string& key) override { reached(key); }
  int64_t num_keys() override { reached("num_keys"); }

 private:
  [[noreturn]] static void reached(const std::string& what) {
    throw std::logic_error("the test store was used (" + what + ")");
  }
};

std::shared_ptr<dist::ProcessGroup> make(std::shared_ptr<dist::Store> store, int rank, int size) {
  return dist::make_nccl_process_group(std::move(store), rank, size, dist::ProcessGroupOptions{});
}

}  // namespace

TEST_CASE("nccl_available says whether kiln was built with NCCL", "[distributed][nccl]") {
  REQUIRE(dist::nccl_available() == (KILN_WITH_NCCL == 1));
}

TEST_CASE("the nccl backend without NCCL, or without a GPU, is a kiln::Error", "[distributed][nccl]") {
  auto store = std::make_shared<UnusedStore>();
  if (!KILN_WITH_NCCL) {
    REQUIRE_THROWS_WITH(make(store, 0, 1), Contains("built without NCCL"));
    return;
  }
  if (kiln::cuda::is_available()) {
    SUCCEED("a GPU is present: the no-device path cannot be taken (test_cuda covers the rest)");
    return;
  }
  REQUIRE_THROWS_AS(make(store, 0, 1), kiln::Error);
  REQUIRE_THROWS_WITH(make(store, 1, 2), Contains("rank 1 of 2") && Contains("no CUDA device"));
}

TEST_CASE("the nccl backend rejects bad ranks, sizes and stores before touching a GPU", "[distributed][nccl]") {
  if (!KILN_WITH_NCCL) return;  // the built-without Error comes first (case above)
  auto store = std::make_shared<UnusedStore>();
  REQUIRE_THROWS_WITH(make(nullptr, 0, 1), Contains("store is null"));
  REQUIRE_THROWS_WITH(make(store, 0, 0), Contains("size must be at least 1"));
  REQUIRE_THROWS_WITH(make(store, 2, 2), Contains("rank 2 is not in [0, 2)"));
  REQUIRE_THROWS_WITH(make(store, -1, 2), Contains("rank -1"));
  dist::ProcessGroupOptions zero;
  zero.timeout = std::chrono::milliseconds(0);
  REQUIRE_THROWS_WITH(dist::make_nccl_process_group(store, 0, 1, zero), Contains("timeout must be positive"));
}
