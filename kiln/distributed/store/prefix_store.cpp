// PrefixStore: one namespace per process group inside the job's single store.
#include <utility>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/distributed/store/store.h"

namespace kiln::distributed {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> store)
    : prefix_(std::move(prefix)), store_(std::move(store)) {
  KILN_CHECK(store_ != nullptr, "PrefixStore('", prefix_, "'): the underlying store is null");
  timeout_ = store_->timeout();
}

void PrefixStore::set(const std::string& k, const Bytes& value) { store_->set(key(k), value); }

Bytes PrefixStore::get(const std::string& k) {
  // waiting first applies this store's timeout (set_timeout on a PrefixStore) rather than the
  // underlying store's, without changing the underlying store that other threads share
  store_->wait({key(k)}, timeout());
  return store_->get(key(k));
}

int64_t PrefixStore::add(const std::string& k, int64_t delta) { return store_->add(key(k), delta); }

bool PrefixStore::check(const std::vector<std::string>& keys) {
  std::vector<std::string> full;
  for (const auto& k : keys) full.push_back(key(k));
  return store_->check(full);
}

void PrefixStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::vector<std::string> full;
  for (const auto& k : keys) full.push_back(key(k));
  store_->wait(full, timeout);
}

bool PrefixStore::delete_key(const std::string& k) { return store_->delete_key(key(k)); }

// Counts the whole store, as torch's PrefixStore does: the server keeps no per-prefix count.
int64_t PrefixStore::num_keys() { return store_->num_keys(); }

}  // namespace kiln::distributed
