#pragma once
// The key-value store ranks rendezvous through (docs/distributed.md, "Rendezvous"), as
// torch.distributed's Store: rank 0 hosts a TCPStore server on MASTER_ADDR:MASTER_PORT, every
// rank (rank 0 included) talks to it as a client. Process groups use it to exchange their
// bootstrap data (Gloo's addresses, NCCL's unique id) and the launcher-free failure tests use it
// to see who joined.
//
// Every blocking call takes the store's timeout and throws kiln::Error naming the keys it waited
// for when the timeout passes, or naming the server when the connection is lost; none hangs.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kiln::distributed {

using Bytes = std::vector<uint8_t>;

class Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Blocks until `key` exists (up to the timeout), then returns its value.
  virtual Bytes get(const std::string& key) = 0;
  // Adds `delta` to the integer stored at `key` (0 when absent) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // True when every key exists now (does not block).
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Blocks until every key exists; throws kiln::Error naming the missing keys after `timeout`.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }
  // Returns whether the key existed.
  virtual bool delete_key(const std::string& key) = 0;
  virtual int64_t num_keys() = 0;

  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

  // Strings as values, for readable keys such as "rank/3/joined".
  void set(const std::string& key, const std::string& value) { set(key, Bytes(value.begin(), value.end())); }
  std::string get_string(const std::string& key) {
    Bytes b = get(key);
    return std::string(b.begin(), b.end());
  }

 protected:
  std::chrono::milliseconds timeout_{std::chrono::seconds(300)};
};

struct TCPStoreOptions {
  int world_size = -1;     // >0: the server's constructor waits until this many clients joined
  bool is_server = false;  // this process hosts the server (rank 0)
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // With world_size > 0, the server's constructor waits for the others to join (false: returns
  // as soon as it is up). Every client retries a failed connect until the timeout either way,
  // since the server may start later.
  bool wait_for_workers = true;
  // Server: a connection must send its first request, and finish each request it starts, within
  // this, or the server closes it (a silent or stalled peer holds no thread for long). Between
  // requests a connection may stay idle as long as it likes.
  std::chrono::milliseconds request_timeout{std::chrono::seconds(30)};
};

// A client of the store server at host:port; with options.is_server it first starts that server
// on a thread of this process. Port 0 with is_server picks a free port (see port()).
class TCPStore final : public Store {
 public:
  TCPStore(const std::string& host, int port, const TCPStoreOptions& options);
  ~TCPStore() override;
  TCPStore(const TCPStore&) = delete;
  TCPStore& operator=(const TCPStore&) = delete;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  using Store::set;
  using Store::wait;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;

  const std::string& host() const;
  int port() const;

  // The server sets `key` (to "disconnected") when this process's connection to it closes: when
  // the process exits or is killed, even by SIGKILL. init_process_group uses it so that a
  // collective that failed can name the rank that died.
  void set_on_disconnect(const std::string& key);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Prepends "prefix/" to every key: each process group (and each new_group) gets its own
// namespace in the one store.
class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> store);

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  using Store::set;
  using Store::wait;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;

  std::shared_ptr<Store> underlying() const { return store_; }

 private:
  std::string key(const std::string& k) const { return prefix_ + "/" + k; }
  std::string prefix_;
  std::shared_ptr<Store> store_;
};

}  // namespace kiln::distributed
