// The caching device allocator's bookkeeping, run on the CPU against a malloc-based fake backend.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "kiln/cuda/caching_allocator.h"
#include "kiln/utils/memory_timeline.h"
#include "kiln/core/error.h"

using kiln::CachingAllocator;

namespace {

constexpr size_t KiB = 1024, MiB = 1024 * 1024;

// malloc with a capacity limit; counts calls; streams are busy until marked done.
class FakeBackend final : public kiln::AllocatorBackend {
 public:
  explicit FakeBackend(size_t capacity = 1024 * MiB) : capacity_(capacity) {}
  ~FakeBackend() override {
    for (auto& [p, n] : live_) std::free(p);
  }
  void* raw_alloc(size_t n) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (used_ + n > capacity_) return nullptr;
    void* p = std::malloc(n);
    if (!p) return nullptr;
    live_[p] = n;
    used_ += n;
    allocs++;
    return p;
  }
  void raw_free(void* p) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(p);
    REQUIRE(it != live_.end());
    used_ -= it->second;
    live_.erase(it);
    std::free(p);
    frees++;
  }
  void synchronize_stream(void* s) override {
    std::lock_guard<std::mutex> lock(mu_);
    busy_.erase(s);
    syncs++;
  }
  bool stream_done(void* s) override {
    std::lock_guard<std::mutex> lock(mu_);
    return busy_.count(s) == 0;
  }
  void* record_event(void* s) override {  // the event is the stream: done when the stream is
    events++;
    return s;
  }
  void set_busy(void* s, bool busy) {
    std::lock_guard<std::mutex> lock(mu_);
    if (busy) busy_.insert(s);
    else busy_.erase(s);
  }
  size_t used() {
    std::lock_guard<std::mutex> lock(mu_);
    return used_;
  }

  std::atomic<int> allocs{0}, frees{0}, syncs{0}, events{0};

 private:
  std::mutex mu_;
  size_t capacity_;
  size_t used_ = 0;
  std::map<void*, size_t> live_;
  std::set<void*> busy_;
};

void* stream(uintptr_t id) { return reinterpret_cast<void*>(id); }

// A 4 KiB block of `a` allocated on stream 1 whose use is recorded on stream `user`, marked busy:
// once freed, the block stays out of reuse until `user` is done.
void* block_in_use_on(FakeBackend& be, CachingAllocator& a, uintptr_t user) {
  void* p = a.allocate(4096, stream(1));
  a.record_stream(p, stream(user));
  be.set_busy(stream(user), true);
  return p;
}

// Marks stream `user` done, lets `a` see it, then allocates 4 KiB on stream 1 (a block that
// block_in_use_on gave and that was freed meanwhile is free again by now).
void* allocate_after_done(FakeBackend& be, CachingAllocator& a, uintptr_t user) {
  be.set_busy(stream(user), false);
  a.process_events();
  return a.allocate(4096, stream(1));
}

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string tmp_path(const char* name) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir && *dir ? dir : "/tmp") + "/kiln_alloc_test_" + name;
}

}  // namespace

TEST_CASE("caching allocator rounds sizes and picks pools", "[allocator]") {
  CHECK(CachingAllocator::round_size(1) == 512);
  CHECK(CachingAllocator::round_size(512) == 512);
  CHECK(CachingAllocator::round_size(513) == 1024);
  CHECK(CachingAllocator::segment_size(512) == 2 * MiB);
  CHECK(CachingAllocator::segment_size(MiB) == 2 * MiB);
  CHECK(CachingAllocator::segment_size(MiB + 512) == 2 * MiB);
  CHECK(CachingAllocator::segment_size(3 * MiB) == 4 * MiB);
  CHECK(CachingAllocator::segment_size(11 * MiB + 512) == 11 * MiB + 512);

  FakeBackend be;
  CachingAllocator a(&be, "fake");
  REQUIRE(a.allocate(0) == nullptr);
  void* p = a.allocate(100);
  auto s = a.stats();
  CHECK(s.allocated_bytes == 512);
  CHECK(s.requested_bytes == 100);
  CHECK(s.reserved_bytes == 2 * MiB);
  CHECK(s.num_backend_allocs == 1);
  void* q = a.allocate(3 * MiB);  // large pool: its own 4 MiB segment
  s = a.stats();
  CHECK(s.reserved_bytes == 6 * MiB);
  CHECK(s.num_backend_allocs == 2);
  a.free(p);
  a.free(q);
  CHECK(a.stats().allocated_bytes == 0);
  CHECK(a.stats().reserved_bytes == 6 * MiB);
}

