// TCPStore: a key-value server on a thread of rank 0 and a client in every rank
// (docs/distributed.md, "Rendezvous").
//
// Wire format, both directions: one tag byte, a u32 field count, then each field as a u32 length
// and its bytes (integers little-endian). Requests carry a command tag, replies a status tag.
//   SET [key, value]          -> OK []
//   GET [timeout_ms, key]     -> OK [value]          | TIMEOUT []
//   ADD [key, delta]          -> OK [new value]      | ERROR [message]
//   CHECK [keys...]           -> OK [0 or 1]
//   WAIT [timeout_ms, keys...] -> OK []              | TIMEOUT [missing keys...]
//   DELETE [key]              -> OK [0 or 1]
//   NUM_KEYS []               -> OK [count]
// Blocking requests carry their timeout so the server answers TIMEOUT itself and the connection
// stays usable; the client also polls with a deadline of its own, for a server that stops
// answering altogether.
//
// The server runs one thread per connection: a GET or WAIT blocks only its own connection's
// thread, on a condition variable signalled by every write.
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <list>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "kiln/core/error.h"
#include "kiln/distributed/store/parse_int.h"
#include "kiln/distributed/store/socket.h"
#include "kiln/distributed/store/store.h"
#include "kiln/distributed/store/wire.h"

namespace kiln::distributed {

namespace {

using net::Clock;
using net::Deadline;
using net::IoStatus;
using std::chrono::milliseconds;

enum Command : uint8_t { kSet = 1, kGet, kAdd, kCheck, kWait, kDelete, kNumKeys, kOnDisconnect };
enum Status : uint8_t { kOk = 0, kTimeout, kError };

using wire::decode_int;
using wire::encode_int;
using wire::Message;

// Keys of the store itself (the join counter); not counted by num_keys().
const std::string kInternalPrefix = "__kiln_store__/";
const std::string kJoinedKey = kInternalPrefix + "joined";

// Time the server is given to deliver its own TIMEOUT answer before the client gives up on it.
constexpr milliseconds kReplyGrace{2000};
// Far enough that now + it cannot overflow, long enough to mean "no timeout".
constexpr milliseconds kMaxTimeout{int64_t(30) * 24 * 3600 * 1000};

Bytes bytes_of(const std::string& s) { return Bytes(s.begin(), s.end()); }
std::string string_of(const Bytes& b) { return std::string(b.begin(), b.end()); }

IoStatus send_message(int fd, const Message& m, Deadline deadline) {
  Bytes out = wire::encode_message(m);
  return net::send_all(fd, out.data(), out.size(), deadline);
}

IoStatus recv_message(int fd, Message& m, Deadline deadline) {
  return wire::read_message([&](void* data, size_t size) { return net::recv_all(fd, data, size, deadline); }, m);
}

// The server's read of a request: its first byte may be long in coming (a client's idle pooled
// connection), but once it came the rest must follow within `request_timeout`, and a connection's
// first request must start within it too, so a silent or stalled peer cannot hold a thread.
IoStatus recv_request(int fd, Message& m, bool first, milliseconds request_timeout) {
  const Deadline idle = first ? Clock::now() + request_timeout : Deadline::max();
  bool started = false;
  Deadline rest{};
  return wire::read_message(
      [&](void* data, size_t size) {
        if (!started) {
          IoStatus s = net::recv_all(fd, data, 1, idle);
          if (s != IoStatus::Ok) return s;
          started = true;
          rest = Clock::now() + request_timeout;
          data = static_cast<uint8_t*>(data) + 1;
          if (--size == 0) return IoStatus::Ok;
        }
        return net::recv_all(fd, data, size, rest);
      },
      m);
}

Deadline deadline_after(milliseconds timeout) {
  return Clock::now() + std::clamp(timeout, milliseconds(0), kMaxTimeout);
}

}  // namespace

// ---------------------------------------------------------------- server

class StoreServer {
 public:
  StoreServer(const std::string& host, int port, milliseconds request_timeout) : request_timeout_(request_timeout) {
    listen_fd_ = net::listen_on(host, port, &port_);
    if (::pipe2(wake_, O_CLOEXEC) != 0) {
      net::close_fd(listen_fd_);
      KILN_FAIL("TCPStore: pipe() failed: ", std::strerror(errno));
    }
    accept_thread_ = std::thread([this] { accept_loop(); });
  }

