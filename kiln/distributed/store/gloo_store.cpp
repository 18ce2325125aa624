// GlooStoreAdapter: Gloo's rendezvous Store interface over a kiln Store (bytes as char vectors).
#include "kiln/distributed/store/gloo_store.h"

#if KILN_WITH_GLOO

#include <utility>

#include "kiln/core/error.h"

namespace kiln::distributed {

GlooStoreAdapter::GlooStoreAdapter(std::shared_ptr<kiln::distributed::Store> store) : store_(std::move(store)) {
  KILN_CHECK(store_ != nullptr, "GlooStoreAdapter: the store is null");
}

GlooStoreAdapter::~GlooStoreAdapter() = default;

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  store_->set(key, Bytes(data.begin(), data.end()));
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  Bytes b = store_->get(key);
  return std::vector<char>(b.begin(), b.end());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys) { store_->wait(keys); }

void GlooStoreAdapter::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  store_->wait(keys, timeout);
}

}  // namespace kiln::distributed

#endif  // KILN_WITH_GLOO
