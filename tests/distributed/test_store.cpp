// The TCP key-value store (kiln/distributed/store/store.h): commands and their values, blocking GET and
// WAIT across clients, every timeout path with a time bound, a server that goes away, the join
// count, concurrent adds (threads and processes), PrefixStore namespaces, the Gloo adapter.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kiln/config.h"
#include "kiln/core/error.h"
#include "kiln/distributed/store/store.h"
#if KILN_WITH_GLOO
#include "kiln/distributed/store/gloo_store.h"
#endif
#include "tests/distributed/spawn.h"
#include "tests/distributed/store_test_util.h"

using Catch::Matchers::Contains;
using kiln::distributed::Bytes;
using kiln::distributed::PrefixStore;
using namespace kiln_store_test;

namespace {

// The message of the kiln::Error `f` throws, and how long it took ("" when nothing was thrown).
std::string error_of(const std::function<void()>& f, double* seconds = nullptr) {
  auto start = Clock::now();
  std::string msg;
  try {
    f();
  } catch (const kiln::Error& e) {
    msg = e.what();
  }
  if (seconds) *seconds = seconds_since(start);
  return msg;
}

}  // namespace

TEST_CASE("TCPStore: set, get, add, check, delete and num_keys on a server picking its port") {
  TCPStore server("127.0.0.1", 0, server_options());
  REQUIRE(server.port() > 0);
  CHECK(server.host() == "127.0.0.1");
  TCPStore client("127.0.0.1", server.port(), client_options());

  CHECK(server.num_keys() == 0);  // the join counter is the store's own, not counted
  server.set("rank/0/addr", std::string("10.0.0.1:4000"));
  CHECK(client.get_string("rank/0/addr") == "10.0.0.1:4000");
  client.set("rank/0/addr", std::string("overwritten"));
  CHECK(server.get_string("rank/0/addr") == "overwritten");

  // ADD keeps the integer as its decimal string, as torch does
  CHECK(client.add("counter", 1) == 1);
  CHECK(server.add("counter", 2) == 3);
  CHECK(client.get_string("counter") == "3");
  CHECK(client.add("counter", -10) == -7);
  CHECK(server.get_string("counter") == "-7");
  CHECK(client.add("counter", 0) == -7);
  // a value set as a decimal string can be added to
  client.set("n", std::string("40"));
  CHECK(client.add("n", 2) == 42);

  CHECK(client.check({"rank/0/addr", "counter"}));
  CHECK_FALSE(client.check({"rank/0/addr", "absent"}));
  CHECK(client.check({}));
  CHECK(client.num_keys() == 3);

  CHECK(client.delete_key("n"));
  CHECK_FALSE(client.delete_key("n"));
  CHECK_FALSE(server.check({"n"}));
  CHECK(server.num_keys() == 2);

  // bytes, not strings: zeros, all byte values, empty and large values survive the wire
  Bytes binary;
  for (int i = 0; i < 256; ++i) binary.push_back(static_cast<uint8_t>(i));
  binary.push_back(0);
  client.set("binary", binary);
  CHECK(server.get("binary") == binary);
  client.set("empty", Bytes{});
  CHECK(server.get("empty").empty());
  CHECK(server.check({"empty"}));
  Bytes big(3 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 7 + 1);
  server.set("big", big);
  CHECK(client.get("big") == big);
}

TEST_CASE("TCPStore: add to a value that is not an integer is an error naming the key") {
  TCPStore store("127.0.0.1", 0, server_options());
  store.set("text", std::string("hello"));
  std::string msg = error_of([&] { store.add("text", 1); });
  CHECK_THAT(msg, Contains("'text'") && Contains("not an integer"));
  CHECK(store.get_string("text") == "hello");  // unchanged, and the connection still works
  CHECK(store.add("other", 5) == 5);
}