  ~StoreServer() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    char c = 0;
    while (::write(wake_[1], &c, 1) < 0 && errno == EINTR) {
    }
    accept_thread_.join();
    // wakes connection threads blocked in recv(); those in a GET/WAIT see stopping_
    std::lock_guard<std::mutex> lock(conn_mu_);
    // The read side only: a thread blocked in recv() wakes with EOF, while one that is sending
    // the reply to a request it already carried out (a SET another rank's exit was waiting
    // for) still delivers it; each thread shuts its socket fully when it ends.
    for (Connection& c : conns_) ::shutdown(c.fd, SHUT_RD);
    for (Connection& c : conns_) {
      c.thread.join();
      net::close_fd(c.fd);
    }
    net::close_fd(listen_fd_);
    net::close_fd(wake_[0]);
    net::close_fd(wake_[1]);
  }

  int port() const { return port_; }

  // Waits until the integer at `key` reaches `target` or the deadline passes; returns its value.
  int64_t wait_for_count(const std::string& key, int64_t target, Deadline deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    auto count = [&] {
      auto it = data_.find(key);
      return it == data_.end() ? int64_t(0) : parse_int(string_of(it->second)).value_or(0);
    };
    cv_.wait_until(lock, deadline, [&] { return stopping_ || count() >= target; });
    return count();
  }

 private:
  struct Connection {
    int fd = -1;
    std::thread thread;
    std::atomic<bool> done{false};
  };

  void accept_loop() {
    for (;;) {
      pollfd p[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
      int rc = ::poll(p, 2, -1);
      if (rc < 0 && errno == EINTR) continue;
      if (rc < 0 || (p[1].revents & POLLIN)) return;
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        // out of descriptors: the pending connection stays readable, so pause instead of spinning
        if (errno == EMFILE || errno == ENFILE) std::this_thread::sleep_for(milliseconds(50));
        continue;  // EAGAIN after a client gave up, ...: keep serving the others
      }
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      std::lock_guard<std::mutex> lock(conn_mu_);
      reap_finished();
      Connection& c = conns_.emplace_back();
      c.fd = fd;
      c.thread = std::thread([this, &c] {
        serve(c.fd);
        ::shutdown(c.fd, SHUT_RDWR);  // the client sees EOF now; the fd is closed when reaped
        c.done = true;
      });
    }
  }