TEST_CASE("caching allocator reuses freed blocks without backend calls", "[allocator]") {
  FakeBackend be;
  CachingAllocator a(&be, "fake");
  for (size_t n : {size_t{4096}, 4 * MiB, 16 * MiB}) {
    void* p = a.allocate(n);
    a.free(p);
    int before = be.allocs;
    for (int i = 0; i < 20; ++i) {
      void* q = a.allocate(n);
      CHECK(q == p);
      a.free(q);
    }
    CHECK(be.allocs == before);
  }
  auto s = a.stats();
  CHECK(s.num_backend_allocs == 3);
  CHECK(s.num_allocs == 63);
  CHECK(s.num_frees == 63);
}

TEST_CASE("caching allocator splits and coalesces blocks", "[allocator]") {
  FakeBackend be;
  CachingAllocator a(&be, "fake");
  char* x = static_cast<char*>(a.allocate(100 * KiB));
  char* y = static_cast<char*>(a.allocate(200 * KiB));
  char* z = static_cast<char*>(a.allocate(300 * KiB));
  REQUIRE(be.allocs == 1);  // all three carved from one 2 MiB segment
  CHECK(y == x + 100 * KiB);
  CHECK(z == y + 200 * KiB);
  CHECK(a.summary().find("largest free block: " + std::to_string(2 * MiB - 600 * KiB)) != std::string::npos);

  a.free(y);  // a hole in the middle: not merged with allocated neighbours
  CHECK(a.summary().find("cached free:        " + std::to_string(2 * MiB - 400 * KiB)) != std::string::npos);
  // A request that fits the hole takes it (best fit: the hole is smaller than the tail).
  char* w = static_cast<char*>(a.allocate(150 * KiB));
  CHECK(w == y);
  a.free(w);
  a.free(x);
  a.free(z);  // everything merges back into one block spanning the segment
  CHECK(a.summary().find("largest free block: " + std::to_string(2 * MiB)) != std::string::npos);
  CHECK(a.summary().find("cached free:        " + std::to_string(2 * MiB) + " bytes (2.00 MiB) in 1 blocks") !=
        std::string::npos);

  a.empty_cache();
  auto s = a.stats();
  CHECK(s.reserved_bytes == 0);
  CHECK(s.num_backend_frees == 1);
  CHECK(be.used() == 0);
}

TEST_CASE("caching allocator keeps large remainders only above 1 MiB", "[allocator]") {
  FakeBackend be;
  CachingAllocator a(&be, "fake");
  // 3.5 MiB -> 4 MiB segment; the 0.5 MiB remainder is not split off.
  void* p = a.allocate(3 * MiB + 512 * KiB);
  CHECK(a.stats().allocated_bytes == 4 * MiB);
  a.free(p);
  void* big = a.allocate(5 * MiB);  // the cached 4 MiB block is too small: a new 6 MiB segment
  CHECK(a.stats().num_backend_allocs == 2);
  a.free(big);
  // 2 MiB from the (best-fitting) 4 MiB block leaves 2 MiB > 1 MiB: split.
  void* q = a.allocate(2 * MiB);
  CHECK(a.stats().num_backend_allocs == 2);
  CHECK(a.stats().allocated_bytes == 2 * MiB);
  a.free(q);
}

TEST_CASE("caching allocator keeps streams apart", "[allocator]") {
  FakeBackend be;
  CachingAllocator a(&be, "fake");
  void* p = a.allocate(4096, stream(1));
  a.free(p);
  void* q = a.allocate(4096, stream(2));  // stream 1's cached block is not handed to stream 2
  CHECK(q != p);
  CHECK(be.allocs == 2);
  void* r = a.allocate(4096, stream(1));
  CHECK(r == p);
  CHECK(be.allocs == 2);
  a.free(q);
  a.free(r);
}

