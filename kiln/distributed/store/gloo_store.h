#pragma once
// Gloo rendezvous over a kiln Store: the Gloo process group hands this to
// gloo::rendezvous::Context::connectFullMesh, so Gloo's pairs exchange their addresses through
// the job's TCPStore (under the group's PrefixStore) instead of a store of Gloo's own.
#include "kiln/config.h"

#if KILN_WITH_GLOO

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "kiln/distributed/store/store.h"

namespace kiln::distributed {

class GlooStoreAdapter : public ::gloo::rendezvous::Store {
 public:
  explicit GlooStoreAdapter(std::shared_ptr<kiln::distributed::Store> store);
  ~GlooStoreAdapter() override;

  void set(const std::string& key, const std::vector<char>& data) override;
  // Blocks up to the kiln store's timeout.
  std::vector<char> get(const std::string& key) override;
  // Without a timeout: the kiln store's, never "forever".
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

  const std::shared_ptr<kiln::distributed::Store>& store() const { return store_; }

 private:
  std::shared_ptr<kiln::distributed::Store> store_;
};

}  // namespace kiln::distributed

#endif  // KILN_WITH_GLOO