  // Joins the threads of connections that ended (conn_mu_ held).
  void reap_finished() {
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (it->done) {
        it->thread.join();
        net::close_fd(it->fd);
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void serve(int fd) {
    Message req;
    std::string on_disconnect;  // ON_DISCONNECT: the key set when this client goes away
    for (bool first = true; recv_request(fd, req, first, request_timeout_) == IoStatus::Ok; first = false) {
      if (req.tag == kOnDisconnect && req.fields.size() == 1) {
        on_disconnect = string_of(req.fields[0]);
        if (send_message(fd, ok(), Deadline::max()) != IoStatus::Ok) break;
        continue;
      }
      std::optional<Message> reply = handle(req, fd);
      if (!reply) break;  // stopping, or a request this server does not understand
      if (send_message(fd, *reply, Deadline::max()) != IoStatus::Ok) break;
    }
    if (!on_disconnect.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!stopping_) {
        data_[on_disconnect] = bytes_of("disconnected");
        cv_.notify_all();
      }
    }
  }

  static Message ok(std::vector<Bytes> fields = {}) { return Message{kOk, std::move(fields)}; }

  bool has_all(const std::vector<std::string>& keys) const {
    for (const auto& k : keys)
      if (!data_.count(k)) return false;
    return true;
  }

  // Waits until every key exists; false at the deadline, nullopt when the server stops or the
  // client hung up (nobody left to answer).
  std::optional<bool> wait_keys(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                                Deadline deadline, int fd) {
    for (;;) {
      if (stopping_) return std::nullopt;
      if (has_all(keys)) return true;
      if (Clock::now() >= deadline) return false;
      // wake now and then to notice a client that went away while it waited
      auto slice = std::min(deadline, Clock::now() + milliseconds(200));
      cv_.wait_until(lock, slice);
      if (!stopping_ && !has_all(keys) && net::peer_closed(fd)) return std::nullopt;
    }
  }

  std::optional<Message> handle(const Message& req, int fd) {
    const auto& f = req.fields;
    std::unique_lock<std::mutex> lock(mu_);
    switch (req.tag) {
      case kSet:
        if (f.size() != 2) return std::nullopt;
        data_[string_of(f[0])] = f[1];
        cv_.notify_all();
        return ok();
      case kGet: {
        auto timeout = f.size() == 2 ? decode_int(f[0]) : std::nullopt;
        if (!timeout) return std::nullopt;
        std::string key = string_of(f[1]);
        auto found = wait_keys(lock, {key}, deadline_after(milliseconds(*timeout)), fd);
        if (!found) return std::nullopt;
        if (!*found) return Message{kTimeout, {}};
        return ok({data_[key]});
      }
      case kAdd: {
        auto delta = f.size() == 2 ? decode_int(f[1]) : std::nullopt;
        if (!delta) return std::nullopt;
        std::string key = string_of(f[0]);
        int64_t value = 0;
        auto it = data_.find(key);
        if (it != data_.end()) {
          auto old = parse_int(string_of(it->second));
          if (!old) {
            return Message{kError, {bytes_of("the value at key '" + key + "' is not an integer: cannot add to it")}};
          }
          value = *old;
        }
        value += *delta;
        data_[key] = bytes_of(std::to_string(value));
        cv_.notify_all();
        return ok({encode_int(value)});
      }
      case kCheck: {
        std::vector<std::string> keys;
        for (const Bytes& k : f) keys.push_back(string_of(k));
        return ok({Bytes{static_cast<uint8_t>(has_all(keys))}});
      }
      case kWait: {
        auto timeout = !f.empty() ? decode_int(f[0]) : std::nullopt;
        if (!timeout) return std::nullopt;
        std::vector<std::string> keys;
        for (size_t i = 1; i < f.size(); ++i) keys.push_back(string_of(f[i]));
        auto found = wait_keys(lock, keys, deadline_after(milliseconds(*timeout)), fd);
        if (!found) return std::nullopt;
        if (*found) return ok();
        Message missing{kTimeout, {}};
        for (const auto& k : keys)
          if (!data_.count(k)) missing.fields.push_back(bytes_of(k));
        return missing;
      }
      case kDelete: {
        if (f.size() != 1) return std::nullopt;
        bool existed = data_.erase(string_of(f[0])) > 0;
        return ok({Bytes{static_cast<uint8_t>(existed)}});
      }
      case kNumKeys: {
        int64_t n = 0;
        for (const auto& kv : data_) n += kv.first.compare(0, kInternalPrefix.size(), kInternalPrefix) != 0;
        return ok({encode_int(n)});
      }
      default: return std::nullopt;
    }
  }

  const milliseconds request_timeout_;
  int listen_fd_ = -1;
  int port_ = 0;
  int wake_[2] = {-1, -1};  // written once by the destructor to end accept_loop's poll
  std::thread accept_thread_;

  std::mutex mu_;  // guards data_ and stopping_
  std::condition_variable cv_;
  std::unordered_map<std::string, Bytes> data_;
  bool stopping_ = false;

  std::mutex conn_mu_;
  std::list<Connection> conns_;  // a list: each thread holds a reference to its element
};

// ---------------------------------------------------------------- client

struct TCPStore::Impl {
  std::string host;
  int port = 0;
  std::string where;  // host:port, for messages
  std::unique_ptr<StoreServer> server;

  // Idle connections to the server. A request takes one (opening another when all are busy), so
  // a thread blocked in get() or wait() does not hold up the other threads sharing this store.
  std::mutex mu;
  std::vector<int> idle;
  bool lost = false;
  int watch_fd = -1;  // set_on_disconnect's connection

  ~Impl() {
    for (int& fd : idle) net::close_fd(fd);
    server.reset();  // after our own sockets, so the server has no client of ours left to wait on
  }

  [[noreturn]] void fail_lost() {
    KILN_FAIL("TCPStore: lost the connection to the store server at ", where,
              " (the process hosting it, rank 0, may have exited)");
  }