TEST_CASE("record_stream delays reuse until the other stream is done", "[allocator]") {
  FakeBackend be;
  CachingAllocator a(&be, "fake");
  void* p = block_in_use_on(be, a, 2);
  a.free(p);
  CHECK(a.stats().allocated_bytes == 0);
  void* q = a.allocate(4096, stream(1));
  CHECK(q != p);  // p is still in use on stream 2
  a.process_events();
  void* q2 = a.allocate(4096, stream(1));
  CHECK(q2 != p);
  void* r = allocate_after_done(be, a, 2);
  CHECK(r == p);
  a.free(q);
  a.free(q2);
  a.free(r);

  // empty_cache waits for pending frees and then gives everything back.
  a.free(block_in_use_on(be, a, 3));
  a.empty_cache();
  CHECK(be.syncs >= 1);
  CHECK(a.stats().reserved_bytes == 0);
  CHECK(be.used() == 0);
}

// Two neighbouring blocks whose cross-stream uses end in the same process_events() pass: the first
// one freed must not merge (and delete) the second before it is freed (a use after free that
// corrupted the host heap on the GPU, seen under AddressSanitizer).
TEST_CASE("neighbouring blocks released by one process_events pass merge safely", "[allocator]") {
  FakeBackend be;
  CachingAllocator a(&be, "fake");
  void* p = a.allocate(4096, stream(1));
  void* q = a.allocate(4096, stream(1));
  void* r = a.allocate(4096, stream(1));
  REQUIRE(be.allocs == 1);  // one segment, split
  for (void* x : {p, q, r}) a.record_stream(x, stream(2));
  be.set_busy(stream(2), true);
  a.free(q);
  a.free(p);
  a.free(r);
  be.set_busy(stream(2), false);
  a.process_events();
  CHECK(a.stats().allocated_bytes == 0);
  // the three blocks are one free block again: a request for all of them fits without a new segment
  void* whole = a.allocate(3 * 4096, stream(1));
  CHECK(whole == std::min({p, q, r}));
  CHECK(be.allocs == 1);
  a.free(whole);
}

// On the GPU an event recorded on a capturing stream is only captured, and querying it fails:
// a cross-stream free made while a capture is underway records its events when the capture ends.
TEST_CASE("a cross-stream free during a capture waits for the capture's end", "[allocator]") {
  FakeBackend be;
  CachingAllocator a(&be, "fake");
  void* p = block_in_use_on(be, a, 2);
  a.begin_private_pool(7);  // what Graph::capture_begin does
  a.free(p);
  CHECK(be.events == 0);
  a.process_events();                           // runs inside allocate too: must not touch the deferred block
  void* in_pool = a.allocate(4096, stream(1));  // from the private pool; p is not free either way
  CHECK(in_pool != p);
  a.free(in_pool);
  a.end_private_pool();
  CHECK(be.events == 1);
  a.process_events();
  void* q = a.allocate(4096, stream(1));
  CHECK(q != p);  // stream 2 has not passed the free yet
  void* r = allocate_after_done(be, a, 2);
  CHECK(r == p);
  a.free(q);
  a.free(r);
}

TEST_CASE("caching allocator stats and peaks", "[allocator]") {
  FakeBackend be;
  CachingAllocator a(&be, "fake");
  void* p = a.allocate(MiB);
  void* q = a.allocate(4 * MiB);
  auto s = a.stats();
  CHECK(s.allocated_bytes == 5 * MiB);
  CHECK(s.reserved_bytes == 6 * MiB);
  CHECK(s.peak_allocated_bytes == 5 * MiB);
  CHECK(s.num_segments == 2);
  CHECK(s.num_backend_allocs == 2);
  a.free(q);
  s = a.stats();
  CHECK(s.allocated_bytes == MiB);
  CHECK(s.peak_allocated_bytes == 5 * MiB);
  a.reset_peak_stats();
  CHECK(a.stats().peak_allocated_bytes == MiB);
  CHECK(a.stats().peak_reserved_bytes == 6 * MiB);
  a.free(p);
  a.empty_cache();
  s = a.stats();
  CHECK(s.reserved_bytes == 0);
  CHECK(s.num_backend_frees == 2);
  CHECK(s.num_segments == 0);
  CHECK_THROWS_AS(a.free(p), kiln::Error);  // double free
}

