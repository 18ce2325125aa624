// Work (kiln/distributed/backends/work.h): completion, failure, and then() callbacks - that they run
// before wait() returns, on the completing thread, at once when already done, never after a
// failure, and that a throwing callback fails the work. Also the backends' hint naming the ranks
// that exited. In one process, no ranks.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "kiln/core/error.h"
#include "kiln/distributed/backends/process_group.h"
#include "kiln/distributed/backends/work.h"
#include "tests/error_of.h"

using Catch::Matchers::Contains;
using kiln::distributed::Work;
using kiln_test::error_of;
using namespace std::chrono_literals;

TEST_CASE("Work::then runs on the completing thread before wait() returns", "[distributed][work]") {
  Work work("all_reduce #1 (test)");
  std::atomic<int> ran{0};
  std::thread::id ran_on;
  work.then([&] {
    std::this_thread::sleep_for(50ms);  // a slow callback: wait() must still see it finished
    ran_on = std::this_thread::get_id();
    ++ran;
  });
  work.then([&] { ran += 10; });
  REQUIRE_FALSE(work.is_completed());
  std::thread backend([&] { work.mark_completed(); });
  const auto backend_id = backend.get_id();
  work.wait(5000ms);
  CHECK(ran == 11);
  CHECK(work.is_success());
  backend.join();
  CHECK(ran_on == backend_id);
}

TEST_CASE("Work::then on a completed work runs at once on the caller", "[distributed][work]") {
  Work work("barrier #2 (test)");
  work.mark_completed();
  int ran = 0;
  work.then([&] { ++ran; });
  CHECK(ran == 1);
  work.mark_completed();  // the first completion wins: nothing runs twice
  CHECK(ran == 1);
}

TEST_CASE("Work::then is dropped when the work fails", "[distributed][work]") {
  Work work("broadcast #3 (test)");
  int ran = 0;
  work.then([&] { ++ran; });
  work.mark_failed(std::make_exception_ptr(kiln::Error("peer 1 closed its connection")));
  work.then([&] { ++ran; });
  CHECK(ran == 0);
  CHECK_FALSE(work.is_success());
  CHECK_THAT(error_of([&] { work.wait(1000ms); }), Contains("peer 1 closed its connection"));
}

TEST_CASE("a throwing Work::then callback fails the work with its error", "[distributed][work]") {
  Work work("all_reduce #4 (test)");
  int later = 0;
  work.then([] { throw kiln::Error("copying the bucket back failed"); });
  work.then([&] { ++later; });
  work.mark_completed();
  CHECK(later == 0);
  CHECK(work.is_completed());
  CHECK_FALSE(work.is_success());
  CHECK_THAT(error_of([&] { work.wait(1000ms); }), Contains("copying the bucket back failed"));
}

TEST_CASE("Work::then added by a running callback still runs before completion", "[distributed][work]") {
  Work work("all_reduce #5 (test)");
  int order = 0, first = 0, second = 0;
  work.then([&] {
    first = ++order;
    work.then([&] { second = ++order; });
  });
  work.mark_completed();
  CHECK(first == 1);
  CHECK(second == 2);
  CHECK(work.is_success());
}

TEST_CASE("exited_ranks_hint names the ranks that exited, waiting a bounded time for the store",
          "[distributed][work]") {
  using kiln::distributed::exited_ranks_hint;
  REQUIRE(exited_ranks_hint({}).empty());
  REQUIRE(exited_ranks_hint([] { return std::vector<int>{2}; }) ==
          ". Rank 2 has exited (or been killed) in the meantime");
  REQUIRE(exited_ranks_hint([] {
            return std::vector<int>{1, 3};
          }) == ". Ranks 1, 3 have exited (or been killed) in the meantime");
  // The store learns of a death a moment after the sockets: asked again until it does.
  int calls = 0;
  auto late = [&calls] { return ++calls < 3 ? std::vector<int>{} : std::vector<int>{0}; };
  REQUIRE(exited_ranks_hint(late, 5s) == ". Rank 0 has exited (or been killed) in the meantime");
  REQUIRE(calls == 3);
  // Nobody exited: "" once the wait is over, not much later.
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(exited_ranks_hint([] { return std::vector<int>{}; }, 200ms).empty());
  const auto took = std::chrono::steady_clock::now() - t0;
  REQUIRE(took >= 200ms);
  REQUIRE(took < 2s);
}