  // An idle connection, or a new one (retried until `timeout`, as the constructor's first).
  int take(milliseconds timeout) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (lost) fail_lost();
      if (!idle.empty()) {
        int fd = idle.back();
        idle.pop_back();
        return fd;
      }
    }
    return net::connect_with_retry(host, port, deadline_after(timeout), timeout);
  }

  void give_back(int fd) {
    std::lock_guard<std::mutex> lock(mu);
    idle.push_back(fd);
  }

  // Sends `req` and returns the reply. `on_timeout` builds the message thrown when no reply
  // came before the deadline; `timeout` bounds opening a connection.
  template <class OnTimeout>
  Message call(const Message& req, milliseconds timeout, Deadline deadline, OnTimeout on_timeout) {
    // Checked here: the server would drop the connection, and a lost connection ends the store.
    if (auto why = wire::oversized(req))
      KILN_FAIL("TCPStore: a request to the store server at ", where, " holds ", *why);
    int fd = take(timeout);
    IoStatus s = send_message(fd, req, deadline);
    Message reply;
    if (s == IoStatus::Ok) s = recv_message(fd, reply, deadline);
    if (s == IoStatus::Ok) {
      give_back(fd);
      return reply;
    }
    // Timeout: a late reply would be taken for the next request's, so this connection is done.
    net::close_fd(fd);
    if (s == IoStatus::Timeout) KILN_FAIL(on_timeout());
    {
      std::lock_guard<std::mutex> lock(mu);
      lost = true;  // no reconnecting: a server that went away once is not waited for again
      for (int& other : idle) net::close_fd(other);
      idle.clear();
    }
    fail_lost();
  }

  Message call(const Message& req, milliseconds timeout, const char* what, const std::string& key) {
    return call(req, timeout, deadline_after(timeout), [&] {
      return detail::concat("TCPStore: timed out after ", timeout.count(), " ms waiting for the ", "store server at ",
                            where, " to answer ", what, " '", key, "'");
    });
  }

  // The reply to a blocking request (GET, WAIT) whose own timeout the server enforces.
  Message call_blocking(const Message& req, milliseconds timeout, milliseconds wait_timeout,
                        const std::vector<std::string>& keys) {
    return call(req, timeout, deadline_after(std::min(wait_timeout, kMaxTimeout) + kReplyGrace),
                [&] { return timeout_message(wait_timeout, keys) + " (the server did not answer)"; });
  }

  std::string timeout_message(milliseconds t, const std::vector<std::string>& keys) const {
    return detail::concat("TCPStore: timed out after ", t.count(), " ms waiting for keys ", keys, " at ", where);
  }
};

TCPStore::TCPStore(const std::string& host, int port, const TCPStoreOptions& options)
    : impl_(std::make_unique<Impl>()) {
  // one budget for the whole constructor: connecting and waiting for the others to join
  const Deadline deadline = deadline_after(options.timeout);
  KILN_CHECK(port >= 0 && port <= 65535, "TCPStore: port ", port, " is not in 0..65535");
  KILN_CHECK(port > 0 || options.is_server,
             "TCPStore: port 0 (pick a free one) is only for the server; clients need its port");
  timeout_ = options.timeout;
  impl_->host = host;
  impl_->port = port;
  if (options.is_server) {
    impl_->server = std::make_unique<StoreServer>(host, port, options.request_timeout);
    impl_->port = impl_->server->port();
  }
  impl_->where = net::endpoint(host, impl_->port);
  impl_->idle.push_back(net::connect_with_retry(host, impl_->port, deadline, options.timeout));
  add(kJoinedKey, 1);
  if (options.is_server && options.world_size > 0 && options.wait_for_workers) {
    int64_t joined = impl_->server->wait_for_count(kJoinedKey, options.world_size, deadline);
    KILN_CHECK(joined >= options.world_size, "TCPStore: timed out after ", options.timeout.count(), " ms waiting for ",
               options.world_size, " ranks to join the store at ", impl_->where, ": ", joined, " of ",
               options.world_size, " joined (did every rank start, with the same MASTER_ADDR/", "MASTER_PORT?)");
  }
}

TCPStore::~TCPStore() {
  if (impl_->watch_fd >= 0) net::close_fd(impl_->watch_fd);
}