TEST_CASE("caching allocator out of memory: empties the cache, retries, then throws", "[allocator]") {
  FakeBackend be(10 * MiB);
  CachingAllocator a(&be, "fake:0");
  void* p = a.allocate(6 * MiB);
  a.free(p);  // 6 MiB cached
  // 8 MiB does not fit next to the cached 6 MiB: the cache is released and the retry succeeds.
  void* q = a.allocate(8 * MiB);
  REQUIRE(q != nullptr);
  auto s = a.stats();
  CHECK(s.num_backend_frees == 1);
  CHECK(s.reserved_bytes == 8 * MiB);
  CHECK(s.num_ooms == 0);

  try {
    a.allocate(5 * MiB);
    FAIL("expected an out-of-memory error");
  } catch (const kiln::Error& e) {
    std::string msg = e.what();
    CHECK(msg.find("out of memory") != std::string::npos);
    CHECK(msg.find("fake:0") != std::string::npos);
    CHECK(msg.find(std::to_string(5 * MiB) + " bytes") != std::string::npos);
    CHECK(msg.find("reserved:") != std::string::npos);
    CHECK(msg.find("peak allocated:") != std::string::npos);
    CHECK(msg.find("largest free block:") != std::string::npos);
  }
  CHECK(a.stats().num_ooms == 1);
  a.free(q);
  // The allocator still works after an OOM.
  void* r = a.allocate(5 * MiB);
  CHECK(r != nullptr);
  a.free(r);
}

TEST_CASE("caching allocator memory limit: allocations past the cap fail and name it", "[allocator]") {
  FakeBackend be(64 * MiB);  // the device could give more: the cap is what stops it
  CachingAllocator a(&be, "fake:0");
  a.set_memory_limit(12 * MiB);
  CHECK(a.memory_limit() == 12 * MiB);
  void* p = a.allocate(10 * MiB);
  a.free(p);  // 10 MiB cached
  // 11 MiB does not fit beside the cached 10 under the cap: the cache goes back, the retry fits.
  // Then 3 MiB (a 4 MiB segment) does not fit beside the 11 in use.
  void* q = a.allocate(11 * MiB);
  REQUIRE(q != nullptr);
  CHECK(a.stats().reserved_bytes == 11 * MiB);  // a segment of its own (10 MiB and over)
  try {
    a.allocate(3 * MiB);
    FAIL("expected an out-of-memory error at the cap");
  } catch (const kiln::OutOfMemoryError& e) {  // a kiln::Error, catchable by its own type
    std::string msg = e.what();
    CHECK(msg.find("out of memory on fake:0") != std::string::npos);
    CHECK(msg.find("at most " + std::to_string(12 * MiB) + " bytes") != std::string::npos);
    CHECK(msg.find("set_per_process_memory_fraction") != std::string::npos);
    CHECK(msg.find(std::to_string(11 * MiB) + " are reserved") != std::string::npos);
  }
  CHECK(a.stats().num_ooms == 1);
  CHECK(be.allocs == 2);  // the refused segment never reached the backend
  a.free(q);
  void* r = a.allocate(3 * MiB);  // the next step works normally
  CHECK(r != nullptr);
  a.free(r);
  a.set_memory_limit(0);  // no cap: the backend's capacity is the limit again
  void* big = a.allocate(40 * MiB);
  CHECK(big != nullptr);
  a.free(big);
}

