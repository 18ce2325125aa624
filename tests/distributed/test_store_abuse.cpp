// The TCP store's server under abuse (docs/robustness.md): silent clients, forged counts and
// lengths, a peer that stops or leaves mid-message, a thousand connections at once and values over
// the limit. The server stays up, its memory follows the bytes that actually arrive, silent peers
// are closed after the request timeout, and well-formed clients are answered throughout. Every
// wait has a time bound, so a hang fails.
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/distributed/store/store.h"
#include "kiln/distributed/store/wire.h"
#include "tests/distributed/store_test_util.h"

using Catch::Matchers::Contains;
using kiln::distributed::Bytes;
using namespace kiln_store_test;

namespace {

constexpr milliseconds kRequestTimeout{300};

// The store tests' server, closing a connection that stalls for kRequestTimeout.
TCPStoreOptions abused_server_options() {
  TCPStoreOptions o = server_options();
  o.request_timeout = kRequestTimeout;
  return o;
}

void send_raw(int fd, const std::string& bytes) {
  REQUIRE(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size()));
}

std::string u32(uint32_t v) {
  std::string s;
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
  return s;
}

// Seconds until the server closes `fd` (EOF), or -1 when it stays open for `limit` seconds.
double seconds_until_closed(int fd, double limit) {
  const auto start = Clock::now();
  char buf[256];
  for (;;) {
    const double left = limit - seconds_since(start);
    if (left <= 0) return -1;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left * 1000) + 1) <= 0) continue;
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return seconds_since(start);
  }
}

long resident_mb() {
  long pages = 0, resident = 0;
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return resident * (::sysconf(_SC_PAGESIZE) / 1024) / 1024;
}

void expect_served(TCPStore& store, const std::string& key) {
  store.set(key, std::string("ok"));
  CHECK(store.get_string(key) == "ok");
}

}  // namespace

TEST_CASE("TCPStore abuse: a client that connects and sends nothing is closed after the request timeout") {
  TCPStore server("127.0.0.1", 0, abused_server_options());
  int fd = connect_raw(server.port());
  const double took = seconds_until_closed(fd, 5.0);
  ::close(fd);
  CHECK(took >= 0.25);
  CHECK(took < 2.0);
  expect_served(server, "after-silent");
}

TEST_CASE("TCPStore abuse: forged field counts and lengths are dropped at once, without allocating") {
  TCPStore server("127.0.0.1", 0, abused_server_options());
  const long before = resident_mb();
  for (const std::string& forged : {std::string("\x01") + u32(0xFFFFFFFFu),              // 2^32-1 fields
                                    std::string("\x01") + u32(2) + u32(0xFFFFFFFFu),     // a 4 GiB field
                                    std::string("\x01") + u32(2) + u32(0x7FFFFFFFu)}) {  // 2 GiB
    int fd = connect_raw(server.port());
    send_raw(fd, forged);
    const double took = seconds_until_closed(fd, 5.0);
    ::close(fd);
    CHECK(took >= 0);
    CHECK(took < 0.25);  // not the request timeout: the header alone is refused
  }
  CHECK(resident_mb() - before < 64);
  expect_served(server, "after-forged");
}

TEST_CASE("TCPStore abuse: announced lengths cost only the bytes that arrive, and stalled peers are closed") {
  TCPStore server("127.0.0.1", 0, abused_server_options());
  const long before = resident_mb();
  std::vector<int> fds;
  for (int i = 0; i < 16; ++i) {  // 16 x 1 GiB announced, 10 bytes sent each
    int fd = connect_raw(server.port());
    send_raw(fd, std::string("\x01") + u32(2) + u32(1u << 30) + "0123456789");
    fds.push_back(fd);
  }
  expect_served(server, "while-stalled");
  CHECK(resident_mb() - before < 64);
  for (int fd : fds) {
    const double took = seconds_until_closed(fd, 5.0);
    CHECK(took >= 0);
    CHECK(took < 2.0);
    ::close(fd);
  }
}

TEST_CASE("TCPStore abuse: a client that leaves mid-message leaves the server serving") {
  TCPStore server("127.0.0.1", 0, abused_server_options());
  for (int cut : {1, 3, 5, 9, 12}) {
    const std::string full = std::string("\x01") + u32(2) + u32(3) + "key" + u32(5) + "value";
    int fd = connect_raw(server.port());
    send_raw(fd, full.substr(0, static_cast<size_t>(cut)));
    ::close(fd);
  }
  expect_served(server, "after-leavers");
  CHECK(!server.check({"key"}));
}

TEST_CASE("TCPStore abuse: a thousand connections at once, and clients are still answered") {
  rlimit lim{};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  // both ends of every connection live in this process, plus the threads' and the test's own
  const rlim_t need = 2 * 1000 + 64;
  if (lim.rlim_cur < need && lim.rlim_max >= need) {
    lim.rlim_cur = need;
    ::setrlimit(RLIMIT_NOFILE, &lim);
  }
  const int n = lim.rlim_cur >= need ? 1000 : static_cast<int>((lim.rlim_cur - 64) / 2);
  INFO("connections: " << n << " (file descriptor limit " << lim.rlim_cur << ")");
  REQUIRE(n >= 200);
  TCPStore server("127.0.0.1", 0, abused_server_options());
  std::vector<int> fds;
  for (int i = 0; i < n; ++i) fds.push_back(connect_raw(server.port()));
  const auto start = Clock::now();
  expect_served(server, "among-the-crowd");
  CHECK(seconds_since(start) < 2.0);
  int closed = 0;
  for (int fd : fds) {
    closed += seconds_until_closed(fd, 10.0) >= 0;
    ::close(fd);
  }
  CHECK(closed == n);  // every silent one timed out
  expect_served(server, "after-the-crowd");
}

TEST_CASE("TCPStore abuse: a value over the store's limit is a clear error and the store goes on") {
  TCPStore server("127.0.0.1", 0, abused_server_options());
  Bytes huge(kiln::distributed::wire::kMaxMessageBytes);
  std::string msg;
  try {
    server.set("big", huge);
  } catch (const kiln::Error& e) {
    msg = e.what();
  }
  CHECK_THAT(msg, Contains("set('big')") && Contains("at most"));
  huge = Bytes();
  expect_served(server, "after-huge");
}