TEST_CASE("TCPStore: get blocks until another client sets the key") {
  TCPStore server("127.0.0.1", 0, server_options());
  TCPStore client("127.0.0.1", server.port(), client_options());
  auto start = Clock::now();
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(300));
    server.set("late", std::string("here"));
  });
  CHECK(client.get_string("late") == "here");
  double waited = seconds_since(start);
  setter.join();
  CHECK(waited >= 0.25);
  CHECK(waited < 5.0);

  // wait() returns once the last of its keys appears
  std::thread setter2([&] {
    std::this_thread::sleep_for(milliseconds(100));
    server.set("a", std::string("1"));
    std::this_thread::sleep_for(milliseconds(100));
    server.set("b", std::string("2"));
  });
  start = Clock::now();
  client.wait({"a", "b"}, milliseconds(5000));
  CHECK(seconds_since(start) >= 0.15);
  setter2.join();
}

TEST_CASE("TCPStore: a blocked get does not block other clients") {
  TCPStore server("127.0.0.1", 0, server_options());
  TCPStore waiter("127.0.0.1", server.port(), client_options());
  std::atomic<bool> got{false};
  std::thread blocked([&] {
    CHECK(waiter.get_string("released") == "go");
    got = true;
  });
  std::this_thread::sleep_for(milliseconds(100));
  // the server answers everyone else meanwhile
  TCPStore other("127.0.0.1", server.port(), client_options());
  auto start = Clock::now();
  for (int i = 0; i < 50; ++i) other.add("busy", 1);
  CHECK(other.get_string("busy") == "50");
  CHECK(seconds_since(start) < 2.0);
  CHECK_FALSE(got);
  other.set("released", std::string("go"));
  blocked.join();
  CHECK(got);
}

TEST_CASE("TCPStore: a get blocked in one thread does not hold up other threads of the same store") {
  TCPStore store("127.0.0.1", 0, server_options());
  std::string got;
  std::thread blocked([&] { got = store.get_string("from-another-thread"); });
  std::this_thread::sleep_for(milliseconds(100));
  auto start = Clock::now();
  CHECK(store.add("meanwhile", 1) == 1);
  store.set("from-another-thread", std::string("ok"));
  CHECK(seconds_since(start) < 2.0);
  blocked.join();
  CHECK(got == "ok");
}

TEST_CASE("TCPStore: wait and get on a missing key time out within bounds, naming the key") {
  TCPStore server("127.0.0.1", 0, server_options());
  TCPStore client("127.0.0.1", server.port(), client_options());
  const std::string where = "127.0.0.1:" + std::to_string(server.port());
  client.set("rank/0/joined", std::string("1"));

  double took = 0;
  std::string msg = error_of([&] { client.wait({"rank/0/joined", "rank/2/joined"}, milliseconds(300)); }, &took);
  // only the missing key is named
  CHECK(msg == "TCPStore: timed out after 300 ms waiting for keys [rank/2/joined] at " + where);
  CHECK(took >= 0.25);
  CHECK(took < 1.5);

  client.set_timeout(milliseconds(300));
  msg = error_of([&] { client.get("rank/3/addr"); }, &took);
  CHECK_THAT(msg, Contains("timed out after 300 ms") && Contains("[rank/3/addr]") && Contains(where));
  CHECK(took >= 0.25);
  CHECK(took < 1.5);

  // the store's own timeout is what wait() without one uses
  msg = error_of([&] { client.wait({"never"}); }, &took);
  CHECK_THAT(msg, Contains("[never]"));
  CHECK(took < 1.5);

  // a timed-out request leaves the connection usable
  client.set("after", std::string("ok"));
  CHECK(client.get_string("after") == "ok");
  CHECK(client.add("c", 2) == 2);
}

TEST_CASE("TCPStore: a client gets an error, not a hang, when the server goes away") {
  auto server = std::make_unique<TCPStore>("127.0.0.1", 0, server_options());
  const int port = server->port();
  TCPStore client("127.0.0.1", port, client_options(milliseconds(60000)));
  client.set("k", std::string("v"));

  std::string blocked_msg;
  double blocked_took = 0;
  auto start = Clock::now();
  std::thread blocked([&] {
    blocked_msg = error_of([&] { client.get("never"); });
    blocked_took = seconds_since(start);
  });
  std::this_thread::sleep_for(milliseconds(200));
  // the destructor must not wait for the blocked client
  auto destroy_start = Clock::now();
  server.reset();
  CHECK(seconds_since(destroy_start) < 3.0);
  blocked.join();
  CHECK(blocked_took < 5.0);
  const std::string want = "TCPStore: lost the connection to the store server at 127.0.0.1:" + std::to_string(port) +
                           " (the process hosting it, rank 0, may have exited)";
  CHECK(blocked_msg == want);

  // later calls fail at once with the same message
  double took = 0;
  CHECK(error_of([&] { client.set("k2", std::string("v")); }, &took) == want);
  CHECK(took < 1.0);
}

