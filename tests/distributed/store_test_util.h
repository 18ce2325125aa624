#pragma once
// What the TCP store tests (test_store.cpp, test_store_abuse.cpp) share: the names they use, a
// server's and a client's options, a raw loopback connection that speaks no protocol of its own, and
// the time since a point.
#include <netinet/in.h>
#include <sys/socket.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>

#include "kiln/distributed/store/store.h"

namespace kiln_store_test {

using kiln::distributed::TCPStore;
using kiln::distributed::TCPStoreOptions;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A server expecting world_size processes (-1: any number).
inline TCPStoreOptions server_options(milliseconds timeout = milliseconds(10000), int world_size = -1) {
  TCPStoreOptions o;
  o.is_server = true;
  o.world_size = world_size;
  o.timeout = timeout;
  return o;
}

inline TCPStoreOptions client_options(milliseconds timeout = milliseconds(10000)) {
  TCPStoreOptions o;
  o.timeout = timeout;
  return o;
}

// A TCP connection to 127.0.0.1:port whose bytes the test writes itself (REQUIREs that it connects).
inline int connect_raw(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  return fd;
}

}  // namespace kiln_store_test
