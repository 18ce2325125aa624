#pragma once
// POSIX TCP helpers of the store (internal to kiln/distributed). Every call that can block takes a
// deadline and waits with poll(), so a peer that stops answering becomes a status, never a hang;
// sends use MSG_NOSIGNAL so a closed peer is an error, not a SIGPIPE that kills the process.
#include <chrono>
#include <cstddef>
#include <string>

namespace kiln::distributed::net {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

enum class IoStatus { Ok, Timeout, Closed };

// "host:port", "[v6]:port" for IPv6 literals, for messages.
std::string endpoint(const std::string& host, int port);

// A listening socket on host:port ("0.0.0.0" or "" listens on every interface; port 0 lets the
// kernel pick one, returned in *bound_port). SO_REUSEADDR, so a restarted job can reuse the port
// while old connections linger in TIME_WAIT. Throws kiln::Error naming the endpoint.
int listen_on(const std::string& host, int port, int* bound_port);

// Connects to host:port, retrying refused or unreachable attempts until the deadline (the server
// may not be up yet). The socket is non-blocking, with TCP_NODELAY. Throws kiln::Error
// "could not connect to the store server at host:port within N ms".
int connect_with_retry(const std::string& host, int port, Deadline deadline, std::chrono::milliseconds budget);

// Sends / receives exactly `size` bytes on a non-blocking socket before the deadline.
IoStatus send_all(int fd, const void* data, size_t size, Deadline deadline);
IoStatus recv_all(int fd, void* data, size_t size, Deadline deadline);

// True when the peer closed its side (checked without blocking and without consuming data).
bool peer_closed(int fd);

void set_nonblocking(int fd, bool on);
void close_fd(int& fd);

}  // namespace kiln::distributed::net