TEST_CASE("TCPStore: the server's destructor returns while a client is idle or gone") {
  auto server = std::make_unique<TCPStore>("127.0.0.1", 0, server_options());
  auto idle = std::make_unique<TCPStore>("127.0.0.1", server->port(), client_options());
  {
    TCPStore gone("127.0.0.1", server->port(), client_options());
    gone.set("x", std::string("1"));
  }
  auto start = Clock::now();
  server.reset();
  CHECK(seconds_since(start) < 3.0);
  idle.reset();
}

TEST_CASE("TCPStore: a client started before the server connects once it is up") {
  const int port = kiln_test::free_port();
  std::string value;
  std::thread early([&] {
    TCPStore client("127.0.0.1", port, client_options(milliseconds(10000)));
    value = client.get_string("hello");
  });
  std::this_thread::sleep_for(milliseconds(400));
  TCPStore server("127.0.0.1", port, server_options());
  CHECK(server.port() == port);
  server.set("hello", std::string("world"));
  early.join();
  CHECK(value == "world");
}

TEST_CASE("TCPStore: connecting to a port nobody serves fails after the timeout") {
  const int port = kiln_test::free_port();
  double took = 0;
  std::string msg = error_of([&] { TCPStore c("127.0.0.1", port, client_options(milliseconds(400))); }, &took);
  CHECK_THAT(msg,
             Contains("could not connect to the store server at 127.0.0.1:" + std::to_string(port) + " within 400 ms"));
  CHECK(took >= 0.35);
  CHECK(took < 2.0);
}

TEST_CASE("TCPStore: a server that accepts but never answers is a timeout on the client") {
  // a listening socket nobody serves: the kernel completes the connection, no reply ever comes
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(fd, 16) == 0);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  double took = 0;
  std::string msg = error_of([&] { TCPStore c("127.0.0.1", port, client_options(milliseconds(300))); }, &took);
  ::close(fd);
  CHECK_THAT(msg, Contains("timed out after 300 ms waiting for the store server at 127.0.0.1:" + std::to_string(port) +
                           " to answer"));
  CHECK(took >= 0.25);
  CHECK(took < 1.5);
}

