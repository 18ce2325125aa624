#include "kiln/distributed/gloo_store.h"
#if KILN_WITH_GLOO

namespace kiln::distributed {

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  store_->set(key, Bytes(data.begin(), data.end()));
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  Bytes value = store_->get(key);
  return std::vector<char>(value.begin(), value.end());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys) { store_->wait(keys); }

void GlooStoreAdapter::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  store_->wait(keys, timeout);
}

}  // namespace kiln::distributed
#endif