void TCPStore::set_on_disconnect(const std::string& key) {
  KILN_CHECK(impl_->watch_fd < 0, "TCPStore::set_on_disconnect: already set for this store");
  // A connection of its own that stays open, idle, for the life of this store: the kernel closes
  // it when the process ends, however it ends.
  int fd = net::connect_with_retry(impl_->host, impl_->port, deadline_after(timeout()), timeout());
  Deadline deadline = deadline_after(timeout());
  Message reply;
  IoStatus s = send_message(fd, Message{kOnDisconnect, {bytes_of(key)}}, deadline);
  if (s == IoStatus::Ok) s = recv_message(fd, reply, deadline);
  if (s != IoStatus::Ok || reply.tag != kOk) {
    net::close_fd(fd);
    KILN_FAIL("TCPStore::set_on_disconnect: the store server at ", impl_->where, " did not accept it");
  }
  impl_->watch_fd = fd;
}

const std::string& TCPStore::host() const { return impl_->host; }
int TCPStore::port() const { return impl_->port; }

void TCPStore::set(const std::string& key, const Bytes& value) {
  KILN_CHECK(key.size() + value.size() <= wire::kMaxMessageBytes, "TCPStore: set('", key, "'): the value has ",
             value.size(), " bytes; the store takes keys and values of at most ", wire::kMaxMessageBytes,
             " bytes together");
  impl_->call(Message{kSet, {bytes_of(key), value}}, timeout(), "SET", key);
}

Bytes TCPStore::get(const std::string& key) {
  const milliseconds t = timeout();
  Message reply = impl_->call_blocking(Message{kGet, {encode_int(t.count()), bytes_of(key)}}, t, t, {key});
  if (reply.tag == kTimeout) KILN_FAIL(impl_->timeout_message(t, {key}));
  KILN_CHECK(reply.tag == kOk && reply.fields.size() == 1, "TCPStore: malformed reply to GET '", key, "' from ",
             impl_->where);
  return std::move(reply.fields[0]);
}

int64_t TCPStore::add(const std::string& key, int64_t delta) {
  Message reply = impl_->call(Message{kAdd, {bytes_of(key), encode_int(delta)}}, timeout(), "ADD", key);
  if (reply.tag == kError && reply.fields.size() == 1) {
    KILN_FAIL("TCPStore: add(", delta, ") at ", impl_->where, ": ", string_of(reply.fields[0]));
  }
  auto value = reply.fields.size() == 1 ? decode_int(reply.fields[0]) : std::nullopt;
  KILN_CHECK(reply.tag == kOk && value, "TCPStore: malformed reply to ADD '", key, "' from ", impl_->where);
  return *value;
}

bool TCPStore::check(const std::vector<std::string>& keys) {
  Message req{kCheck, {}};
  for (const auto& k : keys) req.fields.push_back(bytes_of(k));
  Message reply = impl_->call(req, timeout(), "CHECK", keys.empty() ? "" : keys[0]);
  KILN_CHECK(reply.tag == kOk && reply.fields.size() == 1 && reply.fields[0].size() == 1,
             "TCPStore: malformed reply to CHECK from ", impl_->where);
  return reply.fields[0][0] != 0;
}

void TCPStore::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  Message req{kWait, {encode_int(timeout.count())}};
  for (const auto& k : keys) req.fields.push_back(bytes_of(k));
  Message reply = impl_->call_blocking(req, this->timeout(), timeout, keys);
  if (reply.tag == kTimeout) {
    std::vector<std::string> missing;
    for (const Bytes& k : reply.fields) missing.push_back(string_of(k));
    KILN_FAIL(impl_->timeout_message(timeout, missing.empty() ? keys : missing));
  }
  KILN_CHECK(reply.tag == kOk, "TCPStore: malformed reply to WAIT from ", impl_->where);
}

bool TCPStore::delete_key(const std::string& key) {
  Message reply = impl_->call(Message{kDelete, {bytes_of(key)}}, timeout(), "DELETE", key);
  KILN_CHECK(reply.tag == kOk && reply.fields.size() == 1 && reply.fields[0].size() == 1,
             "TCPStore: malformed reply to DELETE '", key, "' from ", impl_->where);
  return reply.fields[0][0] != 0;
}

int64_t TCPStore::num_keys() {
  Message reply = impl_->call(Message{kNumKeys, {}}, timeout(), "NUM_KEYS", "");
  auto n = reply.fields.size() == 1 ? decode_int(reply.fields[0]) : std::nullopt;
  KILN_CHECK(reply.tag == kOk && n, "TCPStore: malformed reply to NUM_KEYS from ", impl_->where);
  return *n;
}

}  // namespace kiln::distributed