TEST_CASE("TCPStore: a peer speaking another protocol is dropped, the others are served") {
  TCPStore server("127.0.0.1", 0, server_options());
  int fd = connect_raw(server.port());
  const std::string http = "GET / HTTP/1.0\r\n\r\n";
  REQUIRE(::send(fd, http.data(), http.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(http.size()));
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char c;
  CHECK(::recv(fd, &c, 1, 0) == 0);  // closed by the server, nothing answered
  ::close(fd);
  server.set("still", std::string("fine"));
  CHECK(server.get_string("still") == "fine");
}

TEST_CASE("TCPStore: bad ports and a taken port are errors") {
  CHECK_THAT(error_of([] { TCPStore c("127.0.0.1", 70000, client_options()); }), Contains("70000"));
  CHECK_THAT(error_of([] { TCPStore c("127.0.0.1", 0, client_options()); }), Contains("port 0"));
  TCPStore server("127.0.0.1", 0, server_options());
  CHECK_THAT(error_of([&] { TCPStore s("127.0.0.1", server.port(), server_options()); }),
             Contains("cannot listen on 127.0.0.1:" + std::to_string(server.port())));
}

TEST_CASE("TCPStore: a server on 0.0.0.0 listens on every interface") {
  TCPStore server("0.0.0.0", 0, server_options());
  TCPStore client("127.0.0.1", server.port(), client_options());
  server.set("k", std::string("v"));
  CHECK(client.get_string("k") == "v");
}

TEST_CASE("TCPStore: the server waits for world_size clients to join") {
  const int port = kiln_test::free_port();
  std::vector<std::thread> clients;
  std::vector<std::string> errors(2);
  for (int i = 0; i < 2; ++i) {
    clients.emplace_back([&, i] {
      errors[i] = error_of([&] {
        std::this_thread::sleep_for(milliseconds(150 * (i + 1)));
        TCPStore c("127.0.0.1", port, client_options());
        c.wait({"done"}, milliseconds(10000));
      });
    });
  }
  auto start = Clock::now();
  {
    TCPStore server("127.0.0.1", port, server_options(milliseconds(10000), 3));
    CHECK(seconds_since(start) >= 0.2);  // it did wait for the second client
    server.set("done", std::string("1"));
    for (auto& t : clients) t.join();
  }
  CHECK(errors[0].empty());
  CHECK(errors[1].empty());
}

TEST_CASE("TCPStore: the server names how many joined when the others do not come") {
  const int port = kiln_test::free_port();
  std::thread one([&] { error_of([&] { TCPStore c("127.0.0.1", port, client_options(milliseconds(3000))); }); });
  double took = 0;
  std::string msg = error_of([&] { TCPStore server("127.0.0.1", port, server_options(milliseconds(600), 4)); }, &took);
  one.join();
  CHECK_THAT(msg, Contains("timed out after 600 ms waiting for 4 ranks to join the store at "
                           "127.0.0.1:" +
                           std::to_string(port)) &&
                      Contains("2 of 4 joined"));
  CHECK(took >= 0.55);
  CHECK(took < 2.5);

  // wait_for_workers = false: the constructor returns as soon as the server is up
  TCPStoreOptions o = server_options(milliseconds(600), 4);
  o.wait_for_workers = false;
  auto start = Clock::now();
  TCPStore server("127.0.0.1", 0, o);
  CHECK(seconds_since(start) < 0.5);
}

TEST_CASE("TCPStore: concurrent adds from several threads sum exactly") {
  TCPStore server("127.0.0.1", 0, server_options());
  const int threads = 8, adds = 200;
  std::vector<std::thread> pool;
  std::vector<std::vector<int64_t>> seen(threads);
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      TCPStore c("127.0.0.1", server.port(), client_options());
      for (int i = 0; i < adds; ++i) seen[t].push_back(c.add("sum", t + 1));
    });
  }
  for (auto& t : pool) t.join();
  const int64_t want = adds * threads * (threads + 1) / 2;
  CHECK(server.get_string("sum") == std::to_string(want));
  // every add saw a distinct running total: none was lost or applied twice
  std::vector<int64_t> all;
  for (auto& s : seen) all.insert(all.end(), s.begin(), s.end());
  std::sort(all.begin(), all.end());
  CHECK(std::adjacent_find(all.begin(), all.end()) == all.end());
  CHECK(all.back() == want);

  // one store shared by threads: each call takes a connection of its own
  std::vector<std::thread> sharing;
  for (int t = 0; t < 4; ++t)
    sharing.emplace_back([&] {
      for (int i = 0; i < 100; ++i) server.add("shared", 1);
    });
  for (auto& t : sharing) t.join();
  CHECK(server.get_string("shared") == "400");
}

TEST_CASE("TCPStore: concurrent adds from several processes sum exactly") {
  kiln_test::SpawnOptions opt;
  opt.world_size = 3;
  opt.deadline_seconds = 60;
  auto results = kiln_test::spawn_ranks({KILN_DIST_WORKER, "store_add", "100"}, opt);
  INFO(kiln_test::describe(results));
  for (const auto& r : results) {
    CHECK(r.exit_code == 0);
    CHECK_FALSE(r.killed_at_deadline);
  }
}

TEST_CASE("TCPStore: a rank blocked on the store gets an error when rank 0's process dies") {
  kiln_test::SpawnOptions opt;
  opt.world_size = 2;
  opt.deadline_seconds = 60;
  auto results = kiln_test::spawn_ranks({KILN_DIST_WORKER, "store_server_dies"}, opt);
  INFO(kiln_test::describe(results));
  REQUIRE(results.size() == 2);
  CHECK(results[0].exit_code == 0);
  CHECK(results[1].exit_code == 0);
  CHECK_FALSE(results[1].killed_at_deadline);
  CHECK(results[1].seconds < 15);
  CHECK_THAT(results[1].output, Contains("lost the connection to the store server at 127.0.0.1:"));
}

