// POSIX TCP helpers of the store: listen, connect with retry, send/recv with a deadline.
#include "kiln/distributed/store/socket.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "kiln/core/error.h"

namespace kiln::distributed::net {

namespace {

// poll() on one fd until the deadline; returns its revents, 0 on timeout.
short poll_one(int fd, short events, Deadline deadline) {
  for (;;) {
    int ms = -1;
    if (deadline != Deadline::max()) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      // round up so a deadline 0.4 ms away is still waited for, then re-checked
      ms = static_cast<int>(std::clamp<int64_t>(left.count() + 1, 0, 1 << 30));
      if (left.count() < 0) ms = 0;
    }
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, ms);
    if (rc > 0) return p.revents;
    if (rc == 0) {
      if (Clock::now() >= deadline) return 0;
      continue;
    }
    if (errno != EINTR) return POLLERR;
  }
}

struct AddrInfo {
  addrinfo* list = nullptr;
  ~AddrInfo() {
    if (list) ::freeaddrinfo(list);
  }
};

// Resolves host:port; an empty host or "0.0.0.0" with `passive` means every interface.
int resolve(const std::string& host, int port, bool passive, AddrInfo& out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  const bool any = host.empty() || host == "0.0.0.0";
  if (passive) hints.ai_flags = AI_PASSIVE;
  if (any && passive) hints.ai_family = AF_INET;
  const char* node = any ? (passive ? nullptr : "127.0.0.1") : host.c_str();
  return ::getaddrinfo(node, std::to_string(port).c_str(), &hints, &out.list);
}

}  // namespace

std::string endpoint(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

void set_nonblocking(int fd, bool on) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

int listen_on(const std::string& host, int port, int* bound_port) {
  AddrInfo ai;
  int rc = resolve(host, port, /*passive=*/true, ai);
  KILN_CHECK(rc == 0, "TCPStore: cannot resolve ", endpoint(host, port), " to listen on: ", ::gai_strerror(rc));
  std::string last_error = "no address";
  for (addrinfo* a = ai.list; a; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 512) != 0) {
      last_error = std::strerror(errno);
      ::close(fd);
      continue;
    }
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    *bound_port = addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                             : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    set_nonblocking(fd, true);
    return fd;
  }
  KILN_FAIL("TCPStore: cannot listen on ", endpoint(host, port), ": ", last_error,
            " (is another job using this port? set MASTER_PORT to a free one)");
}

int connect_with_retry(const std::string& host, int port, Deadline deadline, std::chrono::milliseconds budget) {
  std::string last_error = "no attempt";
  auto backoff = std::chrono::milliseconds(10);
  do {
    AddrInfo ai;
    int rc = resolve(host, port, /*passive=*/false, ai);
    // a name that does not resolve yet (DNS of a freshly started node) is retried as well
    if (rc != 0) last_error = std::string("cannot resolve the host: ") + ::gai_strerror(rc);
    for (addrinfo* a = rc == 0 ? ai.list : nullptr; a; a = a->ai_next) {
      int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) {
        last_error = std::strerror(errno);
        continue;
      }
      set_nonblocking(fd, true);
      int err = 0;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
        err = errno;
        if (err == EINPROGRESS) {
          // a SYN to a host that drops it would block for minutes: bound it by the deadline
          short ev = poll_one(fd, POLLOUT, deadline);
          socklen_t len = sizeof err;
          if (ev == 0) {
            err = ETIMEDOUT;
          } else if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
            err = errno;
          }
        }
      }
      if (err == 0) {
        int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        return fd;
      }
      last_error = std::strerror(err);
      ::close(fd);
    }
    auto now = Clock::now();
    if (now >= deadline) break;
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(250));
  } while (Clock::now() < deadline);
  KILN_FAIL("TCPStore: could not connect to the store server at ", endpoint(host, port), " within ", budget.count(),
            " ms (last error: ", last_error,
            "); is rank 0 running, and are MASTER_ADDR/MASTER_PORT the same on every rank?");
}

IoStatus send_all(int fd, const void* data, size_t size, Deadline deadline) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      short ev = poll_one(fd, POLLOUT, deadline);
      if (ev == 0) return IoStatus::Timeout;
      if (ev & (POLLERR | POLLNVAL)) return IoStatus::Closed;
      continue;
    }
    return IoStatus::Closed;  // EPIPE, ECONNRESET, ...
  }
  return IoStatus::Ok;
}

IoStatus recv_all(int fd, void* data, size_t size, Deadline deadline) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = ::recv(fd, p, size, 0);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return IoStatus::Closed;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      short ev = poll_one(fd, POLLIN, deadline);
      if (ev == 0) return IoStatus::Timeout;
      if (ev & POLLNVAL) return IoStatus::Closed;
      continue;  // POLLIN, POLLHUP or POLLERR: recv() tells which
    }
    return IoStatus::Closed;
  }
  return IoStatus::Ok;
}

bool peer_closed(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
  // readable: either request bytes (a pipelining client) or EOF; peek to tell them apart
  char c;
  ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0;
}

}  // namespace kiln::distributed::net