TEST_CASE("caching allocator history exports a Chrome trace and an HTML timeline", "[allocator]") {
  FakeBackend be;
  CachingAllocator a(&be, "fake");
  void* before = a.allocate(1000);  // not recorded: history is off by default
  CHECK(a.history().empty());
  a.record_history(true);
  void* p;
  {
    kiln::MemoryLabel l("conv1");
    CHECK(kiln::current_memory_label() == "conv1");
    p = a.allocate(3 * MiB);
    {
      kiln::MemoryLabel inner("conv1.weight<grad>");
      a.free(a.allocate(1000));
    }
  }
  CHECK(kiln::current_memory_label().empty());
  a.free(p);
  a.free(before);
  a.empty_cache();
  auto h = a.history();
  REQUIRE(h.size() == 8);  // seg_alloc, alloc, alloc, free, free, free, seg_free x2
  CHECK(h[0].action == kiln::MemoryAction::SegmentAlloc);
  CHECK(h[1].action == kiln::MemoryAction::Alloc);
  CHECK(h[1].label == "conv1");
  CHECK(h[1].size == 4 * MiB);  // 4 MiB segment; the 1 MiB remainder is not split off
  CHECK(h[2].label == "conv1.weight<grad>");
  CHECK(h[4].label.empty());
  for (size_t i = 1; i < h.size(); ++i) CHECK(h[i].time_us >= h[i - 1].time_us);
  CHECK(h.back().reserved == 0);
  CHECK(h.back().allocated == 0);

  std::string json_path = tmp_path("trace.json"), html_path = tmp_path("timeline.html");
  kiln::utils::write_memory_trace(a.history(), json_path);
  std::string json = read_all(json_path);
  CHECK(json.find("\"traceEvents\"") != std::string::npos);
  CHECK(json.find("\"ph\":\"C\"") != std::string::npos);
  CHECK(json.find("\"name\":\"allocated\"") != std::string::npos);
  CHECK(json.find("\"name\":\"reserved\"") != std::string::npos);
  CHECK(json.find("conv1") != std::string::npos);
  // Structurally balanced JSON (a cheap parse check; strings here hold no brackets).
  int depth = 0;
  bool in_str = false, ok = true;
  for (size_t i = 0; i < json.size(); ++i) {
    char c = json[i];
    if (in_str) {
      if (c == '\\') ++i;
      else if (c == '"') in_str = false;
      continue;
    }
    if (c == '"') in_str = true;
    else if (c == '{' || c == '[') ++depth;
    else if (c == '}' || c == ']') ok = ok && --depth >= 0;
  }
  CHECK(ok);
  CHECK(depth == 0);
  CHECK_FALSE(in_str);

  kiln::utils::write_memory_timeline(a.history(), "kiln memory timeline", html_path);
  std::string html = read_all(html_path);
  CHECK(html.find("<svg") != std::string::npos);
  CHECK(html.find("<polyline") != std::string::npos);
  CHECK(html.find("conv1.weight&lt;grad&gt;") != std::string::npos);
  CHECK(html.find("http://") == std::string::npos);
  CHECK(html.find("https://") == std::string::npos);
  CHECK(html.find("<script src") == std::string::npos);
  std::remove(json_path.c_str());
  std::remove(html_path.c_str());

  a.record_history(false);
  a.free(a.allocate(10));
  CHECK(a.history().size() == 8);
}

TEST_CASE("caching allocator private pools are isolated until released", "[allocator]") {
  FakeBackend be;
  CachingAllocator a(&be, "fake");
  a.begin_private_pool(7);
  void* g = a.allocate(4096);
  a.free(g);
  a.end_private_pool();
  CHECK(be.allocs == 1);
  void* n = a.allocate(4096);  // normal allocations do not take the private pool's block
  CHECK(n != g);
  CHECK(be.allocs == 2);
  a.free(n);
  a.begin_private_pool(7);
  void* g2 = a.allocate(4096);  // the pool's own allocations do
  CHECK(g2 == g);
  a.end_private_pool();

  // Another thread is not routed to this thread's private pool.
  void* other = nullptr;
  a.begin_private_pool(7);
  std::thread t([&] { other = a.allocate(4096); });
  t.join();
  a.end_private_pool();
  CHECK(other == n);
  a.free(other);

  a.empty_cache();  // does not touch the private pool
  CHECK(a.stats().reserved_bytes == 2 * MiB);
  a.release_pool(7);  // g2 still live: its segment goes back when it is freed
  CHECK(a.stats().reserved_bytes == 2 * MiB);
  a.free(g2);
  CHECK(a.stats().reserved_bytes == 0);
  CHECK(be.used() == 0);
}

TEST_CASE("caching allocator survives concurrent use", "[allocator]") {
  FakeBackend be;
  CachingAllocator a(&be, "fake");
  std::vector<std::thread> threads;
  std::atomic<int> errors{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      std::vector<std::pair<unsigned char*, size_t>> live;
      for (int i = 0; i < 2000; ++i) {
        if (live.size() < 16 && (live.empty() || rng() % 2)) {
          size_t n = 1 + rng() % (rng() % 8 == 0 ? 4 * MiB : 64 * KiB);
          auto* p = static_cast<unsigned char*>(a.allocate(n, stream(1 + t % 2)));
          p[0] = p[n - 1] = static_cast<unsigned char>(t);
          live.emplace_back(p, n);
        } else {
          size_t k = rng() % live.size();
          auto [p, n] = live[k];
          if (p[0] != t || p[n - 1] != t) errors++;
          a.free(p);
          live.erase(live.begin() + k);
        }
      }
      for (auto& [p, n] : live) a.free(p);
    });
  }
  for (auto& th : threads) th.join();
  CHECK(errors == 0);
  auto s = a.stats();
  CHECK(s.allocated_bytes == 0);
  CHECK(s.num_allocs == s.num_frees);
  a.empty_cache();
  CHECK(a.stats().reserved_bytes == 0);
  CHECK(be.used() == 0);
}