TEST_CASE("PrefixStore: each prefix is its own namespace in one store") {
  auto base = std::make_shared<TCPStore>("127.0.0.1", 0, server_options());
  PrefixStore pg0("pg0", base), pg1("pg1", base);
  CHECK(pg0.underlying() == base);

  pg0.set("addr", std::string("zero"));
  pg1.set("addr", std::string("one"));
  CHECK(pg0.get_string("addr") == "zero");
  CHECK(pg1.get_string("addr") == "one");
  CHECK(base->get_string("pg0/addr") == "zero");
  CHECK(base->get_string("pg1/addr") == "one");
  CHECK_FALSE(base->check({"addr"}));

  CHECK(pg0.add("n", 2) == 2);
  CHECK(pg1.add("n", 5) == 5);
  CHECK(base->get_string("pg0/n") == "2");
  CHECK(pg0.check({"addr", "n"}));
  CHECK_FALSE(pg0.check({"addr", "only-in-pg1"}));
  pg1.set("only-in-pg1", std::string("x"));
  CHECK_FALSE(pg0.check({"only-in-pg1"}));
  CHECK(pg1.check({"only-in-pg1"}));

  CHECK(pg0.delete_key("n"));
  CHECK_FALSE(pg0.check({"n"}));
  CHECK(pg1.check({"n"}));
  // num_keys counts the whole store
  CHECK(pg0.num_keys() == base->num_keys());
  CHECK(pg0.num_keys() == 4);

  // nesting: a group inside a group
  PrefixStore nested("sub", std::make_shared<PrefixStore>("pg0", base));
  nested.set("k", std::string("deep"));
  CHECK(base->get_string("pg0/sub/k") == "deep");

  // a timeout names the prefixed key, after this store's timeout
  pg0.set_timeout(milliseconds(300));
  double took = 0;
  std::string msg = error_of([&] { pg0.get("missing"); }, &took);
  CHECK_THAT(msg, Contains("[pg0/missing]"));
  CHECK(took < 1.5);
  msg = error_of([&] { pg1.wait({"addr", "missing"}, milliseconds(200)); }, &took);
  CHECK_THAT(msg, Contains("[pg1/missing]"));
  CHECK(took < 1.5);
  CHECK(base->timeout() == milliseconds(10000));  // untouched by the prefix store's timeout

  // the PrefixStore's get blocks like the store's
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(150));
    base->set("pg1/late", std::string("yes"));
  });
  CHECK(pg1.get_string("late") == "yes");
  setter.join();
}

#if KILN_WITH_GLOO
TEST_CASE("GlooStoreAdapter: Gloo's store calls reach the kiln store") {
  auto base = std::make_shared<TCPStore>("127.0.0.1", 0, server_options());
  auto prefixed = std::make_shared<PrefixStore>("gloo", base);
  kiln::distributed::GlooStoreAdapter adapter(prefixed);
  ::gloo::rendezvous::Store& gloo_store = adapter;

  std::vector<char> addr = {'a', '\0', 'b', static_cast<char>(0xff)};
  gloo_store.set("rank_0", addr);
  CHECK(gloo_store.get("rank_0") == addr);
  Bytes raw = base->get("gloo/rank_0");
  CHECK(raw == Bytes({'a', 0, 'b', 0xff}));
  gloo_store.wait({"rank_0"});
  gloo_store.wait({"rank_0"}, milliseconds(100));

  double took = 0;
  std::string msg = error_of([&] { gloo_store.wait({"rank_1"}, milliseconds(300)); }, &took);
  CHECK_THAT(msg, Contains("[gloo/rank_1]"));
  CHECK(took < 1.5);
  prefixed->set_timeout(milliseconds(300));
  msg = error_of([&] { gloo_store.get("rank_2"); }, &took);
  CHECK_THAT(msg, Contains("[gloo/rank_2]"));
  CHECK(took < 1.5);
}
#endif
